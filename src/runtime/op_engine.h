// The op engine: matches arriving frames to posted ops by (name, version), keeps what
// comes before its op in the early-arrival pool, runs the Ready handshake that keeps bulk
// data from waiting on a connection for an op its receiver has not posted, enforces
// deadlines, starts the stall watchdog, and spreads failures (mismatch, lost peers) to
// every rank. The router's service for Ready, Data and Abort. Runs on the peer's I/O
// thread only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collective_op.h"
#include "common/cluster.h"
#include "device/device_api.h"
#include "monitor/metrics.h"
#include "runtime/early_arrivals.h"
#include "runtime/name_table.h"
#include "runtime/request.h"
#include "runtime/router.h"
#include "runtime/stall_watchdog.h"
#include "transport/transport.h"

namespace taiji {

struct EngineOptions {
  // The membership (rank, size), read where needed: it changes in place. Per-rank tables
  // are sized for it at construction (a membership change keeps the ranks for now).
  const Cluster* cluster = nullptr;
  uint64_t eager_bytes = 64 << 10;
  uint64_t unexpected_bytes = 64ull << 20;
  // An op still running this long after it was posted here asks every rank whether it has
  // posted it, and logs the ranks that have not; 0: off.
  uint64_t stall_warn_ms = 10000;
  // Counts, times and records every op; nullptr: no metrics.
  Metrics* metrics = nullptr;
  // Whether a reserved (name, version) is still held in a caller's open group: it counts
  // as not posted when a stalled op's watchdog asks. Unset: nothing is held.
  std::function<bool(const std::string&, uint64_t)> held;
};

struct PostedOp {
  std::string name;
  uint64_t version = 0;
  CollectiveSpec spec;
  uint64_t timeout_ms = 60000;
  std::shared_ptr<RequestState> request;
  // Runs on the I/O thread when the op ends, before its request completes; may change
  // the status the request reports.
  std::function<Status(const Status&)> finish_hook;
  uint64_t posted_ns = 0;  // monotonic_ns() when the caller posted it
  // Device memory (runtime/device_backend.h): on which device, ordered against which stream,
  // and the stream's position at the post (held until the op is handed to the executor).
  bool device = false;
  int ordinal = -1;
  void* stream = nullptr;
  DeviceFence fence;
};

class OpEngine final : public ReceiveHandler {
 public:
  OpEngine(uv_loop_t* loop, EngineOptions options, NameTable* names);
  ~OpEngine() override;
  void set_transport(Transport* transport);
  // Registers the engine's frames, and the stall watchdog's, with the router.
  void serve(Router& router);
  // Called when a link is lost without a Bye, after the ops that needed the rank failed;
  // whether the peer goes on is the membership's decision (runtime/membership.h).
  void set_link_lost_handler(std::function<void(int rank, const Status&)> fn) {
    on_link_lost_ = std::move(fn);
  }
  // Called when a rank said Bye (it finalized and sends nothing more), after the ops that
  // still needed it failed.
  void set_departed_handler(std::function<void(int rank)> fn) { on_departed_ = std::move(fn); }
  // Called after ops timed out in one tick (the flight recorder dump), with the first.
  void set_timeout_handler(std::function<void(const Status&)> fn) { on_timeout_ = std::move(fn); }

  void start(PostedOp posted);
  // Deadlines and stuck failed ops; call periodically.
  void tick();
  // Fails every op (abort, finalize timeout, a lost peer); later posts fail with `why`.
  void fail_all(const Status& why);
  bool idle() const { return ops_.empty(); }
  // Frames for (name, version) arrived before this peer started the op.
  bool has_early(const std::string& name, uint64_t version) const { return early_.holds({name, version}); }
  // The transport closed every link: nothing more arrives into any op's buffers.
  void transport_closed();
  // The membership changed: ops in flight belong to the old one and fail, and what
  // arrived early for ops not posted yet is dropped (its senders' version is refused now).
  void cluster_changed(const Cluster& before, const Cluster& now);

  Status accept_frame(int src, const FrameHeader& h, const std::string& name,
                      const uint8_t* in_memory, uint8_t** target) override;
  void frame_done(int src, const FrameHeader& h, const std::string& name) override;
  void link_down(int src, bool graceful, const Status& why) override;

 private:
  using Key = std::pair<std::string, uint64_t>;
  struct Active;
  // Only the entry points (start, frame_done, link_down, tick, fail_all and write
  // completions) call maybe_finish, as their last touch of an op: it may destroy it.
  void begin(Active& op);
  void fail_if_departed(Active& op);
  void dispatch(Active& op, std::vector<ChunkSend>& sends);
  void send_chunk(Active& op, const ChunkSend& s);
  void on_ready(Active& op, const FrameHeader& h);
  // A chunk's payload is in place (read straight into the op): advance the op.
  void deliver(Active& op, int src, const FrameHeader& h);
  // A chunk that arrived before its op: check it, copy it in place, advance the op.
  void deliver_early(Active& op, const EarlyArrivals::Data& d);
  Status plan_mismatch(const Active& op, const Status& why) const;
  Status check_match(const Active& op, const FrameHeader& h) const;
  void mismatch(Active& op, const Status& why);
  // Fails the op here and tells every other rank of it (an Abort with the reason), so that
  // none waits out the deadline for data this rank will not send.
  void fail_everywhere(Active& op, const Status& why);
  void fail(Active& op, const Status& why);
  // Fails every op in flight and drops what arrived early; later posts still start.
  void fail_ops(const Status& why);
  void maybe_finish(Active& op);
  Status describe_timeout(const Active& op) const;
  bool stall_state(const Key& key, StallWatchdog::OpState* out) const;
  FrameHeader header_for(const Active& op, MsgType type) const;

  uv_loop_t* loop_;
  EngineOptions opt_;
  NameTable* names_;
  Transport* transport_ = nullptr;
  std::function<void(int, const Status&)> on_link_lost_;
  std::function<void(int)> on_departed_;
  std::function<void(const Status&)> on_timeout_;
  std::map<Key, std::unique_ptr<Active>> ops_;
  EarlyArrivals early_;
  StallWatchdog stalls_;
  std::vector<std::vector<uint8_t>> rx_abort_;  // per source: an Abort's reason text
  std::vector<bool> departed_;             // ranks that finalized (said Bye)
  std::vector<Active*> rx_op_;             // per source: the op a payload is read into
  Status closed_;                          // non-ok: no new ops start
};

}  // namespace taiji
