#include "runtime/fusion.h"

#include <algorithm>
#include <cstring>

#include "common/byte_order.h"
#include "monitor/log.h"

namespace taiji {

namespace {

const std::string kFusedStrategy = "fused";

uint64_t now_ms() { return monotonic_ns() / 1000000; }

std::string title(const PostedOp& op) {
  return "allreduce '" + op.name + "' version " + std::to_string(op.version);
}

}  // namespace

struct Fusion::Waiting {
  PostedOp op;
  FusionEntry entry;
  uint64_t deadline_ms = 0;
  bool listed = false;           // in the running round: it must wait for its outcome
  OpStart trace;
  uint64_t token = 0;
};

struct Fusion::Round {
  uint64_t digest = 0;           // of the graphs it runs on, which its inline ops share
  std::vector<uint8_t> send;
  std::vector<uint8_t> recv;
};

struct Fusion::Group {
  FusionGroup plan;
  std::vector<std::unique_ptr<Waiting>> members;  // in plan order
  std::vector<uint8_t> send;
  std::vector<uint8_t> recv;
};

Fusion::Fusion(FusionOptions options, FusionHooks hooks, NameTable* names)
    : opt_(options), hooks_(std::move(hooks)), names_(names) {}

Fusion::~Fusion() = default;

bool Fusion::offer(PostedOp& op) {
  const CollectiveSpec& s = op.spec;
  // Gradient statistics count norms inside the op's own reduction: those run alone.
  if (s.kind != OpKind::Allreduce || s.strategy || s.norms || s.count == 0 ||
      s.count * dtype_size(s.dtype) > opt_.max_op_bytes || op.name.rfind("taiji.", 0) == 0) {
    return false;
  }
  auto w = std::make_unique<Waiting>();
  w->entry = {fusion_name_hash(op.name), op.version, s.count, static_cast<uint8_t>(s.dtype),
              static_cast<uint8_t>(s.redop), {}};
  if (w->entry.inline_data()) std::memcpy(w->entry.data.data(), s.send, w->entry.bytes());
  Key key{w->entry.hash, w->entry.version};
  // Two names with one hash (and version) waiting here at once: the second runs unfused.
  // Ranks that post the two in different orders would each fuse the other one and agree
  // on the entry; with a 64-bit hash of the name that takes ~2^32 distinct names to hit.
  if (waiting_.count(key) != 0) return false;
  w->deadline_ms = op.posted_ns / 1000000 + op.timeout_ms;
  w->op = std::move(op);
  if (!closed_.is_ok()) {
    finish(*w, closed_);
    return true;
  }
  waiting_[key] = std::move(w);
  held_ = false;
  schedule();
  return true;
}

void Fusion::schedule() {
  if (scheduled_) return;
  scheduled_ = true;
  // After the current batch of posts, so that one round lists them all.
  hooks_.defer([this] {
    scheduled_ = false;
    start_round();
  });
}

void Fusion::start_round() {
  if (round_running_ || held_ || waiting_.empty() || !closed_.is_ok()) return;
  std::vector<FusionEntry> listed;
  uint64_t timeout_ms = 1;
  const uint64_t now = now_ms();
  auto list = [&](Waiting& w) {
    // An op past its deadline is not listed again: the tick fails it, as it would an
    // unlisted one (rounds that keep settling other ops would otherwise keep it alive).
    if (w.listed || listed.size() == kRoundSlots || now >= w.deadline_ms) return;
    w.listed = true;
    listed.push_back(w.entry);
    timeout_ms = std::max<uint64_t>(timeout_ms, w.deadline_ms > now ? w.deadline_ms - now : 1);
  };
  // First what every rank that could list all its ops last time listed: the only ops
  // that can settle if those ranks post nothing new.
  for (const Key& key : wanted_) {
    auto it = waiting_.find(key);
    if (it != waiting_.end()) list(*it->second);
  }
  // Then in hash order from the cursor, wrapping around: with more ops waiting than a
  // round holds, every one is listed in turn.
  for (auto it = waiting_.lower_bound(cursor_); it != waiting_.end(); ++it) list(*it->second);
  for (auto it = waiting_.begin(); it != waiting_.end() && it->first < cursor_; ++it) list(*it->second);
  if (listed.empty()) return;  // every op waiting is past its deadline: the tick ends them
  last_listed_ = listed.empty() ? Key{} : Key{listed.back().hash, listed.back().version};
  auto round = std::make_shared<Round>();
  const uint64_t bytes = kRoundHeaderBytes + kRoundSlots * kFusionEntryBytes;
  round->send.resize(bytes);
  round->recv.resize(bytes * static_cast<uint64_t>(opt_.cluster->size));
  put32(round->send.data(), static_cast<uint32_t>(deferred_));
  put32(round->send.data() + 4, 0);
  encode_fusion_entries(listed, round->send.data() + kRoundHeaderBytes, kRoundSlots);
  PostedOp op = internal_op(kRoundName, ++rounds_, OpKind::Allgather, nullptr, round->send.data(),
                            round->recv.data(), bytes, timeout_ms);
  op.finish_hook = [this, round](const Status& s) {
    hooks_.defer([this, round, s] { on_round(*round, s); });
    return s;
  };
  round_running_ = true;
  log().debug("fusion round {} starts with {} ops", rounds_, listed.size());
  hooks_.bind_internal(op);
  round->digest = op.request->topology_digest();
  hooks_.start(std::move(op));
}

PostedOp Fusion::internal_op(const char* name, uint64_t version, OpKind kind, const FusionGroup* group,
                             const void* send, void* recv, uint64_t count, uint64_t timeout_ms) {
  PostedOp op;
  op.name = name;
  op.version = version;
  op.spec.kind = kind;
  op.spec.dtype = group ? group->dtype : DType::U8;
  op.spec.redop = group ? group->redop : RedOp::Sum;
  op.spec.count = count;
  op.spec.send = send;
  op.spec.recv = recv;
  op.spec.rank = opt_.cluster->rank;
  op.spec.size = opt_.cluster->size;
  op.spec.chunk_bytes = opt_.chunk_bytes;
  op.timeout_ms = timeout_ms;
  op.posted_ns = monotonic_ns();
  op.request = std::make_shared<RequestState>(version, nullptr);
  // Versions rise with every round and group on every rank alike; a reserve failure would
  // mean a caller reused the reserved name, which post() refuses.
  (void)names_->reserve(name, version);
  return op;
}

void Fusion::on_round(const Round& round, const Status& s) {
  round_running_ = false;
  if (!s.is_ok()) {
    // Other ranks may have settled what this rank listed: those ops fail. Ops posted
    // since were listed nowhere (a settled op is one every rank listed), so they wait
    // for the next round. A timeout reads like an unfused op's: whom it waited for.
    const size_t cause = s.message().find("; ");
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (!it->second->listed) {
        ++it;
        continue;
      }
      std::unique_ptr<Waiting> w = std::move(it->second);
      it = waiting_.erase(it);
      if (hooks_.has_early(w->op.name, w->op.version)) {
        // A peer ran it unfused and may have said how it ended (a mismatch, before its
        // Bye): the engine tells, as for any op.
        hooks_.start_unfused(std::move(w->op));
      } else if (s.code() == Code::Timeout && cause != std::string::npos) {
        finish(*w, {s.code(), title(w->op) + " timed out after " + std::to_string(w->op.timeout_ms) + " ms" +
                                  s.message().substr(cause) + " (fusion negotiation)"});
      } else {
        finish(*w, {s.code(), title(w->op) + ": fusion negotiation failed: " + s.message()});
      }
    }
    // Every rank's count of deferred rounds comes with the next round's lists.
    deferred_ = 0;
    wanted_.clear();
    schedule();
    return;
  }
  std::vector<std::vector<FusionEntry>> lists;
  uint32_t deferred_before = 0;
  const size_t per_rank = kRoundHeaderBytes + kRoundSlots * kFusionEntryBytes;
  for (int r = 0; r < opt_.cluster->size; ++r) {
    const uint8_t* block = round.recv.data() + r * per_rank;
    // The most any rank counts: a rank whose copy of an earlier round failed counts
    // fewer, and every rank must decide alike from this round on.
    deferred_before = std::max(deferred_before, get32(block));
    lists.push_back(decode_fusion_entries(block + kRoundHeaderBytes, kRoundSlots));
  }
  note_wanted(lists);
  FusionOutcome outcome = settle_fusion_round(lists, opt_.cluster->rank);
  for (const FusionMismatch& m : outcome.mismatched) {
    auto it = waiting_.find({m.entry.hash, m.entry.version});
    if (it == waiting_.end()) continue;
    std::unique_ptr<Waiting> w = std::move(it->second);
    waiting_.erase(it);
    Status why{Code::Mismatch, "'" + w->op.name + "' version " + std::to_string(w->op.version) +
                                   ": rank " + std::to_string(m.rank_b) + " posted " +
                                   describe_fusion_shape(m.shape_b) + ", rank " +
                                   std::to_string(m.rank_a) + " posted " + describe_fusion_shape(m.shape_a)};
    log().error("{}", why.message());
    finish(*w, why);
  }
  if (defer_settling(lists, outcome, deferred_before)) {
    for (auto& [key, w] : waiting_) w->listed = false;
    log().debug("fusion round {}: {} ops agreed, left for the next round: ranks are still posting",
                rounds_, outcome.agreed.size());
    start_round();
    return;
  }
  for (const FusionEntry& e : outcome.agreed) {
    if (!e.inline_data()) continue;
    auto it = waiting_.find({e.hash, e.version});
    if (it == waiting_.end()) continue;
    std::unique_ptr<Waiting> w = std::move(it->second);
    waiting_.erase(it);
    reduce_inline_entry(lists, e, static_cast<uint8_t*>(w->op.spec.recv));
    w->op.request->set_topology_digest(round.digest);
    finish(*w, {});
  }
  auto groups = plan_fusion_groups(outcome.agreed, opt_.buffer_bytes);
  // A group's version comes from the round that settled it (a round settles at most
  // kRoundSlots ops, so at most as many groups): a rank whose copy of a round failed while
  // the others' succeeded posts none of its groups, and its later groups cannot meet
  // theirs (same shapes, other steps' data), as they could with a count of groups.
  for (size_t i = 0; i < groups.size(); ++i) start_group(groups[i], rounds_ * kRoundSlots + i);
  log().debug("fusion round {}: {} ops settled in {} groups, {} mismatched, {} still waiting", rounds_,
              outcome.agreed.size(), groups.size(), outcome.mismatched.size(), waiting_.size());
  for (auto& [key, w] : waiting_) w->listed = false;
  held_ = outcome.agreed.empty() && outcome.mismatched.empty();
  // Nothing settled: the next round lists from where this one stopped.
  if (held_) cursor_ = next_key(last_listed_);
  start_round();
}

