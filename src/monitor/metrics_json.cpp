// The JSON snapshot (schema_version 1, documented in include/taiji/metrics.h).
#include <algorithm>

#include "monitor/metrics.h"
#include "monitor/text_format.h"

namespace taiji {

namespace {

void append_latency(std::string& out, const LatencyHistogram& h) {
  out += "\"latency_seconds\":{\"sum\":";
  append_json_number(out, h.sum_seconds());
  out += ",\"max\":";
  append_json_number(out, h.max_seconds());
  out += ",\"p50\":";
  append_json_number(out, h.quantile(0.5));
  out += ",\"p90\":";
  append_json_number(out, h.quantile(0.9));
  out += ",\"p99\":";
  append_json_number(out, h.quantile(0.99));
  out += '}';
}

void key(std::string& out, const char* k) {
  out += '"';
  out += k;
  out += "\":";
}

}  // namespace

Metrics::View Metrics::view() const {
  View v;
  const uint64_t now = monotonic_ns();
  std::lock_guard<std::mutex> lock(mu_);
  v.enabled = enabled();
  v.uptime_seconds = static_cast<double>(now - created_ns_) * 1e-9;
  v.kinds = kinds_;
  v.names.assign(names_.begin(), names_.end());
  v.other = other_;
  for (size_t r = 0; r < link_state_.size(); ++r) {
    v.links.push_back({links_[r].sent.load(std::memory_order_relaxed),
                       links_[r].received.load(std::memory_order_relaxed),
                       links_[r].shm_sent.load(std::memory_order_relaxed),
                       links_[r].read_pauses.load(std::memory_order_relaxed), link_state_[r]});
  }
  v.steps = steps_;
  for (const auto& [k, g] : gauges_) v.gauges.push_back(g);
  v.dumps = dumps_;
  v.early_bytes_max = early_bytes_max_.load(std::memory_order_relaxed);
  for (int r = 0; r < kRefusalReasons; ++r) v.refused[r] = refusals_.get(static_cast<RefusalReason>(r));
  v.flight_capacity = flight_.capacity();
  std::sort(v.names.begin(), v.names.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return v;
}

std::string Metrics::json() const {
  const View v = view();
  std::string out;
  out.reserve(1024 + 256 * v.names.size());
  out += "{\"schema_version\":" + std::to_string(kSchemaVersion);
  out += ",\"rank\":" + std::to_string(rank_) + ",\"size\":" + std::to_string(size_);
  out += ",\"enabled\":";
  out += v.enabled ? "true" : "false";
  out += ",\"uptime_seconds\":";
  append_json_number(out, v.uptime_seconds);

  out += ",\"ops\":{";
  for (size_t k = 1; k < v.kinds.size(); ++k) {
    const OpStats& s = v.kinds[k];
    if (k > 1) out += ',';
    key(out, op_kind_label(static_cast<uint8_t>(k)));
    out += "{\"count\":" + std::to_string(s.count) + ",\"errors\":" + std::to_string(s.errors) +
           ",\"bytes\":" + std::to_string(s.bytes) + ',';
    append_latency(out, s.latency);
    out += '}';
  }
  out += "},\"names\":[";
  auto append_name = [&](const std::string& name, const NameStats& n, bool first) {
    if (!first) out += ',';
    out += "{\"name\":";
    append_json_string(out, name);
    out += ",\"kind\":\"";
    out += op_kind_label(n.kind);
    out += "\",\"count\":" + std::to_string(n.stats.count) +
           ",\"errors\":" + std::to_string(n.stats.errors) +
           ",\"bytes\":" + std::to_string(n.stats.bytes) + ',';
    append_latency(out, n.stats.latency);
    out += '}';
  };
  bool first = true;
  for (const auto& [name, n] : v.names) {
    append_name(name, n, first);
    first = false;
  }
  if (v.other.stats.count > 0) append_name(kOtherName, v.other, first);
  out += "],\"names_cap\":" + std::to_string(max_names_);

  out += ",\"links\":[";
  first = true;
  for (size_t r = 0; r < v.links.size(); ++r) {
    if (static_cast<int>(r) == rank_) continue;
    const LinkView& l = v.links[r];
    if (!first) out += ',';
    first = false;
    out += "{\"peer\":" + std::to_string(r) + ",\"bytes_sent\":" + std::to_string(l.sent) +
           ",\"bytes_received\":" + std::to_string(l.received) + ",\"send_bytes_per_second\":";
    append_json_number(out, l.state.send_rate);
    out += ",\"receive_bytes_per_second\":";
    append_json_number(out, l.state.receive_rate);
    out += ",\"rtt_seconds\":";
    if (l.state.rtt_probes == 0) {
      out += "null,\"rtt_min_seconds\":null";
    } else {
      append_json_number(out, static_cast<double>(l.state.rtt_ns) * 1e-9);
      out += ",\"rtt_min_seconds\":";
      append_json_number(out, static_cast<double>(l.state.rtt_min_ns) * 1e-9);
    }
    out += ",\"rtt_probes\":" + std::to_string(l.state.rtt_probes) +
           ",\"shm_bytes_sent\":" + std::to_string(l.shm_sent) +
           ",\"read_pauses\":" + std::to_string(l.read_pauses) + '}';
  }
  out += "],\"early_arrival_bytes_max\":" + std::to_string(v.early_bytes_max);
  out += ",\"refused_connections\":{";
  for (int r = 0; r < kRefusalReasons; ++r) {
    if (r > 0) out += ',';
    out += std::string("\"") + refusal_label(static_cast<RefusalReason>(r)) + "\":" + std::to_string(v.refused[r]);
  }
  out += '}';

  out += ",\"steps\":{\"count\":" + std::to_string(v.steps.count) + ",\"median_seconds\":";
  append_json_number(out, v.steps.median);
  out += ",\"straggler_ratio\":";
  append_json_number(out, kStragglerRatio);
  out += ",\"ranks\":[";
  for (size_t r = 0; r < v.steps.last.size(); ++r) {
    if (r > 0) out += ',';
    out += "{\"rank\":" + std::to_string(r) + ",\"seconds\":";
    append_json_number(out, v.steps.last[r]);
    out += ",\"straggler\":";
    out += v.steps.straggler[r] ? "true" : "false";
    out += ",\"straggler_steps\":" + std::to_string(v.steps.straggler_steps[r]) + '}';
  }

  out += "]},\"gauges\":[";
  first = true;
  for (const Gauge& g : v.gauges) {
    if (!first) out += ',';
    first = false;
    out += "{\"name\":";
    append_json_string(out, g.name);
    out += ",\"labels\":{";
    for (size_t i = 0; i < g.labels.size(); ++i) {
      if (i > 0) out += ',';
      append_json_string(out, g.labels[i].first);
      out += ':';
      append_json_string(out, g.labels[i].second);
    }
    out += "},\"value\":";
    append_json_number(out, g.value);
    out += '}';
  }
  out += "],\"flight_recorder\":{\"capacity\":" + std::to_string(v.flight_capacity) +
         ",\"dumps\":" + std::to_string(v.dumps) + "}}";
  return out;
}

}  // namespace taiji
