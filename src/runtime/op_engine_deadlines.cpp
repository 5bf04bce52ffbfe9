// The op engine's clock: stall queries at the warning or half the deadline, timeouts that
// name the ranks at fault, and links cut when a failed op's buffers stay stuck.
#include <algorithm>

#include "monitor/log.h"
#include "runtime/op_engine.h"
#include "runtime/op_engine_active.h"

namespace taiji {

bool OpEngine::stall_state(const Key& key, StallWatchdog::OpState* out) const {
  auto it = ops_.find(key);
  if (it == ops_.end() || it->second->failed) return false;
  const Active& op = *it->second;
  *out = {op.title(), uv_now(loop_) - op.started, op.op->waiting_on()};
  return true;
}

Status OpEngine::describe_timeout(const Active& op) const {
  std::string s = op.title() + " timed out after " + std::to_string(op.timeout_ms) + " ms";
  auto waiting = op.op->waiting_on();
  if (!waiting.empty()) s += "; waiting here for data from rank(s) " + rank_list(waiting);
  // A rank this one sends to and whose Ready never came has not posted the op.
  std::vector<int> unready;
  const std::vector<int>& dsts = op.op->destinations();
  for (int r = 0; r < opt_.cluster->size; ++r) {
    const bool owed = std::find(dsts.begin(), dsts.end(), r) != dsts.end();
    if (!op.held[r].empty() || (owed && !op.ready_from[r])) unready.push_back(r);
  }
  if (!unready.empty()) s += "; rank(s) " + rank_list(unready) + " never posted it";
  const std::vector<int> unposted = op.stall_asked ? stalls_.unposted(op.key) : std::vector<int>{};
  if (!unposted.empty()) s += "; rank(s) " + rank_list(unposted) + " had not posted it when asked";
  const std::vector<int> silent = op.stall_asked ? stalls_.unanswered(op.key) : std::vector<int>{};
  if (!silent.empty()) {
    s += "; rank(s) " + rank_list(silent) + " did not answer whether they posted it (stopped, hung or cut off)";
  }
  // The ranks it waits on for data may be waiting themselves (a ring passes a stall along):
  // without a rank named above, say that the one at fault is not known rather than blame them.
  // An op with one partner (a send or recv, a job of two) has no one else to blame.
  const bool one_partner = op_kind_p2p(op.kind()) || opt_.cluster->size <= 2;
  if (!one_partner && unready.empty() && unposted.empty() && silent.empty()) {
    s += op.stall_asked ? "; every rank had posted it: the rank at fault is unknown"
                        : "; the rank at fault is unknown";
  }
  return {Code::Timeout, s};
}

void OpEngine::tick() {
  uint64_t now = uv_now(loop_);
  Status first_timeout;
  std::vector<Key> keys;
  for (auto& [key, op] : ops_) keys.push_back(key);
  for (const Key& key : keys) {
    auto it = ops_.find(key);
    if (it == ops_.end()) continue;
    Active& op = *it->second;
    // Asked at the stall warning, or quietly at half the deadline at the latest, so that
    // a timeout can name the rank actually missing (with two ranks there is only the other).
    const bool warn_due = opt_.stall_warn_ms > 0 && now >= op.started + opt_.stall_warn_ms;
    // (A send or recv has only its partner to blame.)
    const bool blame_due = opt_.cluster->size > 2 && !op_kind_p2p(op.kind()) &&
                           now >= op.started + (op.deadline - op.started) / 2;
    if (!op.failed && !op.stall_asked && (warn_due || blame_due)) {
      op.stall_asked = true;
      stalls_.ask(key, header_for(op, MsgType::Query), departed_, warn_due,
                  op_kind_p2p(op.kind()) ? op.op->spec().peer : -1);
    }
    if (!op.failed && now >= op.deadline) {
      Status why = describe_timeout(op);
      log().warn("{}", why.message());
      if (first_timeout.is_ok()) first_timeout = why;
      op.stuck_after = kStuckTimeoutMs;
      fail(op, why);
      maybe_finish(op);
      continue;
    }
    if (op.failed && now >= op.failed_at + op.stuck_after) {
      for (int r = 0; r < opt_.cluster->size; ++r) {
        if (op.writes_to[r] > 0 || rx_op_[r] == &op) {
          transport_->drop(r, {Code::Timeout, "rank " + std::to_string(r) +
                                                  " stopped exchanging data for " + op.title()});
          if (ops_.find(key) == ops_.end()) break;
        }
      }
    }
  }
  if (!first_timeout.is_ok() && on_timeout_) on_timeout_(first_timeout);
  // Frames for a version this peer will never post (another peer's op that failed here
  // first, a fusion group of a round that failed only here): once a later version of the
  // name has ended, nothing can claim them, and their bytes would count against the
  // early-arrival cap for good, until reads from their sender paused for ever.
  early_.discard_if([this](const Key& key) { return names_->is_past(key.first, key.second); });
}

}  // namespace taiji
