// The opening exchange of a connection: which rank is on the other end, for which job and
// cluster version, and, when the job has a secret, proof that both ends hold it. Nothing a
// connection carries reaches the op engine before its handshake is done.
//
// Without a secret:  dialer -> Hello;                 acceptor -> Hello.
// With a secret:     dialer -> Hello(nonce_d);        acceptor -> Hello(nonce_a), Auth(mac_a);
//                    dialer -> Auth(mac_d).
// mac_x = HMAC-SHA256(secret, "taiji-auth-1" | x | job id | cluster version | dialer rank |
//                     acceptor rank | nonce_d | nonce_a), x = 'D' or 'A', so a MAC can be
// neither replayed (fresh nonces from both ends) nor reflected (the role byte). MACs are
// compared in constant time. If no random nonce or no MAC can be made, the handshake fails
// (Code::Internal) rather than go on with zeros.
//
// An acceptor that refuses a Hello because one side has a secret and the other none says
// so before it closes: Refuse(reason), one byte naming which side lacks it (no secret
// material), so that the dialer, which is the side that can fix its configuration, fails
// with Code::Auth and the reason instead of reading only a closed connection. A MAC that
// does not match needs no refusal: the dialer checks the acceptor's first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace taiji {

constexpr size_t kNonceBytes = 32;

// The payload byte of a Refuse frame.
enum class RefuseReason : uint8_t {
  DialerHasNoSecret = 1,    // the acceptor's job has a secret; the dialer offered none
  AcceptorHasNoSecret = 2,  // the dialer offered authentication; the acceptor has no secret
};
constexpr size_t kMacBytes = 32;

struct HandshakeParams {
  int rank = 0;
  int size = 1;
  uint32_t cluster_version = 0;
  std::string job_id;
  std::string secret;  // empty: no authentication
};

class Handshake {
 public:
  enum class Role { Dialer, Acceptor };
  // Handshake frames never carry more than this; a larger one is refused unread.
  static constexpr uint64_t kMaxPayload = 32;

  // dialled_rank: for the dialer, the rank it dialled; ignored for the acceptor.
  Handshake(HandshakeParams params, Role role, int dialled_rank = -1);

  // Appends the frames to send as the connection opens (the dialer's Hello; nothing for
  // the acceptor). Headers are complete: they go out before the link is registered. A
  // non-ok status (no random nonce) fails the handshake; the connection must be closed.
  Status start(std::vector<OutMessage>* out);
  // A frame that arrived before the handshake finished, its header checked by
  // decode_header. Appends frames to send to *out. A non-ok status names what was wrong;
  // the connection must then be closed, after sending what *out holds (a refusal).
  Status on_frame(const FrameHeader& h, const std::string& name, const std::vector<uint8_t>& payload,
                  std::vector<OutMessage>* out);
  bool done() const { return state_ == State::Done; }
  int peer_rank() const { return peer_; }

 private:
  enum class State { Start, AwaitHello, AwaitAuth, Done, Failed };
  Status on_hello(const FrameHeader& h, const std::string& name, const std::vector<uint8_t>& payload,
                  std::vector<OutMessage>* out);
  Status on_auth(const std::vector<uint8_t>& payload, std::vector<OutMessage>* out);
  Status on_refuse(const FrameHeader& h, const std::vector<uint8_t>& payload) const;
  OutMessage frame(MsgType type, std::vector<uint8_t> payload) const;
  Status mac(char role, std::vector<uint8_t>* out) const;

  HandshakeParams p_;
  Role role_;
  int peer_;
  State state_;
  std::vector<uint8_t> nonce_d_;
  std::vector<uint8_t> nonce_a_;
};

}  // namespace taiji
