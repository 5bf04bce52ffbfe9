#include "transport/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/byte_order.h"

namespace taiji {

namespace {

constexpr char kMacLabel[] = "taiji-auth-1";

// A nonce left as zeros would let a recorded handshake be replayed: no nonce, no handshake.
Status fresh_nonce(std::vector<uint8_t>* nonce) {
  nonce->resize(kNonceBytes);
  if (RAND_bytes(nonce->data(), static_cast<int>(nonce->size())) != 1) {
    return {Code::Internal, "handshake: no random bytes for a nonce (RAND_bytes failed)"};
  }
  return {};
}

}  // namespace

Handshake::Handshake(HandshakeParams params, Role role, int dialled_rank)
    : p_(std::move(params)),
      role_(role),
      peer_(role == Role::Dialer ? dialled_rank : -1),
      state_(role == Role::Dialer ? State::Start : State::AwaitHello) {}

OutMessage Handshake::frame(MsgType type, std::vector<uint8_t> payload) const {
  OutMessage m;
  m.header.type = type;
  m.header.src_rank = static_cast<uint32_t>(p_.rank);
  m.header.cluster_version = p_.cluster_version;
  m.name = p_.job_id;
  m.header.name_len = static_cast<uint16_t>(m.name.size());
  m.header.payload_len = payload.size();
  m.owned = std::move(payload);
  return m;
}

Status Handshake::mac(char role, std::vector<uint8_t>* out) const {
  std::vector<uint8_t> msg(kMacLabel, kMacLabel + sizeof(kMacLabel));
  msg.push_back(static_cast<uint8_t>(role));
  append32(&msg, static_cast<uint32_t>(p_.job_id.size()));
  msg.insert(msg.end(), p_.job_id.begin(), p_.job_id.end());
  append32(&msg, p_.cluster_version);
  const int dialer = role_ == Role::Dialer ? p_.rank : peer_;
  const int acceptor = role_ == Role::Dialer ? peer_ : p_.rank;
  append32(&msg, static_cast<uint32_t>(dialer));
  append32(&msg, static_cast<uint32_t>(acceptor));
  msg.insert(msg.end(), nonce_d_.begin(), nonce_d_.end());
  msg.insert(msg.end(), nonce_a_.begin(), nonce_a_.end());
  out->assign(kMacBytes, 0);
  unsigned len = 0;
  // A MAC left as zeros on both ends would let anyone sending zeros pass.
  if (HMAC(EVP_sha256(), p_.secret.data(), static_cast<int>(p_.secret.size()), msg.data(),
           msg.size(), out->data(), &len) == nullptr ||
      len != kMacBytes) {
    return {Code::Internal, "handshake: HMAC-SHA256 failed"};
  }
  return {};
}

Status Handshake::start(std::vector<OutMessage>* out) {
  if (role_ != Role::Dialer || state_ != State::Start) return {};
  if (!p_.secret.empty()) {
    if (Status s = fresh_nonce(&nonce_d_); !s.is_ok()) {
      state_ = State::Failed;
      return s;
    }
  }
  out->push_back(frame(MsgType::Hello, nonce_d_));
  state_ = State::AwaitHello;
  return {};
}

Status Handshake::on_frame(const FrameHeader& h, const std::string& name,
                           const std::vector<uint8_t>& payload, std::vector<OutMessage>* out) {
  Status s;
  if (role_ == Role::Dialer && h.type == MsgType::Refuse && state_ != State::Done) {
    s = on_refuse(h, payload);
  } else if (state_ == State::AwaitHello && h.type == MsgType::Hello) {
    s = on_hello(h, name, payload, out);
  } else if (state_ == State::AwaitAuth && h.type == MsgType::Auth) {
    s = on_auth(payload, out);
  } else {
    const char* expected = state_ == State::AwaitHello ? "a Hello" : state_ == State::AwaitAuth ? "an Auth" : "nothing";
    s = {Code::Protocol, "handshake expected " + std::string(expected) + ", got a frame of type " +
                             std::to_string(static_cast<int>(h.type))};
  }
  if (!s.is_ok()) state_ = State::Failed;
  return s;
}

Status Handshake::on_hello(const FrameHeader& h, const std::string& name,
                           const std::vector<uint8_t>& payload, std::vector<OutMessage>* out) {
  const int src = static_cast<int>(h.src_rank);
  const std::string who = "Hello from rank " + std::to_string(src);
  if (name != p_.job_id) {
    return {Code::Protocol, who + " names job '" + name + "', this is job '" + p_.job_id + "'"};
  }
  if (role_ == Role::Dialer && src != peer_) {
    return {Code::Protocol, who + " on the connection dialled to rank " + std::to_string(peer_)};
  }
  if (role_ == Role::Acceptor && src <= p_.rank) {
    return {Code::Protocol, who + ": only higher ranks dial this peer"};
  }
  const size_t want = p_.secret.empty() ? 0 : kNonceBytes;
  if (payload.size() != want) {
    if (role_ == Role::Acceptor) {
      const RefuseReason why = want == 0 ? RefuseReason::AcceptorHasNoSecret : RefuseReason::DialerHasNoSecret;
      out->push_back(frame(MsgType::Refuse, {static_cast<uint8_t>(why)}));
    }
    return {Code::Auth, want == 0 ? who + " offers authentication, but this peer has no job secret"
                                  : who + " offers no authentication, but this job has a secret"};
  }
  peer_ = src;
  if (role_ == Role::Dialer) {
    nonce_a_ = payload;
    state_ = p_.secret.empty() ? State::Done : State::AwaitAuth;
    return {};
  }
  nonce_d_ = payload;
  if (p_.secret.empty()) {
    out->push_back(frame(MsgType::Hello, nonce_a_));
    state_ = State::Done;
    return {};
  }
  std::vector<uint8_t> ours;
  if (Status s = fresh_nonce(&nonce_a_); !s.is_ok()) return s;
  if (Status s = mac('A', &ours); !s.is_ok()) return s;
  out->push_back(frame(MsgType::Hello, nonce_a_));
  out->push_back(frame(MsgType::Auth, std::move(ours)));
  state_ = State::AwaitAuth;
  return {};
}

Status Handshake::on_refuse(const FrameHeader& h, const std::vector<uint8_t>& payload) const {
  const std::string who = "rank " + std::to_string(h.src_rank) + " refused the connection: ";
  const int reason = payload.size() == 1 ? payload[0] : 0;
  switch (static_cast<RefuseReason>(reason)) {
    case RefuseReason::DialerHasNoSecret:
      return {Code::Auth, who + "its job has a secret and this peer has none (set TAIJI_SECRET_FILE)"};
    case RefuseReason::AcceptorHasNoSecret:
      return {Code::Auth, who + "this peer has a job secret and it has none"};
  }
  return {Code::Protocol, who + "for a reason this version does not know (" + std::to_string(reason) + ")"};
}

Status Handshake::on_auth(const std::vector<uint8_t>& payload, std::vector<OutMessage>* out) {
  const char theirs = role_ == Role::Dialer ? 'A' : 'D';
  std::vector<uint8_t> expected;
  if (Status s = mac(theirs, &expected); !s.is_ok()) return s;
  if (payload.size() != kMacBytes ||
      CRYPTO_memcmp(payload.data(), expected.data(), kMacBytes) != 0) {
    return {Code::Auth, "rank " + std::to_string(peer_) +
                            " failed authentication (a different or no job secret)"};
  }
  if (role_ == Role::Dialer) {
    std::vector<uint8_t> ours;
    if (Status s = mac('D', &ours); !s.is_ok()) return s;
    out->push_back(frame(MsgType::Auth, std::move(ours)));
  }
  state_ = State::Done;
  return {};
}

}  // namespace taiji
