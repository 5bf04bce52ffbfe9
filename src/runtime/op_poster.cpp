#include "runtime/op_poster.h"

#include <algorithm>
#include <array>
#include <new>

#include "monitor/log.h"
#include "runtime/p2p_key.h"
#include "topology/text.h"

namespace taiji {

namespace {

constexpr const char* kTopologyOpName = "taiji.set_topology";
constexpr const char* kClosed = "peer is finalized or aborted";

Status invalid(const std::string& m) { return {Code::InvalidArgument, m}; }

void use_strategy(PostedOp& op, const BoundStrategy& b) {
  op.spec.strategy = b.strategy;
  op.spec.strategy_id = b.id;
  op.spec.strategy_tag = b.tag;
  op.request->set_topology_digest(b.digest);
}

}  // namespace

OpPoster::OpPoster(const Config& config, Membership* membership, IoLoop* io, NameTable* names,
                   std::function<bool()> closed)
    : config_(config), membership_(membership), io_(io), names_(names), closed_(std::move(closed)) {}

void OpPoster::cluster_ready() {
  const Cluster& c = membership_->current();
  auto built = std::make_shared<const StrategyCache>(c.size, c.host_of);
  std::lock_guard<std::mutex> lock(strategies_mu_);
  strategies_ = std::move(built);
}

void OpPoster::cluster_changed(const Cluster& before, const Cluster& now) {
  if (now.size == before.size && now.host_of == before.host_of) return;
  cluster_ready();
  // A topology is a graph over the ranks of one cluster: on another, ops choose by size
  // until every rank agrees on a new one.
  if (current_.strategy) log().info("topology reset to automatic: the cluster changed");
  set_current({});
}

void OpPoster::set_current(BoundStrategy s) {
  std::lock_guard<std::mutex> lock(current_mu_);
  current_ = std::move(s);
}

BoundStrategy OpPoster::in_force(uint64_t bytes) const {
  {
    std::lock_guard<std::mutex> lock(current_mu_);
    if (current_.strategy) return current_;
  }
  auto cache = strategies();
  if (!cache) return {};
  return cache->get(strategy_id(select_strategy(bytes, membership_->size(), default_selection())));
}

std::shared_ptr<const StrategyCache> OpPoster::strategies() const {
  std::lock_guard<std::mutex> lock(strategies_mu_);
  return strategies_;
}

Status OpPoster::set_default_topology(const std::string& text) {
  auto configured = resolve_topology(text);
  if (!configured.is_ok()) return {Code::Config, configured.status().message()};
  set_current(configured.value());
  return {};
}

Result<BoundStrategy> OpPoster::resolve_topology(const std::string& text) const {
  uint8_t id = strategy_id(text);
  if (id != 0) return strategies()->get(id);
  auto cluster = membership_->snapshot();
  auto parsed = parse_topology(text, cluster->size, cluster->host_of);
  if (!parsed.is_ok()) {
    return Status{Code::InvalidArgument, "topology '" + printable(text) + "': " + parsed.status().message()};
  }
  return bind_custom(std::move(parsed.value()));
}

BoundStrategy OpPoster::by_size(const CollectiveSpec& spec, const StrategyCache& cache) const {
  uint64_t bytes = send_elements(spec) * dtype_size(spec.dtype);
  return cache.get(strategy_id(select_strategy(bytes, spec.size, default_selection())));
}

void OpPoster::bind(PostedOp& op) const {
  // A point-to-point op runs on no graph: nothing of the topology reaches its frames.
  if (op.spec.strategy || op_kind_p2p(op.spec.kind)) return;
  use_strategy(op, current_.strategy ? current_ : by_size(op.spec, *strategies_));
}

void OpPoster::bind_by_size(PostedOp& op) const { use_strategy(op, by_size(op.spec, *strategies_)); }

void OpPoster::enter(std::function<void()> start) {
  if (gate_) {
    gated_.push_back(std::move(start));
  } else {
    start();
  }
}

void OpPoster::open_gate() {
  gate_ = false;
  while (!gate_ && !gated_.empty()) {
    auto next = std::move(gated_.front());
    gated_.pop_front();
    next();
  }
}

Backend* OpPoster::backend_for(const PostedOp& op) const {
  for (Backend* b : backends_) {
    if (b->accepts(op)) return b;
  }
  return nullptr;
}

Status OpPoster::check_args(const PostArgs& args) const {
  if (args.name.empty()) return invalid("op name is empty");
  if (args.name.size() > config_.max_name_len) {
    return invalid("op name is " + std::to_string(args.name.size()) + " bytes; the cap is " +
                   std::to_string(config_.max_name_len));
  }
  if (args.timeout_ms < 0) return invalid("timeout_ms is negative");
  const int rank = membership_->rank();
  const int size = membership_->size();
  if (op_kind_rooted(args.kind) && (args.root < 0 || args.root >= size)) {
    return invalid("root " + std::to_string(args.root) + " is not a rank of this " +
                   std::to_string(size) + "-peer job");
  }
  if (op_kind_p2p(args.kind)) {
    const char* role = args.kind == OpKind::Send ? "dst " : "src ";
    if (args.peer < 0 || args.peer >= size) {
      return invalid(role + std::to_string(args.peer) + " is not a rank of this " +
                     std::to_string(size) + "-peer job");
    }
    if (args.peer == rank) return invalid(role + std::to_string(args.peer) + " is this peer's own rank");
  }
  size_t elem = dtype_size(args.dtype);
  if (args.count > (UINT64_MAX >> 4) / elem / static_cast<uint64_t>(size)) {
    return invalid("count is too large");
  }
  CollectiveSpec shape;
  shape.kind = args.kind;
  shape.count = args.count;
  shape.root = args.root;
  shape.rank = rank;
  shape.size = size;
  if (send_elements(shape) > 0 && args.send == nullptr) return invalid("send buffer is NULL with a non-zero count");
  if (recv_elements(shape) > 0 && args.recv == nullptr) return invalid("receive buffer is NULL with a non-zero count");
  if (args.kind == OpKind::Consensus && args.agree == nullptr) return invalid("agree output is NULL");
  return {};
}

Result<PostedOp> OpPoster::prepare(PostArgs& args) {
  if (Status s = check_args(args); !s.is_ok()) return s;
  PostedOp op;
  op.spec.kind = args.kind;
  op.spec.dtype = args.dtype;
  op.spec.redop = args.redop;
  op.spec.count = args.count;
  op.spec.root = args.root;
  op.spec.peer = args.peer;
  op.spec.send = args.send;
  op.spec.recv = args.recv;
  op.spec.agree = args.agree;
  op.spec.norms = std::move(args.norms);
  op.spec.rank = membership_->rank();
  op.spec.size = membership_->size();
  // A chunk plus rounding must fit one frame.
  op.spec.chunk_bytes = std::min<uint64_t>(config_.chunk_bytes, config_.max_payload - 8);
  BoundStrategy explicit_strategy;
  const bool p2p = op_kind_p2p(args.kind);
  if (!args.topology.empty() && !p2p) {
    auto r = resolve_topology(args.topology);
    if (!r.is_ok()) return r.status();
    explicit_strategy = r.value();
  }
  if (placer_) {
    if (Status s = placer_(args, op); !s.is_ok()) return s;
  }
  if (closed_()) return Status{Code::Finalized, kClosed};
  if (p2p) {
    const bool sending = args.kind == OpKind::Send;
    op.name = p2p_key(args.name, sending ? op.spec.rank : args.peer, sending ? args.peer : op.spec.rank);
  } else {
    op.name = args.name;
  }
  auto version = names_->reserve(op.name, args.version);
  if (!version.is_ok()) return version.status();
  op.version = version.value();
  op.timeout_ms = static_cast<uint64_t>(args.timeout_ms > 0 ? args.timeout_ms : config_.timeout_ms);
  op.posted_ns = monotonic_ns();
  op.request = std::make_shared<RequestState>(op.version, std::move(args.callback));
  if (io_->adaptive()) op.request->set_spin(io_->spin_ns(), io_->baton());
  if (explicit_strategy.strategy) use_strategy(op, explicit_strategy);
  // The calling thread's: the cache may be replaced on the I/O thread meanwhile.
  if (args.by_size) use_strategy(op, by_size(op.spec, *strategies()));
  return op;
}

Status OpPoster::queue(const std::shared_ptr<PostedOp>& op, std::function<void()> task, bool holdable) {
  HeldPost post{op, std::move(task)};
  try {
    const PostGroups::Hold held = holdable ? groups_.hold(post) : PostGroups::Hold::NotHeld;
    if (held == PostGroups::Hold::Held) return {};
    if (held == PostGroups::Hold::NotHeld && io_->run_on_loop(std::move(post.task))) return {};
  } catch (const std::bad_alloc&) {
    // Neither held nor handed over: the name comes free for a retry, at the same version.
    names_->unreserve(op->name, op->version);
    throw;
  }
  names_->release(op->name, op->version);
  return {Code::Finalized, kClosed};
}

Status OpPoster::group_end() {
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
    if (io_->run_on_loop([batch] {
          for (HeldPost& p : *batch) p.task();
        })) {
      return {};
    }
  } catch (...) {
    // Out of memory: the ops must still end, and their names come free.
    fail_held(batch ? std::move(*batch) : std::move(posts), {Code::NoMemory, "out of memory handing the group over"});
    throw;
  }
  fail_held(std::move(*batch), {Code::Finalized, kClosed});
  return {Code::Finalized, "peer is finalized or aborted: the group's ops failed"};
}

