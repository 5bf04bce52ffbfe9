#include "runtime/link_prober.h"

#include <algorithm>

namespace taiji {

namespace {

// Smoothing of the samples: recent enough to show a change within a few probes of a link.
constexpr double kNewWeight = 0.5;

double smooth(double old, double sample) { return old > 0 ? (1 - kNewWeight) * old + kNewWeight * sample : sample; }

}  // namespace

LinkProber::LinkProber(int rank, int size, uint64_t rate, uint64_t probe_bytes, Metrics* metrics)
    : rank_(rank),
      rate_(rate),
      probe_bytes_(probe_bytes),
      metrics_(metrics),
      gone_(static_cast<size_t>(size), false),
      bandwidth_(static_cast<size_t>(size), 0.0),
      latency_(static_cast<size_t>(size), 0.0) {
  if (rate_ > 0) payload_.assign(probe_bytes_, 0);
}

void LinkProber::serve(Router& router) {
  router.add(MsgType::Query, this, kName);
  router.add(MsgType::Answer, this, kName);
}

void LinkProber::tick(uint64_t now_ms) {
  const int n = static_cast<int>(gone_.size());
  if (target_ >= 0 && now_ms >= started_ms_ + kProbeGiveUpMs) target_ = -1;
  if (rate_ == 0 || !started_ || stopped_ || target_ >= 0 || now_ms < next_start_ms_ || n < 2) return;
  for (int tries = 0; tries < n; ++tries) {
    const int r = next_;
    next_ = (next_ + 1) % n;
    if (r == rank_ || gone_[static_cast<size_t>(r)]) continue;
    target_ = r;
    started_ms_ = now_ms;
    ++seq_;
    send(r, seq_, false);
    send(r, seq_, true);
    // The next probe waits until this one's bytes fit the rate, counted from its start.
    next_start_ms_ = now_ms + std::max<uint64_t>(1, (probe_bytes_ * 1000 + rate_ - 1) / rate_);
    return;
  }
}

void LinkProber::send(int dst, uint64_t seq, bool large) {
  OutMessage m;
  m.header.type = MsgType::Query;
  m.header.op_version = 2 * seq + (large ? 1 : 0);
  m.name = kName;
  if (large) {
    m.payload = payload_.data();
    m.payload_len = payload_.size();
  }
  (large ? sent_large_ns_ : sent_small_ns_) = monotonic_ns();
  {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_sent_ += large ? probe_bytes_ : 0;
  }
  transport_->send(dst, std::move(m));
}

Status LinkProber::accept_frame(int, const FrameHeader& h, const std::string&, const uint8_t*, uint8_t** target) {
  *target = nullptr;  // a probe's payload is read and dropped
  if (h.type == MsgType::Answer && h.payload_len != 0) return {Code::Protocol, "link probe answer with a payload"};
  if (h.type == MsgType::Query && h.payload_len > kMaxProbePayload) {
    return {Code::Protocol, "link probe larger than " + std::to_string(kMaxProbePayload) + " bytes"};
  }
  return {};
}

void LinkProber::frame_done(int src, const FrameHeader& h, const std::string&) {
  if (h.type == MsgType::Query) {
    OutMessage m;
    m.header.type = MsgType::Answer;
    m.header.op_version = h.op_version;
    m.name = kName;
    transport_->send(src, std::move(m));
    return;
  }
  // An answer from an earlier probe (its link went down meanwhile) or another rank is stale.
  if (src != target_ || h.op_version / 2 != seq_) return;
  const uint64_t now = monotonic_ns();
  if (h.op_version % 2 == 0) {
    answered_small_ns_ = now;
    return;
  }
  target_ = -1;
  if (answered_small_ns_ < sent_small_ns_) return;  // the small answer got lost: no sample
  sample(src, static_cast<double>(answered_small_ns_ - sent_small_ns_) * 1e-9,
         static_cast<double>(now - sent_large_ns_) * 1e-9);
}

void LinkProber::sample(int peer, double seconds_small, double seconds_large) {
  // The large probe's time less the small one's round trip is its transfer; a probe too
  // small to show past the round trip still gives a finite figure.
  const double transfer = std::max(seconds_large - seconds_small, seconds_large / 10);
  const double bw = static_cast<double>(probe_bytes_) / std::max(transfer, 1e-9);
  double smoothed_bw = 0, smoothed_lat = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& b = bandwidth_[static_cast<size_t>(peer)];
    auto& l = latency_[static_cast<size_t>(peer)];
    b = smooth(b, bw);
    l = smooth(l, seconds_small / 2);
    smoothed_bw = b;
    smoothed_lat = l;
  }
  if (metrics_ == nullptr) return;
  const Labels labels{{"peer", std::to_string(peer)}};
  metrics_->set_gauge("taiji_link_probe_bandwidth_bytes_per_second", labels, smoothed_bw,
                      "Bandwidth to a peer from background probes (smoothed).");
  metrics_->set_gauge("taiji_link_probe_latency_seconds", labels, smoothed_lat,
                      "One-way latency to a peer from background probes (smoothed).");
  metrics_->set_gauge("taiji_link_probe_bytes_sent", {}, static_cast<double>(bytes_sent()),
                      "Payload bytes sent by background link probes.");
}

void LinkProber::link_down(int src, bool, const Status&) {
  gone_[static_cast<size_t>(src)] = true;
  if (src == target_) target_ = -1;
}

std::vector<double> LinkProber::bandwidth_row() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bandwidth_;
}

std::vector<double> LinkProber::latency_row() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latency_;
}

uint64_t LinkProber::bytes_sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_sent_;
}

}  // namespace taiji