void Fusion::note_wanted(const std::vector<std::vector<FusionEntry>>& lists) {
  // A rank whose list is not full listed every op it has waiting; an op missing from such
  // a list cannot settle until that rank posts it.
  wanted_.clear();
  const std::vector<FusionEntry>* shortest = nullptr;
  for (const auto& list : lists) {
    if (list.size() < kRoundSlots && (shortest == nullptr || list.size() < shortest->size())) shortest = &list;
  }
  if (shortest == nullptr) return;
  for (const FusionEntry& e : *shortest) {
    bool everywhere = true;
    for (const auto& list : lists) {
      if (list.size() == kRoundSlots) continue;
      everywhere = everywhere && std::any_of(list.begin(), list.end(), [&](const FusionEntry& o) { return o.same_op(e); });
    }
    if (everywhere) wanted_.push_back({e.hash, e.version});
  }
}

Fusion::Key Fusion::next_key(const Key& key) {
  return key.second == UINT64_MAX ? Key{key.first + 1, 0} : Key{key.first, key.second + 1};
}

bool Fusion::defer_settling(const std::vector<std::vector<FusionEntry>>& lists, const FusionOutcome& outcome,
                            uint32_t deferred_before) {
  size_t longest = 0;
  for (const auto& list : lists) longest = std::max(longest, list.size());
  const size_t settled = outcome.agreed.size() + outcome.mismatched.size();
  const bool defer = !outcome.agreed.empty() && settled < longest && deferred_before < kMaxDeferredRounds;
  deferred_ = defer ? static_cast<int>(deferred_before) + 1 : 0;
  return defer;
}

