// Posting ops, choosing their graphs, and swapping the topology while ops run.
//
// A swap is a consensus on the proposed topology's digest, posted like any op. Ops posted
// after it wait, on the I/O thread, until the consensus completes (the gate), then start
// on whatever topology it settled: so every peer switches at the same point of its op
// stream, ops already in flight finish on the old graphs, and nothing is lost.
#include <algorithm>
#include <array>
#include <cstring>
#include <new>

#include "monitor/log.h"
#include "runtime/peer.h"
#include "topology/text.h"

namespace taiji {

namespace {

constexpr const char* kTopologyOpName = "taiji.set_topology";

Status invalid(const std::string& m) { return {Code::InvalidArgument, m}; }

void use_strategy(PostedOp& op, const BoundStrategy& b) {
  op.spec.strategy = b.strategy;
  op.spec.strategy_id = b.id;
  op.spec.strategy_tag = b.tag;
  op.request->set_topology_digest(b.digest);
}

// The larger of an op's send and receive buffers.
uint64_t op_bytes(const CollectiveSpec& spec) {
  return std::max(send_elements(spec), recv_elements(spec)) * dtype_size(spec.dtype);
}

}  // namespace

Result<BoundStrategy> Peer::resolve_topology(const std::string& text) const {
  uint8_t id = strategy_id(text);
  if (id != 0) return strategies_->get(id);
  auto parsed = parse_topology(text, config_.size, host_of_);
  if (!parsed.is_ok()) {
    return Status{Code::InvalidArgument, "topology '" + printable(text) + "': " + parsed.status().message()};
  }
  return bind_custom(std::move(parsed.value()));
}

BoundStrategy Peer::by_size(const CollectiveSpec& spec) const {
  uint64_t bytes = send_elements(spec) * dtype_size(spec.dtype);
  return strategies_->get(strategy_id(select_strategy(bytes, config_.size, default_selection())));
}

void Peer::bind(PostedOp& op) const {
  if (!op.spec.strategy) use_strategy(op, current_.strategy ? current_ : by_size(op.spec));
}

void Peer::bind_by_size(PostedOp& op) const { use_strategy(op, by_size(op.spec)); }

void Peer::enter(std::function<void()> start) {
  if (gate_) {
    gated_.push_back(std::move(start));
  } else {
    start();
  }
}

void Peer::open_gate() {
  gate_ = false;
  while (!gate_ && !gated_.empty()) {
    auto next = std::move(gated_.front());
    gated_.pop_front();
    next();
  }
}

Status Peer::check_args(const PostArgs& args) const {
  if (args.name.empty()) return invalid("op name is empty");
  if (args.name.size() > config_.max_name_len) {
    return invalid("op name is " + std::to_string(args.name.size()) + " bytes; the cap is " +
                   std::to_string(config_.max_name_len));
  }
  if (args.timeout_ms < 0) return invalid("timeout_ms is negative");
  if (op_kind_rooted(args.kind) && (args.root < 0 || args.root >= config_.size)) {
    return invalid("root " + std::to_string(args.root) + " is not a rank of this " +
                   std::to_string(config_.size) + "-peer job");
  }
  size_t elem = dtype_size(args.dtype);
  if (args.count > (UINT64_MAX >> 4) / elem / static_cast<uint64_t>(config_.size)) {
    return invalid("count is too large");
  }
  CollectiveSpec shape;
  shape.kind = args.kind;
  shape.count = args.count;
  shape.root = args.root;
  shape.rank = config_.rank;
  shape.size = config_.size;
  if (send_elements(shape) > 0 && args.send == nullptr) return invalid("send buffer is NULL with a non-zero count");
  if (recv_elements(shape) > 0 && args.recv == nullptr) return invalid("receive buffer is NULL with a non-zero count");
  if (args.kind == OpKind::Consensus && args.agree == nullptr) return invalid("agree output is NULL");
  return {};
}

Result<PostedOp> Peer::prepare(PostArgs& args) {
  if (Status s = check_args(args); !s.is_ok()) return s;
  PostedOp op;
  op.spec.kind = args.kind;
  op.spec.dtype = args.dtype;
  op.spec.redop = args.redop;
  op.spec.count = args.count;
  op.spec.root = args.root;
  op.spec.send = args.send;
  op.spec.recv = args.recv;
  op.spec.agree = args.agree;
  op.spec.norms = std::move(args.norms);
  op.spec.rank = config_.rank;
  op.spec.size = config_.size;
  // A chunk plus rounding must fit one frame.
  op.spec.chunk_bytes = std::min<uint64_t>(config_.chunk_bytes, config_.max_payload - 8);
  BoundStrategy explicit_strategy;
  if (!args.topology.empty()) {
    auto r = resolve_topology(args.topology);
    if (!r.is_ok()) return r.status();
    explicit_strategy = r.value();
  }
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (closing_) return Status{Code::Finalized, "peer is finalized or aborted"};
  }
  auto version = names_.reserve(args.name, args.version);
  if (!version.is_ok()) return version.status();
  op.name = args.name;
  op.version = version.value();
  op.timeout_ms = static_cast<uint64_t>(args.timeout_ms > 0 ? args.timeout_ms : config_.timeout_ms);
  op.posted_ns = monotonic_ns();
  op.request = std::make_shared<RequestState>(op.version, std::move(args.callback));
  if (adaptive_) op.request->set_spin(static_cast<uint64_t>(config_.spin_us) * 1000, baton_);
  if (explicit_strategy.strategy) use_strategy(op, explicit_strategy);
  if (args.by_size) bind_by_size(op);
  return op;
}