void OpPoster::fail_held(std::vector<HeldPost> posts, const Status& why) {
  if (posts.empty()) return;
  // Released now: the holding thread may wait for the failure right after this returns.
  for (HeldPost& p : posts) p.op->request->release_hold();
  auto fail_all = [this, why](std::vector<HeldPost>& ps) {
    for (HeldPost& p : ps) {
      names_->release(p.op->name, p.op->version);
      p.op->request->complete(why);
    }
  };
  std::shared_ptr<std::vector<HeldPost>> failed;
  try {
    failed = std::make_shared<std::vector<HeldPost>>(std::move(posts));
    if (io_->run_on_loop([failed, fail_all] { fail_all(*failed); })) return;
  } catch (const std::bad_alloc&) {
    // No memory to hand them over: they still end, here, rather than stay pending.
  }
  fail_all(failed ? *failed : posts);
}

Result<std::shared_ptr<RequestState>> OpPoster::post(PostArgs args) {
  if (args.name.rfind("taiji.", 0) == 0) return invalid("op names starting with 'taiji.' are reserved");
  return post_op(std::move(args), true);
}

Result<std::shared_ptr<RequestState>> OpPoster::post_internal(PostArgs args, bool holdable) {
  return post_op(std::move(args), holdable);
}

Result<std::shared_ptr<RequestState>> OpPoster::post_op(PostArgs args, bool holdable) {
  auto prepared = prepare(args);
  if (!prepared.is_ok()) return prepared.status();
  return hand_over(std::make_shared<PostedOp>(std::move(prepared.value())), holdable, Entry::Fusable);
}