void Fusion::start_group(const FusionGroup& plan, uint64_t version) {
  auto group = std::make_shared<Group>();
  group->plan = plan;
  const uint64_t elem = dtype_size(plan.dtype);
  group->send = take_buffer(plan.count * elem);
  group->recv = take_buffer(plan.count * elem);
  // The latest of the members' deadlines: one op with a short deadline (or one that
  // passed it while its round ran) must not fail the ops fused with it.
  uint64_t timeout_ms = 0;
  const uint64_t now = now_ms();
  const uint64_t started_ns = monotonic_ns();
  uint64_t offset = 0;
  for (const FusionEntry& e : plan.members) {
    auto it = waiting_.find({e.hash, e.version});
    std::unique_ptr<Waiting> w;
    if (it != waiting_.end()) {
      w = std::move(it->second);
      waiting_.erase(it);
      std::memcpy(group->send.data() + offset, w->op.spec.send, e.count * elem);
      timeout_ms = std::max<uint64_t>(timeout_ms, w->deadline_ms > now ? w->deadline_ms - now : 1);
      if (opt_.metrics != nullptr) {
        w->trace = {static_cast<uint8_t>(OpKind::Allreduce), &w->op.name, w->op.version,
                    e.count * elem, &kFusedStrategy, w->op.posted_ns, started_ns};
        w->token = opt_.metrics->op_started(w->trace);
      }
      ++running_;
    } else {
      std::memset(group->send.data() + offset, 0, e.count * elem);  // a reused buffer's leftovers
    }
    group->members.push_back(std::move(w));
    offset += e.count * elem;
  }
  if (timeout_ms == 0) timeout_ms = opt_.round_timeout_ms;
  PostedOp op = internal_op(kGroupName, version, OpKind::Allreduce, &plan, group->send.data(),
                            group->recv.data(), plan.count, timeout_ms);
  op.finish_hook = [this, group](const Status& s) {
    on_group(*group, s);
    return s;
  };
  hooks_.bind_internal(op);
  // Members report the graphs their data ran on, as unfused ops do.
  for (auto& w : group->members) {
    if (w) w->op.request->set_topology_digest(op.request->topology_digest());
  }
  hooks_.start(std::move(op));
}