Status Peer::queue(const std::shared_ptr<PostedOp>& op, std::function<void()> task, bool holdable) {
  HeldPost post{op, std::move(task)};
  try {
    const PostGroups::Hold held = holdable ? groups_.hold(post) : PostGroups::Hold::NotHeld;
    if (held == PostGroups::Hold::Held) return {};
    if (held == PostGroups::Hold::NotHeld && run_on_loop(std::move(post.task))) return {};
  } catch (const std::bad_alloc&) {
    // Neither held nor handed over: the name comes free for a retry, at the same version.
    names_.unreserve(op->name, op->version);
    throw;
  }
  names_.release(op->name, op->version);
  return {Code::Finalized, "peer is finalized or aborted"};
}

Status Peer::group_end() {
  std::vector<HeldPost> posts;
  Status s = groups_.end(&posts);
  if (!s.is_ok() || posts.empty()) return s;
  // An op's deadline counts from its hand-over: it could not start while held.
  const uint64_t now = monotonic_ns();
  for (HeldPost& p : posts) {
    p.op->posted_ns = now;
    p.op->request->release_hold();
  }
  std::shared_ptr<std::vector<HeldPost>> batch;
  try {
    batch = std::make_shared<std::vector<HeldPost>>(std::move(posts));
    // One task: the loop takes the whole group up before anything else it runs.
    if (run_on_loop([batch] {
          for (HeldPost& p : *batch) p.task();
        })) {
      return {};
    }
  } catch (...) {
    // Out of memory: the ops must still end, and their names come free.
    fail_held(batch ? std::move(*batch) : std::move(posts), {Code::NoMemory, "out of memory handing the group over"});
    throw;
  }
  fail_held(std::move(*batch), {Code::Finalized, "peer is finalized or aborted"});
  return {Code::Finalized, "peer is finalized or aborted: the group's ops failed"};
}

void Peer::fail_held(std::vector<HeldPost> posts, const Status& why) {
  if (posts.empty()) return;
  // Released now: the holding thread may wait for the failure right after this returns.
  for (HeldPost& p : posts) p.op->request->release_hold();
  auto fail_all = [this, why](std::vector<HeldPost>& ps) {
    for (HeldPost& p : ps) {
      names_.release(p.op->name, p.op->version);
      p.op->request->complete(why);
    }
  };
  std::shared_ptr<std::vector<HeldPost>> failed;
  try {
    failed = std::make_shared<std::vector<HeldPost>>(std::move(posts));
    if (run_on_loop([failed, fail_all] { fail_all(*failed); })) return;
  } catch (const std::bad_alloc&) {
    // No memory to hand them over: they still end, here, rather than stay pending.
  }
  fail_all(failed ? *failed : posts);
}

