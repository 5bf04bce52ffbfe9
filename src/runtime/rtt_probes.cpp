#include "runtime/rtt_probes.h"

namespace taiji {

RttProbes::RttProbes(int rank, int size, Metrics* metrics)
    : rank_(rank), metrics_(metrics), departed_(size, false) {}

void RttProbes::serve(Router& router) {
  router.add(MsgType::Query, this, kName);
  router.add(MsgType::Answer, this, kName);
}

void RttProbes::send(uint32_t round) {
  for (int r = 0; r < static_cast<int>(departed_.size()); ++r) {
    if (r == rank_ || departed_[r]) continue;
    OutMessage m;
    m.header.type = MsgType::Query;
    m.header.op_version = round;
    m.name = kName;
    transport_->send(r, std::move(m));
  }
}

Status RttProbes::accept_frame(int, const FrameHeader& h, const std::string&, const uint8_t*,
                               uint8_t** target) {
  *target = nullptr;
  if (h.payload_len != 0) return {Code::Protocol, "Query/Answer frame with a payload"};
  return {};
}

void RttProbes::frame_done(int src, const FrameHeader& h, const std::string&) {
  if (h.type == MsgType::Answer) {
    if (metrics_ != nullptr) metrics_->rtt_reply(src, static_cast<uint32_t>(h.op_version), monotonic_ns());
    return;
  }
  if (transport_->queued_bytes(src) > kMaxQueuedForAnswer) return;
  OutMessage m;
  m.header.type = MsgType::Answer;
  m.header.op_kind = h.op_kind;
  m.header.op_version = h.op_version;
  m.header.chunk = 0;  // "not posted": no op has the name
  m.name = kName;
  transport_->send(src, std::move(m));
}

void RttProbes::link_down(int src, bool graceful, const Status&) {
  if (graceful) departed_[src] = true;
}

}  // namespace taiji