void Fusion::on_group(Group& group, const Status& s) {
  const uint64_t elem = dtype_size(group.plan.dtype);
  uint64_t offset = 0;
  for (size_t i = 0; i < group.members.size(); ++i) {
    const uint64_t bytes = group.plan.members[i].count * elem;
    if (Waiting* w = group.members[i].get()) {
      --running_;
      if (s.is_ok()) {
        std::memcpy(w->op.spec.recv, group.recv.data() + offset, bytes);
        finish(*w, s);
      } else {
        finish(*w, {s.code(), title(w->op) + " (fused): " + s.message()});
      }
    }
    offset += bytes;
  }
  group.members.clear();
  // The allreduce has ended: nothing writes into or reads from the buffers any more.
  give_back(std::move(group.send));
  give_back(std::move(group.recv));
}

std::vector<uint8_t> Fusion::take_buffer(uint64_t bytes) {
  std::vector<uint8_t> buffer;
  if (!spare_.empty()) {
    buffer = std::move(spare_.back());
    spare_.pop_back();
  }
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer;
}

void Fusion::give_back(std::vector<uint8_t>&& buffer) {
  if (spare_.size() < kSpareBuffers) spare_.push_back(std::move(buffer));
}

void Fusion::finish(Waiting& w, const Status& s) {
  names_->release(w.op.name, w.op.version);
  if (opt_.metrics != nullptr) {
    if (w.token == 0) {
      w.trace = {static_cast<uint8_t>(OpKind::Allreduce), &w.op.name, w.op.version,
                 w.entry.count * dtype_size(w.op.spec.dtype), &kFusedStrategy, w.op.posted_ns,
                 monotonic_ns()};
      w.token = opt_.metrics->op_started(w.trace);
    }
    if (w.token != 0) {
      opt_.metrics->op_ended(w.token, w.trace, static_cast<int32_t>(s.code()), s.message(), monotonic_ns());
    }
  }
  w.op.request->complete(s);
}

void Fusion::tick() {
  const uint64_t now = now_ms();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Waiting& w = *it->second;
    if (hooks_.has_early(w.op.name, w.op.version)) {
      // Some peer runs it unfused (not eligible there, or fusion off): run it the same way,
      // so that the engine reports the disagreement to both. That peer never lists it, so
      // no round can settle it, even one that lists it here.
      PostedOp op = std::move(w.op);
      it = waiting_.erase(it);
      hooks_.start_unfused(std::move(op));
    } else if (!w.listed && now >= w.deadline_ms) {
      // A listed op waits for its round (whose deadline is the latest of its ops'): the
      // others may settle it, and then need it.
      std::unique_ptr<Waiting> owned = std::move(it->second);
      it = waiting_.erase(it);
      finish(*owned, {Code::Timeout, title(owned->op) + " timed out after " +
                                         std::to_string(owned->op.timeout_ms) +
                                         " ms; waiting for every rank to post it (fusion)"});
    } else {
      ++it;
    }
  }
  if (held_) {
    held_ = false;
    start_round();
  }
}

void Fusion::fail_all(const Status& why) {
  if (closed_.is_ok()) closed_ = why;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    std::unique_ptr<Waiting> w = std::move(it->second);
    it = waiting_.erase(it);
    finish(*w, why);
  }
}

}  // namespace taiji