Result<std::shared_ptr<RequestState>> Peer::post(PostArgs args) {
  if (args.name.rfind("taiji.", 0) == 0) return invalid("op names starting with 'taiji.' are reserved");
  return post_op(std::move(args), true);
}

Result<std::shared_ptr<RequestState>> Peer::post_internal(PostArgs args, bool holdable) {
  return post_op(std::move(args), holdable);
}

Result<std::shared_ptr<RequestState>> Peer::post_op(PostArgs args, bool holdable) {
  auto prepared = prepare(args);
  if (!prepared.is_ok()) return prepared.status();
  auto op = std::make_shared<PostedOp>(std::move(prepared.value()));
  auto request = op->request;
  // Only counted where it matters: a loop with peers on other hosts sleeps while one runs.
  const bool large = adaptive_ && !one_host_ && op_bytes(op->spec) > config_.eager_bytes;
  Status s = queue(op, [this, op, large] {
    enter([this, op, large] {
      if (fusion_ && !current_.strategy && fusion_->offer(*op)) return;
      bind(*op);
      if (large) {
        ++large_ops_;
        op->finish_hook = [this](const Status& st) {
          --large_ops_;
          return st;
        };
      }
      // The op's Ready and first Data frames to a peer leave in one write.
      transport_->cork();
      engine_->start(std::move(*op));
      transport_->uncork();
    });
  }, holdable);
  if (!s.is_ok()) return s;
  return request;
}

Result<std::shared_ptr<RequestState>> Peer::set_topology(BoundStrategy proposed, int64_t timeout_ms,
                                                         RequestState::Callback callback) {
  if (proposed.strategy) {
    Status valid = validate_strategy(*proposed.strategy, config_.size);
    if (!valid.is_ok()) return invalid("proposed topology: " + valid.message());
  }
  // The consensus compares the digest bytes (little-endian); 0 proposes "automatic".
  auto vote = std::make_shared<std::pair<std::array<uint8_t, 8>, int>>();
  for (int i = 0; i < 8; ++i) vote->first[i] = static_cast<uint8_t>(proposed.digest >> (8 * i));
  PostArgs args;
  args.kind = OpKind::Consensus;
  args.name = kTopologyOpName;
  args.send = vote->first.data();
  args.count = vote->first.size();
  args.dtype = DType::U8;
  args.redop = RedOp::Min;
  args.agree = &vote->second;
  args.timeout_ms = timeout_ms;
  args.callback = std::move(callback);
  auto prepared = prepare(args);
  if (!prepared.is_ok()) return prepared.status();
  auto op = std::make_shared<PostedOp>(std::move(prepared.value()));
  // Runs on the I/O thread as the consensus ends, before its request completes.
  std::weak_ptr<RequestState> weak_request = op->request;
  op->finish_hook = [this, vote, proposed, weak_request](const Status& s) {
    Status result = s;
    if (s.is_ok() && vote->second == 1) {
      current_ = proposed;
      // The swap's own request reports the topology in force after it.
      if (auto request = weak_request.lock()) {
        request->set_topology_digest(proposed.strategy ? proposed.digest : 0);
      }
      log().info("topology switched to {}", proposed.strategy ? proposed.strategy->name : "automatic");
    } else if (s.is_ok()) {
      result = {Code::Mismatch, "peers proposed different topologies; the old one stays"};
    }
    // Gated ops start from the loop, not from inside the engine's completion. A closed
    // loop runs nothing more: the open_gate that is closing it (on_links_closed) starts
    // them, each failing at once, and must not stop at this op's gate.
    if (!run_on_loop([this] { open_gate(); })) gate_ = false;
    return result;
  };
  auto request = op->request;
  Status s = queue(op, [this, op] {
    enter([this, op] {
      bind(*op);
      gate_ = true;
      engine_->start(std::move(*op));
    });
  }, true);
  if (!s.is_ok()) return s;
  return request;
}

}  // namespace taiji
