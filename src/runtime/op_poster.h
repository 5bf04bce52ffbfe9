// Posting ops: argument checks, (name, version) reservation, the hand-over to the I/O
// thread (runtime/io_loop.h), the calling thread's groups (runtime/post_groups.h), the
// topology an op runs on, and the topology gate.
//
// A swap is a consensus on the proposed topology's digest, posted like any op. Ops posted
// after it wait, on the I/O thread, until the consensus completes (the gate), then start
// on whatever topology it settled: so every peer switches at the same point of its op
// stream, ops already in flight finish on the old graphs, and nothing is lost.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/config.h"
#include "runtime/io_loop.h"
#include "runtime/membership.h"
#include "runtime/name_table.h"
#include "runtime/post_groups.h"
#include "topology/selection.h"

namespace taiji {

struct PostArgs {
  OpKind kind = OpKind::Allreduce;
  std::string name;
  uint64_t version = 0;           // 0: automatic
  const void* send = nullptr;
  void* recv = nullptr;
  uint64_t count = 0;
  DType dtype = DType::F32;
  RedOp redop = RedOp::Sum;
  int root = 0;
  int peer = -1;                  // send: the receiver; recv: the sender
  int* agree = nullptr;           // consensus output
  int64_t timeout_ms = 0;         // 0: the peer's default
  std::string topology;           // empty: the peer's choice
  RequestState::Callback callback;
  std::shared_ptr<NormTap> norms;  // allreduce: sums of squares taken on the way
  int memory = 0;                 // taiji_memory_t: auto, host or device
  void* stream = nullptr;         // device ops: the caller's cudaStream_t
  // Internal: the automatic choice by size, whatever topology is in force. For an op whose
  // place in the op stream differs between ranks (posted from the loop when something
  // else happened), which a topology swap would otherwise catch on some ranks only.
  bool by_size = false;
};

class OpPoster final : public ClusterListener {
 public:
  // closed: whether the peer is finalized or aborted (posts then fail).
  OpPoster(const Config& config, Membership* membership, IoLoop* io, NameTable* names,
           std::function<bool()> closed);

  // Backends in order of preference; set before the loop runs.
  void add_backend(Backend* backend) { backends_.push_back(backend); }
  // Any thread, at post: decides where an op's buffers live (runtime/device_backend.h);
  // an error fails the post. Set before the loop runs.
  using Placer = std::function<Status(const PostArgs&, PostedOp&)>;
  void set_placer(Placer placer) { placer_ = std::move(placer); }

  Result<std::shared_ptr<RequestState>> post(PostArgs args);
  Result<std::shared_ptr<RequestState>> post_internal(PostArgs args, bool holdable);
  Result<std::shared_ptr<RequestState>> set_topology(BoundStrategy proposed, int64_t timeout_ms,
                                                     RequestState::Callback callback);
  // An op prepared here and given a finish hook by its caller (the runtime's own
  // collectives): starts on the loop, through the gate, never fused.
  Result<PostedOp> prepare(PostArgs& args);
  Result<std::shared_ptr<RequestState>> submit(std::shared_ptr<PostedOp> op, bool holdable);
  Status check_args(const PostArgs& args) const;
  Result<BoundStrategy> resolve_topology(const std::string& text) const;

  void group_start() { groups_.start(); }
  Status group_end();
  bool in_group() const { return groups_.open(); }
  // Whether (name, version) is reserved and still held in a caller's open group.
  bool holds(const std::string& name, uint64_t version) const { return groups_.holds(name, version); }
  // Every thread's held posts, as the peer closes; later posts in a group are refused.
  void fail_groups(const Status& why) { fail_held(groups_.close(), why); }

  // I/O thread: gives an op its graphs (the current topology, or the size rule).
  void bind(PostedOp& op) const;
  // I/O thread: the graphs by size alone, ignoring the current topology (fusion's ops).
  void bind_by_size(PostedOp& op) const;
  // I/O thread: no op held back by a topology change.
  bool gate_idle() const { return !gate_ && gated_.empty(); }
  // I/O thread: starts every op held back by the gate (the peer closes: each fails).
  void open_gate();
  // Any thread: the strategy an allreduce of `bytes` that names none would run on now.
  BoundStrategy in_force(uint64_t bytes) const;
  // Before the loop runs: the topology ops use when they name none.
  Status set_default_topology(const std::string& text);
  // Before the loop runs: the strategies of the bootstrapped cluster.
  void cluster_ready();
  void cluster_changed(const Cluster& before, const Cluster& now) override;

 private:
  Result<std::shared_ptr<RequestState>> post_op(PostArgs args, bool holdable);
  // How an op starts on the loop: it may be fused (it uses the automatic topology), it
  // runs alone, or it closes the gate behind it (a topology swap).
  enum class Entry { Fusable, Alone, Gating };
  // Gives a prepared op to its backend through the loop and the gate.
  Result<std::shared_ptr<RequestState>> hand_over(std::shared_ptr<PostedOp> op, bool holdable, Entry entry);
  // Hands a prepared op's start to the I/O thread, or (holdable) holds it in the calling
  // thread's open group. Fails (releasing the op's name) once the peer is closed.
  Status queue(const std::shared_ptr<PostedOp>& op, std::function<void()> task, bool holdable);
  // Held posts that will never start (the peer closed): their requests end with `why`,
  // on the loop while it runs (where user callbacks belong), else on the calling thread.
  void fail_held(std::vector<HeldPost> posts, const Status& why);
  // I/O thread: starts an op now, or later if a topology change is being agreed.
  void enter(std::function<void()> start);
  Backend* backend_for(const PostedOp& op) const;
  BoundStrategy by_size(const CollectiveSpec& spec, const StrategyCache& cache) const;
  // I/O thread (or before the loop runs): replaces current_ under current_mu_.
  void set_current(BoundStrategy s);
  std::shared_ptr<const StrategyCache> strategies() const;

  const Config& config_;
  Membership* membership_;
  IoLoop* io_;
  NameTable* names_;
  std::function<bool()> closed_;
  std::vector<Backend*> backends_;
  Placer placer_;
  PostGroups groups_;
  mutable std::mutex strategies_mu_;
  // Replaced on the I/O thread (or before the loop runs) under strategies_mu_; read there
  // without it, elsewhere through strategies().
  std::shared_ptr<const StrategyCache> strategies_;

  // The topology ops use when they name none (empty: by size): written on the I/O thread
  // under current_mu_, read there without it; and ops waiting for a topology change to settle.
  mutable std::mutex current_mu_;
  BoundStrategy current_;
  bool gate_ = false;
  std::deque<std::function<void()>> gated_;
};

}  // namespace taiji
