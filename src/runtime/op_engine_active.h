// The op engine's record of one op in flight, shared by its files: op_engine.cpp (start,
// frames, failure and completion) and op_engine_deadlines.cpp (stall queries, timeouts).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/op_engine.h"
#include "runtime/p2p_key.h"

namespace taiji {

// A failed op whose buffers are still in the transport's hands after this long has its
// links dropped, so the caller's request can complete and release the buffers.
inline constexpr uint64_t kStuckFailureMs = 1000;
// After a timeout the op has already waited its whole deadline for these links: a peer
// still not taking (or giving) its data is the unresponsive one, so cut sooner.
inline constexpr uint64_t kStuckTimeoutMs = 250;
inline constexpr uint64_t kMaxAbortReason = 4096;

// A frame of kind None names no op, but its text still reads as one.
inline std::string kind_name(OpKind k) { return k == OpKind::None ? "op" : op_kind_name(k); }

inline std::string op_title(OpKind kind, const std::string& name, uint64_t version) {
  return kind_name(kind) + " '" + std::string(p2p_user_name(name)) + "' version " +
         std::to_string(version);
}

struct OpEngine::Active {
  Key key;
  std::unique_ptr<CollectiveOp> op;
  std::shared_ptr<RequestState> request;
  std::function<Status(const Status&)> finish_hook;
  uint64_t timeout_ms = 0;
  uint64_t deadline = 0;
  std::vector<bool> ready_from;
  std::vector<std::vector<ChunkSend>> held;  // per destination, until its Ready arrives
  std::vector<int> writes_to;                // per destination, writes not yet completed
  int writes = 0;
  int receiving = 0;                         // payloads being read into this op's buffers
  bool failed = false;
  bool finished = false;
  Status failure;
  uint64_t failed_at = 0;
  uint64_t stuck_after = kStuckFailureMs;
  uint64_t started = 0;
  bool stall_asked = false;
  OpStart trace;                             // what the metrics know of it
  uint64_t metrics_token = 0;                // 0: not counted (metrics off)

  OpKind kind() const { return op->spec().kind; }
  std::string title() const {
    std::string t = op_title(kind(), key.first, key.second);
    if (kind() == OpKind::Send) t += " to rank " + std::to_string(op->spec().peer);
    if (kind() == OpKind::Recv) t += " from rank " + std::to_string(op->spec().peer);
    return t;
  }
  // Whether rank r takes part: every rank in a collective, the other side of a send/recv.
  bool involves(int r) const { return !op_kind_p2p(kind()) || op->spec().peer == r; }
};

}  // namespace taiji