Result<std::shared_ptr<RequestState>> OpPoster::submit(std::shared_ptr<PostedOp> op, bool holdable) {
  return hand_over(std::move(op), holdable, Entry::Alone);
}

Result<std::shared_ptr<RequestState>> OpPoster::hand_over(std::shared_ptr<PostedOp> op, bool holdable,
                                                          Entry entry) {
  Backend* backend = backend_for(*op);
  if (backend == nullptr) {
    names_->release(op->name, op->version);
    return invalid("no backend runs this op's buffers");
  }
  auto request = op->request;
  Status s = queue(op, [this, op, backend, entry] {
    enter([this, op, backend, entry] {
      if (entry == Entry::Gating) gate_ = true;
      backend->start(op, entry == Entry::Fusable && !current_.strategy);
    });
  }, holdable);
  if (!s.is_ok()) return s;
  return request;
}

Result<std::shared_ptr<RequestState>> OpPoster::set_topology(BoundStrategy proposed, int64_t timeout_ms,
                                                             RequestState::Callback callback) {
  if (proposed.strategy) {
    Status valid = validate_strategy(*proposed.strategy, membership_->size());
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
      set_current(proposed);
      // The swap's own request reports the topology in force after it.
      if (auto request = weak_request.lock()) {
        request->set_topology_digest(proposed.strategy ? proposed.digest : 0);
      }
      log().info("topology switched to {}", proposed.strategy ? proposed.strategy->name : "automatic");
    } else if (s.is_ok()) {
      result = {Code::Mismatch, "peers proposed different topologies; the old one stays"};
    }
    // Gated ops start from the loop, not from inside the engine's completion. A closed
    // loop runs nothing more: the open_gate that is closing it (on the links' close)
    // starts them, each failing at once, and must not stop at this op's gate.
    if (!io_->run_on_loop([this] { open_gate(); })) gate_ = false;
    return result;
  };
  return hand_over(std::move(op), true, Entry::Gating);
}

}  // namespace taiji
