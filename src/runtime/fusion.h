// Fusion of small allreduces (Horovod-style negotiation, without a coordinator).
//
// An eligible allreduce is not started at once: it waits here. While ops wait, the ranks
// run negotiation rounds, each one allgather ("taiji.fuse.round", version = round) of
// every rank's list of waiting ops (hashed name, version, count, dtype, reduction). From
// the same lists every rank computes the same outcome: ops listed by all ranks with one
// shape are packed, by (dtype, reduction), into buffers of up to buffer_bytes, each run as
// one allreduce ("taiji.fuse", version = round * kRoundSlots + its index in the round); ops
// listed everywhere with different shapes fail with Mismatch on every rank; the rest wait
// for a later round.
//
// Cost: one small allgather per round, amortised over every op it settles, instead of a
// full allreduce (with its handshake and per-chunk frames) per op. A lone op pays the
// round on top of its allreduce, hence fusion is off by default.
//
// A rank starts a round when ops wait and none is running; the others join when they
// have ops waiting too, so a rank with nothing to fuse never runs rounds. A round that
// settled nothing (ranks posted different ops so far) is followed by the next only after
// a new op arrives or a tick passes, so that ranks waiting on each other do not spin.
// Runs on the peer's I/O thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "common/cluster.h"
#include "monitor/metrics.h"
#include "runtime/fusion_plan.h"
#include "runtime/name_table.h"
#include "runtime/op_engine.h"

namespace taiji {

struct FusionOptions {
  // The membership (rank, size), read where needed: it changes in place.
  const Cluster* cluster = nullptr;
  uint64_t max_op_bytes = 64 << 10;
  uint64_t buffer_bytes = 4 << 20;
  uint64_t chunk_bytes = 1 << 20;
  uint64_t round_timeout_ms = 60000;
  Metrics* metrics = nullptr;
};

struct FusionHooks {
  // Gives an op the runtime built its graphs, by size alone (the same everywhere).
  std::function<void(PostedOp&)> bind_internal;
  // Starts a bound op.
  std::function<void(PostedOp)> start;
  // Starts a caller's op unfused (it leaves fusion: some peer runs it unfused).
  std::function<void(PostedOp)> start_unfused;
  // Runs fn on the loop later, outside the engine's completion path.
  std::function<void(std::function<void()>)> defer;
  // The engine holds frames for (name, version): some peer started it unfused.
  std::function<bool(const std::string&, uint64_t)> has_early;
};

class Fusion {
 public:
  static constexpr const char* kRoundName = "taiji.fuse.round";
  static constexpr const char* kGroupName = "taiji.fuse";
  // Ops one round can list: 128 entries, 6 KiB per rank, after a header (the sender's
  // count of rounds deferred in a row, u32, and 4 bytes of zeros).
  static constexpr size_t kRoundSlots = 128;
  static constexpr size_t kRoundHeaderBytes = 8;
  // Kept for reuse: a send and a receive buffer for each of two groups in flight.
  static constexpr size_t kSpareBuffers = 4;
  // Rounds in a row that may leave their agreed ops for the next (a rank's op that the
  // others post late, or never, must not hold the agreed ones back for long).
  static constexpr int kMaxDeferredRounds = 2;

  Fusion(FusionOptions options, FusionHooks hooks, NameTable* names);
  ~Fusion();

  // Takes the op if fusion applies to it (an untargeted allreduce, small enough, without
  // gradient statistics, not an internal op); false: the caller starts it as usual.
  bool offer(PostedOp& op);
  // Deadlines of waiting ops, ops some peer runs unfused, rounds held back; call periodically.
  void tick();
  // Fails every waiting op; later ops fail with `why` too.
  void fail_all(const Status& why);
  bool idle() const { return waiting_.empty() && running_ == 0; }

  Fusion(const Fusion&) = delete;
  Fusion& operator=(const Fusion&) = delete;

 private:
  struct Waiting;
  struct Round;
  struct Group;
  using Key = std::pair<uint64_t, uint64_t>;  // (name hash, version)

  void schedule();
  void start_round();
  void on_round(const Round& round, const Status& s);
  // Some rank listed ops that others have not posted yet: a batch still being posted.
  // Settling now would run what is agreed so far as one group and the rest as another
  // after the next round; one more round (far cheaper than a group) usually settles the
  // batch whole. Decided from the round's lists alone, so every rank decides alike.
  // deferred_before: the most rounds in a row any rank says it deferred.
  bool defer_settling(const std::vector<std::vector<FusionEntry>>& lists, const FusionOutcome& outcome,
                      uint32_t deferred_before);
  // The ops listed by every rank whose list had room left: listed first next round.
  void note_wanted(const std::vector<std::vector<FusionEntry>>& lists);
  static Key next_key(const Key& key);
  void start_group(const FusionGroup& plan, uint64_t version);
  void on_group(Group& group, const Status& s);
  void finish(Waiting& w, const Status& s);
  // Group buffers are reused (at least `bytes` long, contents left over): a fresh 400 KiB
  // pair cost 0.3 ms of page faults and zeroing, as much as the fused allreduce itself.
  std::vector<uint8_t> take_buffer(uint64_t bytes);
  void give_back(std::vector<uint8_t>&& buffer);
  PostedOp internal_op(const char* name, uint64_t version, OpKind kind, const FusionGroup* group,
                       const void* send, void* recv, uint64_t count, uint64_t timeout_ms);

  FusionOptions opt_;
  FusionHooks hooks_;
  NameTable* names_;
  std::map<Key, std::unique_ptr<Waiting>> waiting_;
  std::vector<std::vector<uint8_t>> spare_;
  uint64_t rounds_ = 0;
  int deferred_ = 0;             // rounds in a row that left their agreed ops
  std::vector<Key> wanted_;      // from the last round: see note_wanted
  Key cursor_{};                 // where listing starts (moves when a round settles nothing)
  Key last_listed_{};
  size_t running_ = 0;           // ops in groups still running
  bool round_running_ = false;
  bool scheduled_ = false;
  bool held_ = false;            // the last round settled nothing: wait for news
  Status closed_;
};

}  // namespace taiji
