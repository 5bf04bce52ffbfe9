// The attacker's side of the wire tests: two real peers (world size 2, small explicit
// caps) whose rank 0 is attacked on its listening port, and a runner that repeats one
// attack on fresh connections in batches, checking after every batch that each connection
// was closed by rank 0, that rank 0 logged exactly one line naming the cause per
// connection, that the real peers still complete an exact allreduce, and, over all
// repeats, that resident memory stayed flat.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "live_peers.h"
#include "log_capture.h"
#include "raw_socket.h"

namespace wire {

constexpr int kRepeats = 1000;
constexpr int64_t kHandshakeMs = 200;
constexpr uint16_t kMaxNameLen = 64;
constexpr uint64_t kMaxPayload = 1 << 20;
constexpr int64_t kCloseBoundMs = 10000;
constexpr const char* kJob = "wire-attack";
constexpr const char* kDropped = "refusing a connection: ";

struct PairOptions {
  int64_t handshake_ms = kHandshakeMs;
  int64_t max_pending = 64;
  std::string secret_file;  // empty: no job secret
};

class AttackedPair {
 public:
  // Starts both peers (Catch2 REQUIREs that they start).
  explicit AttackedPair(const PairOptions& options = {});

  const std::string& target() const { return pair_.rank0_address; }
  taiji::Peer& peer(int rank) { return *pair_.peer[rank]; }
  // The log since the last call, once it holds at least n lines (bounded wait).
  std::vector<LogLine> take_log(size_t n) { return log_.take_at_least(n, kCloseBoundMs); }
  // Empty while the two real peers still complete an exact allreduce and rank 0 has no
  // error; else what is wrong.
  std::string healthy(const std::string& op_name = "wire.check");

 private:
  LogCapture log_;  // first in, last out: it must outlive the peers
  Rendezvous rendezvous_;
  LivePair pair_;
  uint64_t round_ = 0;
};

struct Attack {
  std::string what;
  std::vector<uint8_t> bytes;  // sent as soon as the connection is open
  std::string cause;           // rank 0's log line, after "refusing a connection: "
  bool half_close = false;     // shut the write side after sending
  // Then, if set: read rank 0's replies and answer them; empty when rank 0 replied as
  // it should, else what it did instead.
  std::function<std::string(RawSocket&)> converse = nullptr;
};

// Runs `attack` kRepeats times on fresh connections, `batch` at a time, after one warm-up
// batch. min_close_ms: no connection may close sooner (deadline cases). Prints one line
// of measurements.
void repeat_attack(AttackedPair& f, const Attack& attack, int batch, double min_close_ms = 0);

taiji::FrameHeader hello_header(uint32_t src = 1);
std::vector<uint8_t> hello(const std::string& job = kJob, uint32_t src = 1,
                           std::vector<uint8_t> payload = {});
std::vector<uint8_t> garbage(size_t n);

}  // namespace wire
