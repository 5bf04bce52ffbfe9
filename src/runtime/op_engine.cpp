#include "runtime/op_engine.h"

#include <algorithm>
#include <cstring>

#include "monitor/log.h"
#include "runtime/op_engine_active.h"
#include "runtime/p2p_key.h"

namespace taiji {

namespace {

std::string describe(OpKind kind, uint64_t count, uint8_t dtype, uint8_t redop, uint32_t root,
                     uint32_t topology) {
  std::string s = kind_name(kind);
  if (kind != OpKind::Barrier) {
    s += " count " + std::to_string(count) + " " +
         std::string(valid_dtype(dtype) ? dtype_name(static_cast<DType>(dtype)) : "dtype?");
  }
  if (op_kind_reduces(kind)) {
    s += " " + std::string(valid_redop(redop) ? redop_name(static_cast<RedOp>(redop)) : "op?");
  }
  if (op_kind_rooted(kind)) s += " root " + std::to_string(root);
  // A point-to-point op runs on no topology.
  if (op_kind_p2p(kind)) return s;
  return s + " topology " + fmt::format("{:06x}", topology);
}

}  // namespace

OpEngine::OpEngine(uv_loop_t* loop, EngineOptions options, NameTable* names)
    : loop_(loop),
      opt_(options),
      names_(names),
      early_({options.cluster->size, options.unexpected_bytes,
              std::max(options.eager_bytes, options.unexpected_bytes), options.metrics,
              [this](int src) { transport_->pause_reading(src); },
              [this](int src) { transport_->resume_reading(src); }}),
      stalls_({options.cluster->rank, options.cluster->size, options.held}, names,
              [this](const Key& key, StallWatchdog::OpState* out) { return stall_state(key, out); }),
      rx_abort_(options.cluster->size),
      departed_(options.cluster->size, false),
      rx_op_(options.cluster->size, nullptr) {}

OpEngine::~OpEngine() = default;

void OpEngine::set_transport(Transport* transport) {
  transport_ = transport;
  stalls_.set_transport(transport);
}

void OpEngine::serve(Router& router) {
  router.add(MsgType::Ready, this);
  router.add(MsgType::Data, this);
  router.add(MsgType::Abort, this);
  stalls_.serve(router);
}

FrameHeader OpEngine::header_for(const Active& op, MsgType type) const {
  const CollectiveSpec& s = op.op->spec();
  FrameHeader h;
  h.type = type;
  h.op_kind = s.kind;
  h.dtype = static_cast<uint8_t>(s.dtype);
  h.redop = static_cast<uint8_t>(s.redop);
  h.root = static_cast<uint32_t>(s.root);
  h.op_version = op.key.second;
  h.count = s.count;
  h.strategy = s.strategy_id;
  h.strategy_tag = s.strategy_tag;
  return h;
}

void OpEngine::start(PostedOp posted) {
  auto op = std::make_unique<Active>();
  op->key = {posted.name, posted.version};
  op->request = std::move(posted.request);
  op->finish_hook = std::move(posted.finish_hook);
  op->timeout_ms = posted.timeout_ms;
  op->started = uv_now(loop_);
  // The deadline counts from the post (or a group's hand-over), not from here: an op that
  // waited for a fusion round and then left it (a peer runs it unfused) keeps only what
  // it had left.
  const uint64_t now_ns = monotonic_ns();
  const uint64_t waited_ms =
      posted.posted_ns != 0 && now_ns > posted.posted_ns ? (now_ns - posted.posted_ns) / 1000000 : 0;
  op->deadline = op->started + (posted.timeout_ms - std::min(posted.timeout_ms, waited_ms));
  op->ready_from.assign(opt_.cluster->size, false);
  op->held.resize(opt_.cluster->size);
  op->writes_to.assign(opt_.cluster->size, 0);
  op->op = std::make_unique<CollectiveOp>(std::move(posted.spec));
  Active& ref = *op;
  ops_[ref.key] = std::move(op);
  if (opt_.metrics != nullptr) {
    const CollectiveSpec& spec = ref.op->spec();
    ref.trace = {static_cast<uint8_t>(spec.kind), &ref.key.first, ref.key.second,
                 spec.count * dtype_size(spec.dtype), spec.strategy ? &spec.strategy->name : nullptr,
                 posted.posted_ns, now_ns};
    ref.metrics_token = opt_.metrics->op_started(ref.trace);
  }
  if (ref.op->out_of_memory()) {
    // Every rank hears of it (an Abort), so none waits for this one until its deadline.
    early_.discard(ref.key);
    mismatch(ref, {Code::NoMemory, ref.title() + ": out of memory for the op's buffers"});
    return maybe_finish(ref);
  }
  begin(ref);
  maybe_finish(ref);
}

void OpEngine::begin(Active& op) {
  const bool early = early_.holds(op.key);
  Status aborted = early ? early_.abort_for(op.key) : Status{};
  if (!closed_.is_ok() || !aborted.is_ok()) {
    early_.discard(op.key);
    return fail(op, closed_.is_ok() ? aborted : closed_);
  }
  for (int src : op.op->sources()) {
    OutMessage m;
    m.header = header_for(op, MsgType::Ready);
    m.name = op.key.first;
    transport_->send(src, std::move(m));
  }
  std::vector<ChunkSend> sends;
  op.op->start(&sends);
  if (!early) {
    dispatch(op, sends);
    return fail_if_departed(op);
  }
  EarlyArrivals::Claimed claimed = early_.claim(op.key);
  for (const FrameHeader& h : claimed.readies) {
    if (!op.failed) on_ready(op, h);
  }
  dispatch(op, sends);
  for (auto& d : claimed.data) {
    if (!op.failed) deliver_early(op, *d);
  }
  fail_if_departed(op);
}

void OpEngine::fail_if_departed(Active& op) {
  // Every op starts here: while no rank has left, skip building the list of ranks.
  if (std::find(departed_.begin(), departed_.end(), true) == departed_.end()) return;
  // A rank that finalized sent everything it ever will before its Bye; an op still
  // waiting on it, or still owing it data, cannot finish.
  auto waiting = op.op->waiting_on();
  for (int r : op.op->destinations()) {
    if (!op.ready_from[r]) waiting.push_back(r);
  }
  for (int r : waiting) {
    if (departed_[r]) {
      // The ranks that wait on this one for the op would otherwise wait out its deadline.
      return fail_everywhere(op, {Code::PeerLost, op.title() + ": rank " + std::to_string(r) + " has finalized"});
    }
  }
}

void OpEngine::dispatch(Active& op, std::vector<ChunkSend>& sends) {
  for (const ChunkSend& s : sends) {
    if (op.failed) return;
    if (s.bytes <= opt_.eager_bytes || op.ready_from[s.dst]) {
      send_chunk(op, s);
    } else {
      op.held[s.dst].push_back(s);
    }
  }
}

void OpEngine::send_chunk(Active& op, const ChunkSend& s) {
  if (departed_[s.dst]) {
    return fail_everywhere(op, {Code::PeerLost, op.title() + ": rank " + std::to_string(s.dst) + " has finalized"});
  }
  OutMessage m;
  m.header = header_for(op, MsgType::Data);
  m.header.chunk = s.chunk;
  m.header.stage = static_cast<uint8_t>(s.stage);
  m.header.offset = s.offset;
  m.name = op.key.first;
  m.payload = s.data;
  m.payload_len = s.bytes;
  Active* p = &op;
  int dst = s.dst;
  op.writes++;
  op.writes_to[dst]++;
  m.on_sent = [this, p, dst](const Status& st) {
    p->writes--;
    p->writes_to[dst]--;
    if (!st.is_ok()) {
      fail(*p, {Code::PeerLost, p->title() + ": send to rank " + std::to_string(dst) +
                                    " failed: " + st.message()});
    }
    maybe_finish(*p);
  };
  transport_->send(dst, std::move(m));
}

Status OpEngine::check_match(const Active& op, const FrameHeader& h) const {
  const CollectiveSpec& s = op.op->spec();
  bool same = h.op_kind == op_kind_partner(s.kind) && h.count == s.count &&
              h.strategy == s.strategy_id && h.strategy_tag == s.strategy_tag;
  if (s.kind != OpKind::Barrier) same = same && h.dtype == static_cast<uint8_t>(s.dtype);
  if (op_kind_reduces(s.kind)) same = same && h.redop == static_cast<uint8_t>(s.redop);
  if (op_kind_rooted(s.kind)) same = same && h.root == static_cast<uint32_t>(s.root);
  if (same) return {};
  return {Code::Mismatch,
          "'" + std::string(p2p_user_name(op.key.first)) + "' version " +
              std::to_string(op.key.second) + ": rank " +
              std::to_string(h.src_rank) + " posted " +
              describe(h.op_kind, h.count, h.dtype, h.redop, h.root,
                       h.strategy | static_cast<uint32_t>(h.strategy_tag) << 8) +
              ", rank " + std::to_string(opt_.cluster->rank) + " posted " +
              describe(s.kind, s.count, static_cast<uint8_t>(s.dtype),
                       static_cast<uint8_t>(s.redop), static_cast<uint32_t>(s.root),
                       s.strategy_id | static_cast<uint32_t>(s.strategy_tag) << 8)};
}

void OpEngine::mismatch(Active& op, const Status& why) {
  log().error("{}", why.message());
  fail_everywhere(op, why);
}

void OpEngine::fail_everywhere(Active& op, const Status& why) {
  for (int r = 0; r < opt_.cluster->size; ++r) {
    if (r == opt_.cluster->rank || departed_[r] || !op.involves(r)) continue;
    OutMessage m;
    m.header = header_for(op, MsgType::Abort);
    m.header.chunk = static_cast<uint32_t>(-static_cast<int32_t>(why.code()));
    m.name = op.key.first;
    std::string reason = why.message().substr(0, kMaxAbortReason);
    m.owned.assign(reason.begin(), reason.end());
    transport_->send(r, std::move(m));
  }
  fail(op, why);
}

void OpEngine::on_ready(Active& op, const FrameHeader& h) {
  Status m = check_match(op, h);
  if (!m.is_ok()) return mismatch(op, m);
  int src = static_cast<int>(h.src_rank);
  op.ready_from[src] = true;
  auto held = std::move(op.held[src]);
  op.held[src].clear();
  for (const ChunkSend& s : held) send_chunk(op, s);
}

void OpEngine::deliver_early(Active& op, const EarlyArrivals::Data& d) {
  const FrameHeader& h = d.header;
  int src = static_cast<int>(h.src_rank);
  Status m = check_match(op, h);
  if (!m.is_ok()) return mismatch(op, m);
  uint8_t* target = nullptr;
  Status s = op.op->target(src, h.chunk, static_cast<Stage>(h.stage), h.offset, h.payload_len, &target);
  if (!s.is_ok()) return mismatch(op, plan_mismatch(op, s));
  if (h.payload_len > 0) std::memcpy(target, d.payload.data(), h.payload_len);
  deliver(op, src, h);
}

Status OpEngine::plan_mismatch(const Active& op, const Status& why) const {
  // Count, dtype and op agree (checked first), so a chunk at another offset or length
  // means the peers cut the buffer differently: a configuration disagreement. A duplicate
  // or a chunk from a rank off the graph is a faulty sender, not a configuration.
  const bool plan = why.message().find("do not match the chunk plan") != std::string::npos ||
                    why.message().find("past the last chunk") != std::string::npos;
  return {Code::Mismatch,
          op.title() + ": " + why.message() +
              (plan ? " (peers must use the same TAIJI_CHUNK_BYTES and TAIJI_MAX_PAYLOAD_BYTES)" : "")};
}

void OpEngine::deliver(Active& op, int src, const FrameHeader& h) {
  std::vector<ChunkSend> sends;
  op.op->delivered(src, h.chunk, static_cast<Stage>(h.stage), &sends);
  dispatch(op, sends);
}

void OpEngine::fail(Active& op, const Status& why) {
  if (op.failed || op.finished) return;
  op.failed = true;
  op.failure = why;
  op.failed_at = uv_now(loop_);
  for (auto& h : op.held) h.clear();
  if (op.metrics_token != 0) {
    opt_.metrics->op_failed(op.metrics_token, static_cast<int32_t>(why.code()), why.message());
  }
}

void OpEngine::maybe_finish(Active& op) {
  if (op.finished || !(op.failed || op.op->done()) || op.writes > 0 || op.receiving > 0) return;
  // Every rank this op sends to must have posted it too (its Ready arrived and matched):
  // a broadcast root, done locally at once, still owes chunks held for Ready, and a
  // disagreement about the op must reach both ends of every edge.
  if (!op.failed) {
    for (int r : op.op->destinations()) {
      if (!op.ready_from[r]) return;
    }
  }
  op.finished = true;
  auto it = ops_.find(op.key);
  std::unique_ptr<Active> owned = std::move(it->second);
  ops_.erase(it);
  names_->release(owned->key.first, owned->key.second);
  if (owned->stall_asked) stalls_.forget(owned->key);
  Status result = owned->failed ? owned->failure : Status{};
  if (owned->finish_hook) result = owned->finish_hook(result);
  if (owned->metrics_token != 0) {
    opt_.metrics->op_ended(owned->metrics_token, owned->trace, static_cast<int32_t>(result.code()),
                           result.message(), monotonic_ns());
  }
  owned->request->complete(result);
}

Status OpEngine::accept_frame(int src, const FrameHeader& h, const std::string& name,
                              const uint8_t* in_memory, uint8_t** target) {
  *target = nullptr;
  Key key{name, h.op_version};
  if (h.type == MsgType::Ready) {
    if (h.payload_len != 0) return {Code::Protocol, "Ready frame with a payload"};
    return {};
  }
  if (h.type == MsgType::Abort) {
    if (h.payload_len > kMaxAbortReason) return {Code::Protocol, "Abort reason too long"};
    rx_abort_[src].resize(h.payload_len);
    *target = rx_abort_[src].data();
    return {};
  }
  // A transport hands over one frame at a time per source; a second one inside the first
  // (a mailbox record slipped into a TCP payload) would take over its receive state.
  if (rx_op_[src] != nullptr || early_.arriving(src)) {
    return {Code::Protocol, "a data frame from rank " + std::to_string(src) + " began inside another"};
  }
  auto it = ops_.find(key);
  if (it != ops_.end()) {
    Active& op = *it->second;
    if (op.failed) return {};
    Status m = check_match(op, h);
    if (!m.is_ok()) {
      mismatch(op, m);
      maybe_finish(op);
      return {};
    }
    Status s = op.op->target(src, h.chunk, static_cast<Stage>(h.stage), h.offset, h.payload_len,
                             target, in_memory);
    if (!s.is_ok()) {
      *target = nullptr;
      mismatch(op, plan_mismatch(op, s));
      maybe_finish(op);
      return {};
    }
    op.receiving++;
    rx_op_[src] = &op;
    return {};
  }
  if (!closed_.is_ok() || names_->is_past(name, h.op_version)) {
    log().debug("dropping data for ended op '{}' version {} from rank {}", name, h.op_version, src);
    return {};
  }
  // A real member sends data before the receiver's Ready only up to the eager size (far
  // below the cap by default); the pool refuses a larger frame before it is allocated.
  return early_.begin_data(src, key, h, target);
}

void OpEngine::frame_done(int src, const FrameHeader& h, const std::string& name) {
  Key key{name, h.op_version};
  auto it = ops_.find(key);
  Active* op = it != ops_.end() ? it->second.get() : nullptr;
  switch (h.type) {
    case MsgType::Ready:
      if (op != nullptr) {
        if (!op->failed) on_ready(*op, h);
        maybe_finish(*op);
      } else if (closed_.is_ok() && !names_->is_past(name, h.op_version)) {
        early_.hold_ready(src, key, h);
      }
      return;
    case MsgType::Abort: {
      int64_t code = -static_cast<int64_t>(h.chunk);
      Code c = code < 0 && code >= static_cast<int64_t>(Code::Bootstrap) ? static_cast<Code>(code)
                                                                         : Code::Protocol;
      Status why{c, "rank " + std::to_string(src) + " reports: " +
                        std::string(rx_abort_[src].begin(), rx_abort_[src].end())};
      if (op != nullptr) {
        fail(*op, why);
        maybe_finish(*op);
      } else if (closed_.is_ok() && !names_->is_past(name, h.op_version)) {
        early_.hold_abort(src, key, why);
      }
      return;
    }
    default:
      break;
  }
  if (early_.arriving(src)) {
    // The op may have been posted, or even have ended, while this payload arrived.
    bool ended = op == nullptr && (!closed_.is_ok() || names_->is_past(name, h.op_version));
    std::unique_ptr<EarlyArrivals::Data> mine = early_.complete(src, key, op == nullptr && !ended);
    if (op == nullptr) return;
    if (!op->failed) deliver_early(*op, *mine);
    return maybe_finish(*op);
  }
  if (op == nullptr || rx_op_[src] != op) return;
  rx_op_[src] = nullptr;
  op->receiving--;
  if (!op->failed) deliver(*op, src, h);
  maybe_finish(*op);
}

void OpEngine::link_down(int src, bool graceful, const Status& why) {
  // A rank that said Bye sends nothing more; a write to it failing afterwards (our own Bye
  // meeting its closed socket) is not a loss. Ops that still needed it fail below anyway.
  if (departed_[src]) graceful = true;
  if (Active* op = rx_op_[src]) {
    rx_op_[src] = nullptr;
    op->receiving--;
  }
  early_.drop_partial(src);
  std::vector<Key> keys;
  for (auto& [key, op] : ops_) keys.push_back(key);
  if (!graceful) {
    Status lost{Code::PeerLost, "rank " + std::to_string(src) + " lost: " + why.message()};
    // Every collective runs over every rank of the cluster, so each needed src; a
    // send or recv needs only its other side.
    for (const Key& key : keys) {
      auto it = ops_.find(key);
      if (it != ops_.end() && it->second->involves(src)) fail(*it->second, lost);
    }
    if (on_link_lost_) on_link_lost_(src, lost);
  } else {
    departed_[src] = true;
    for (const Key& key : keys) {
      auto it = ops_.find(key);
      if (it != ops_.end() && !it->second->failed) fail_if_departed(*it->second);
    }
    if (on_departed_) on_departed_(src);
  }
  for (const Key& key : keys) {
    auto it = ops_.find(key);
    if (it != ops_.end()) maybe_finish(*it->second);
  }
}

void OpEngine::cluster_changed(const Cluster& before, const Cluster& now) {
  fail_ops({Code::Aborted, "the cluster changed from version " + std::to_string(before.version) +
                               " to " + std::to_string(now.version) + " while the op ran"});
}

void OpEngine::transport_closed() {
  for (auto& op : rx_op_) {
    if (op != nullptr) op->receiving--;
    op = nullptr;
  }
  early_.abandon_partials();
  fail_all(closed_.is_ok() ? Status{Code::Finalized, "peer closed"} : closed_);
}

void OpEngine::fail_all(const Status& why) {
  if (closed_.is_ok()) closed_ = why;
  fail_ops(why);
}

void OpEngine::fail_ops(const Status& why) {
  std::vector<Key> keys;
  for (auto& [key, op] : ops_) keys.push_back(key);
  for (const Key& key : keys) {
    auto it = ops_.find(key);
    if (it != ops_.end()) fail(*it->second, why);
  }
  for (const Key& key : keys) {
    auto it = ops_.find(key);
    if (it != ops_.end()) maybe_finish(*it->second);
  }
  // Payloads still arriving keep their buffers until their frame ends.
  early_.discard_if([](const Key&) { return true; });
}

}  // namespace taiji
