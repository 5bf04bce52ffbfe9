// Rank 1 of a two-rank job played by test code: it publishes an address it owns, dials
// rank 0 and runs the runtime's own handshake as the dialer over a raw socket, then sends
// whatever frames a test builds and reads what rank 0 sends back.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "raw_socket.h"
#include "runtime/config.h"
#include "runtime/peer.h"
#include "transport/frame.h"

namespace wire {

class FakeMember {
 public:
  FakeMember() = default;
  ~FakeMember();
  FakeMember(const FakeMember&) = delete;
  FakeMember& operator=(const FakeMember&) = delete;

  // Publishes "<job>/addr/1" (a listening socket this object owns, never served), reads
  // "<job>/addr/0" and connects to it. Empty on success, else why not.
  std::string dial(const std::string& rendezvous, const std::string& job);
  // Runs the connection handshake as rank 1 (secret empty: none).
  taiji::Status handshake(const std::string& job, const std::string& secret,
                          Clock::time_point deadline);
  bool send(const std::vector<uint8_t>& bytes) { return sock_.send_all(bytes); }
  // Reads rank 0's frames, dropping others, until one of `type` for (name, version).
  taiji::Status await(taiji::MsgType type, const std::string& name, uint64_t version,
                      Clock::time_point deadline, Frame* out);
  RawSocket& socket() { return sock_; }

 private:
  int listener_ = -1;
  RawSocket sock_;
};

// Starts rank 0 from `explicit0` (resolved without the environment) while `fake` joins
// it as rank 1 (with `secret`, or none). Empty on success, else why not.
std::string start_with_fake(const taiji::Config& explicit0, const std::string& secret,
                            FakeMember* fake, std::unique_ptr<taiji::Peer>* rank0);

// What rank 1 accepts from rank 0: every field checked, names and payloads generous.
taiji::FrameLimits member_limits();

// What a real rank 1 sends for the allreduce rank 0 announced with `ready`: its own Ready,
// and the header of its one Data chunk (a buffer of n = 2 is a single chunk, at offset 0).
std::vector<uint8_t> member_ready(const Frame& ready);
taiji::FrameHeader member_data(const taiji::FrameHeader& ready);

}  // namespace wire
