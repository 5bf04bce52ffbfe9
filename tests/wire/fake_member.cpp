#include "fake_member.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>

#include "live_peers.h"
#include "bootstrap/rendezvous.h"
#include "transport/handshake.h"

namespace wire {

FakeMember::~FakeMember() {
  if (listener_ >= 0) ::close(listener_);
}

std::string FakeMember::dial(const std::string& rendezvous, const std::string& job) {
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listener_, 4) != 0 ||
      getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return "cannot listen on 127.0.0.1";
  }
  auto client = taiji::RendezvousClient::connect(rendezvous, 10000);
  if (!client.is_ok()) return "rendezvous: " + client.status().message();
  std::string mine = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "\n127.0.0.1";
  taiji::Status s = client.value()->set(job + "/addr/1", mine, 10000);
  if (!s.is_ok()) return "rendezvous: " + s.message();
  auto theirs = client.value()->get(job + "/addr/0", 10000);
  if (!theirs.is_ok()) return "rendezvous: " + theirs.status().message();
  std::string error;
  sock_ = RawSocket::connect_to(theirs.value().substr(0, theirs.value().find('\n')), &error);
  return error;
}

taiji::Status FakeMember::handshake(const std::string& job, const std::string& secret,
                                    Clock::time_point deadline) {
  taiji::HandshakeParams params{1, 2, kClusterVersion, job, secret};
  taiji::Handshake hs(params, taiji::Handshake::Role::Dialer, 0);
  std::vector<taiji::OutMessage> out;
  if (taiji::Status s = hs.start(&out); !s.is_ok()) return s;
  while (true) {
    for (const taiji::OutMessage& m : out) {
      if (!send(frame(m.header, m.name, m.owned))) return {taiji::Code::Io, "rank 0 closed the connection"};
    }
    out.clear();
    if (hs.done()) return {};
    Frame f;
    taiji::Status s = read_frame(sock_, member_limits(), deadline, &f);
    if (!s.is_ok()) return s;
    s = hs.on_frame(f.header, f.name, f.payload, &out);
    if (!s.is_ok()) return s;
  }
}

taiji::Status FakeMember::await(taiji::MsgType type, const std::string& name, uint64_t version,
                                Clock::time_point deadline, Frame* out) {
  while (true) {
    taiji::Status s = read_frame(sock_, member_limits(), deadline, out);
    if (!s.is_ok()) return s;
    const taiji::FrameHeader& h = out->header;
    if (h.type == type && out->name == name && h.op_version == version) return {};
  }
}

std::string start_with_fake(const taiji::Config& explicit0, const std::string& secret,
                            FakeMember* fake, std::unique_ptr<taiji::Peer>* rank0) {
  auto resolved = resolve(explicit0);
  if (!resolved.is_ok()) return "config: " + resolved.status().message();
  taiji::Config c = resolved.value();
  auto created = std::async(std::launch::async, [c] { return taiji::Peer::create(c); });
  std::string error = fake->dial(c.rendezvous, c.job_id);
  taiji::Status hs;
  if (error.empty()) hs = fake->handshake(c.job_id, secret, after_ms(10000));
  auto peer = created.get();  // bounded by rank 0's own init timeout
  if (!error.empty()) return error;
  if (!hs.is_ok()) return "handshake: " + hs.message();
  if (!peer.is_ok()) return "rank 0: " + peer.status().message();
  *rank0 = std::move(peer.value());
  return {};
}

taiji::FrameLimits member_limits() {
  taiji::FrameLimits l;
  l.world_size = 2;
  l.cluster_version = kClusterVersion;
  l.max_name_len = 65535;
  l.max_payload = 64ull << 20;
  return l;
}

std::vector<uint8_t> member_ready(const Frame& ready) {
  taiji::FrameHeader h = ready.header;
  h.src_rank = 1;
  return frame(h, ready.name);
}

taiji::FrameHeader member_data(const taiji::FrameHeader& ready) {
  taiji::FrameHeader h = ready;
  h.type = taiji::MsgType::Data;
  h.src_rank = 1;
  h.chunk = 0;
  h.stage = static_cast<uint8_t>(taiji::Stage::Reduce);
  h.offset = 0;
  return h;
}

}  // namespace wire
