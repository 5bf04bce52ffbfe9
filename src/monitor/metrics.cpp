#include "monitor/metrics.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/time_limit.h"
#include "monitor/step_rules.h"
#include "monitor/text_format.h"

namespace taiji {

namespace {

constexpr uint64_t kLinkSampleNs = 1'000'000'000;
// Time constant of the throughput smoothing: a change shows half-way after about 3.5 s.
constexpr double kThroughputTauSeconds = 5.0;

uint64_t unix_us() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

uint64_t monotonic_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void Metrics::OpStats::add(uint64_t bytes_, bool failed, uint64_t ns) {
  count++;
  if (failed) errors++;
  bytes += bytes_;
  latency.add(ns);
}

Metrics::Metrics(int rank, int size, size_t flight_capacity, size_t max_names)
    : rank_(rank),
      size_(size),
      max_names_(max_names),
      created_ns_(monotonic_ns()),
      links_(new LinkCounters[static_cast<size_t>(size)]),
      kinds_(kOpKindLabels),
      flight_(flight_capacity),
      link_state_(static_cast<size_t>(size)) {
  steps_.last.assign(static_cast<size_t>(size), 0);
  steps_.straggler.assign(static_cast<size_t>(size), false);
  steps_.straggler_steps.assign(static_cast<size_t>(size), 0);
}

uint64_t Metrics::op_started(const OpStart& s) {
  if (!enabled()) return 0;
  const uint64_t wall = unix_us();
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry* e = flight_.begin();
  if (e == nullptr) return UINT64_MAX;  // counted at the end, nothing recorded
  e->name = *s.name;
  e->version = s.version;
  e->kind = s.kind;
  e->bytes = s.bytes;
  e->strategy = s.strategy != nullptr ? *s.strategy : std::string();
  e->wall_us = wall;
  e->started_ns = s.started_ns;
  e->posted_ns = s.posted_ns != 0 ? s.posted_ns : s.started_ns;
  return e->seq;
}

void Metrics::op_failed(uint64_t token, int32_t code, const std::string& why) {
  if (token == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (FlightEntry* e = flight_.find(token)) {
    e->failed = true;
    e->code = code;
    e->error = why;
  }
}

void Metrics::op_ended(uint64_t token, const OpStart& s, int32_t code, const std::string& why,
                       uint64_t ended_ns) {
  if (token == 0) return;
  const uint64_t posted = s.posted_ns != 0 ? s.posted_ns : s.started_ns;
  const uint64_t latency = ended_ns > posted ? ended_ns - posted : 0;
  const bool failed = code != 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (FlightEntry* e = flight_.find(token)) {
    e->ended_ns = std::max(ended_ns, e->started_ns);
    e->code = code;
    e->failed = failed;
    if (failed && e->error.empty()) e->error = why;
  }
  kinds_[s.kind < kinds_.size() ? s.kind : 0].add(s.bytes, failed, latency);
  auto it = names_.find(*s.name);
  if (it == names_.end() && names_.size() < max_names_) {
    it = names_.emplace(*s.name, NameStats{}).first;
    it->second.kind = s.kind;
  }
  (it != names_.end() ? it->second : other_).stats.add(s.bytes, failed, latency);
}

double Metrics::mean_send_rate() const {
  std::lock_guard<std::mutex> lock(mu_);
  double sum = 0;
  for (size_t r = 0; r < link_state_.size(); ++r) {
    if (static_cast<int>(r) != rank_) sum += link_state_[r].send_rate;
  }
  return size_ > 1 ? sum / (size_ - 1) : 0;
}

void Metrics::sample_links(uint64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (link_sampled_ns_ == 0) {
    link_sampled_ns_ = now_ns;
    return;
  }
  if (now_ns < link_sampled_ns_ + kLinkSampleNs) return;
  const double dt = static_cast<double>(now_ns - link_sampled_ns_) * 1e-9;
  link_sampled_ns_ = now_ns;
  // Exponential smoothing scaled by the real interval, so a late sample weighs more.
  const double alpha = 1.0 - std::exp(-dt / kThroughputTauSeconds);
  for (size_t r = 0; r < link_state_.size(); ++r) {
    Link& l = link_state_[r];
    const uint64_t sent = links_[r].sent.load(std::memory_order_relaxed);
    const uint64_t received = links_[r].received.load(std::memory_order_relaxed);
    l.send_rate += alpha * (static_cast<double>(sent - l.sampled_sent) / dt - l.send_rate);
    l.receive_rate += alpha * (static_cast<double>(received - l.sampled_received) / dt - l.receive_rate);
    l.sampled_sent = sent;
    l.sampled_received = received;
  }
}

uint32_t Metrics::rtt_begin() {
  std::lock_guard<std::mutex> lock(mu_);
  rtt_sent_ns_ = 0;
  return ++rtt_round_;
}

void Metrics::rtt_sending(uint32_t round, uint64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (round == rtt_round_) rtt_sent_ns_ = now_ns;
}

void Metrics::rtt_reply(int peer, uint32_t round, uint64_t now_ns) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Only the latest round is timed: an older round's send time is gone.
    if (peer < 0 || peer >= size_ || round != rtt_round_ || rtt_sent_ns_ == 0) return;
    Link& l = link_state_[static_cast<size_t>(peer)];
    if (l.rtt_round == round) return;
    l.rtt_round = round;
    l.rtt_ns = now_ns > rtt_sent_ns_ ? now_ns - rtt_sent_ns_ : 0;
    l.rtt_min_ns = l.rtt_probes == 0 ? l.rtt_ns : std::min(l.rtt_min_ns, l.rtt_ns);
    l.rtt_probes++;
  }
  rtt_cv_.notify_all();
}

Status Metrics::rtt_wait(uint32_t round, const std::vector<int>& peers, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  auto silent = [&] {
    std::vector<int> out;
    for (int p : peers) {
      if (link_state_[static_cast<size_t>(p)].rtt_round != round) out.push_back(p);
    }
    return out;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(clamp_timeout_ms(timeout_ms));
  rtt_cv_.wait_until(lock, deadline, [&] { return silent().empty() || rtt_round_ != round; });
  if (rtt_round_ != round) return {Code::Aborted, "a newer round-trip probe replaced this one"};
  std::vector<int> missing = silent();
  if (missing.empty()) return {};
  std::string list;
  for (int p : missing) list += (list.empty() ? "" : " ") + std::to_string(p);
  return {Code::Timeout, "round-trip probe: no reply within " + std::to_string(timeout_ms) +
                             " ms from rank(s) " + list};
}

double Metrics::step_end(uint64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t last = step_clock_ns_;
  step_clock_ns_ = now_ns;
  return last == 0 ? -1.0 : static_cast<double>(now_ns - last) * 1e-9;
}

void Metrics::step_restart(uint64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  step_clock_ns_ = now_ns;
}

void Metrics::record_step(const std::vector<double>& seconds) {
  if (seconds.size() != static_cast<size_t>(size_)) return;
  for (double s : seconds) {
    if (!(s >= 0)) return;
  }
  const double median = median_of(seconds);
  std::lock_guard<std::mutex> lock(mu_);
  steps_.count++;
  steps_.median = median;
  steps_.last = seconds;
  for (size_t r = 0; r < seconds.size(); ++r) {
    const bool slow = is_straggler(seconds[r], median, kStragglerRatio);
    steps_.straggler[r] = slow;
    if (slow) steps_.straggler_steps[r]++;
  }
}

bool Metrics::set_gauge(const std::string& name, const Labels& labels, double value,
                        const std::string& help) {
  if (!valid_metric_name(name)) return false;
  std::string key = name;
  for (const auto& [k, v] : labels) {
    if (!valid_metric_name(k, false) || k == "rank" || k.rfind("__", 0) == 0) return false;
    key += '\0' + k + '\0' + v;
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Gauges per op name (the variance of each gradient) are bounded like the per-name
  // counters: past the cap a new one is dropped.
  if (gauges_.size() >= max_names_ + kFixedGauges && gauges_.count(key) == 0) return false;
  Gauge& g = gauges_[key];
  if (g.name.empty()) {
    g.name = name;
    g.labels = labels;
  }
  if (!help.empty()) g.help = help;
  g.value = value;
  return true;
}

std::string Metrics::flight_json(const std::string& reason) const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  flight_.append_json(out, rank_, reason, monotonic_ns());
  return out;
}

void Metrics::count_dump() {
  std::lock_guard<std::mutex> lock(mu_);
  dumps_++;
}

}  // namespace taiji
