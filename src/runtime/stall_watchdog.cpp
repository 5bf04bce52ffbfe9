#include "runtime/stall_watchdog.h"

#include "monitor/log.h"

namespace taiji {

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : " ") + std::to_string(r);
  return s;
}

StallWatchdog::StallWatchdog(StallOptions options, NameTable* names, Lookup lookup)
    : opt_(std::move(options)), names_(names), lookup_(std::move(lookup)) {}

void StallWatchdog::serve(Router& router) {
  router.add(MsgType::Query, this);
  router.add(MsgType::Answer, this);
}

void StallWatchdog::ask(const Key& key, const FrameHeader& query, const std::vector<bool>& departed,
                        bool report, int only) {
  Asked& asked = asked_[key];
  asked.report = report;
  std::vector<int8_t>& posted_at = asked.posted_at;
  posted_at.assign(opt_.size, -1);
  posted_at[opt_.rank] = 1;
  for (int r = 0; r < opt_.size; ++r) {
    if (r == opt_.rank) continue;
    if (only >= 0 && r != only) {
      posted_at[r] = 1;  // takes no part: nothing to wait for
      continue;
    }
    if (departed[r]) {
      posted_at[r] = 0;
      continue;
    }
    OutMessage m;
    m.header = query;
    m.name = key.first;
    transport_->send(r, std::move(m));
  }
}

std::vector<int> StallWatchdog::ranks_answering(const Key& key, int8_t answer) const {
  std::vector<int> ranks;
  auto it = asked_.find(key);
  for (int r = 0; it != asked_.end() && r < opt_.size; ++r) {
    if (it->second.posted_at[r] == answer) ranks.push_back(r);
  }
  return ranks;
}

std::vector<int> StallWatchdog::unposted(const Key& key) const { return ranks_answering(key, 0); }

std::vector<int> StallWatchdog::unanswered(const Key& key) const { return ranks_answering(key, -1); }

Status StallWatchdog::accept_frame(int, const FrameHeader& h, const std::string&, const uint8_t*,
                                   uint8_t** target) {
  *target = nullptr;
  if (h.payload_len != 0) return {Code::Protocol, "Query/Answer frame with a payload"};
  return {};
}

void StallWatchdog::frame_done(int src, const FrameHeader& h, const std::string& name) {
  if (h.type == MsgType::Query) return answer(src, h, name);
  on_answer({name, h.op_version}, src, h.chunk != 0);
}

void StallWatchdog::answer(int src, const FrameHeader& h, const std::string& name) {
  if (transport_->queued_bytes(src) > kMaxQueuedForAnswer) return;
  OutMessage m;
  m.header.type = MsgType::Answer;
  m.header.op_kind = h.op_kind;
  m.header.op_version = h.op_version;
  const bool posted = names_->posted(name, h.op_version) && !(opt_.held && opt_.held(name, h.op_version));
  m.header.chunk = posted ? 1 : 0;
  m.name = name;
  transport_->send(src, std::move(m));
}

void StallWatchdog::on_answer(const Key& key, int src, bool posted) {
  auto it = asked_.find(key);
  OpState op;
  if (it == asked_.end() || !lookup_(key, &op) || it->second.posted_at[src] != -1) return;
  std::vector<int8_t>& posted_at = it->second.posted_at;
  posted_at[src] = posted ? 1 : 0;
  if (!it->second.report) return;
  std::vector<int> missing;
  for (int r = 0; r < opt_.size; ++r) {
    if (posted_at[r] == -1) return;
    if (posted_at[r] == 0) missing.push_back(r);
  }
  if (!missing.empty()) {
    log().warn("stall: {} posted here {} ms ago; rank(s) {} have not posted it", op.title, op.age_ms,
               rank_list(missing));
    return;
  }
  log().warn("stall: {} posted here {} ms ago is posted on every rank; waiting for data from "
             "rank(s) {}", op.title, op.age_ms, op.waiting_on.empty() ? "none" : rank_list(op.waiting_on));
}

}  // namespace taiji
