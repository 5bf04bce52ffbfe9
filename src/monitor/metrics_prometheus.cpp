// The Prometheus text exposition format (version 0.0.4): every family has its # HELP and
// # TYPE lines, names carry the taiji_ prefix and base units (_seconds, _bytes, _total
// for counters), histograms are _bucket{le=...} (cumulative, ending at +Inf), _sum and
// _count, and every sample has the rank label.
#include "monitor/metrics.h"
#include "monitor/text_format.h"

namespace taiji {

namespace {

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  // HELP text escapes backslash and newline.
  for (const char* c = help; *c != '\0'; ++c) {
    if (*c == '\\') {
      out += "\\\\";
    } else if (*c == '\n') {
      out += "\\n";
    } else {
      out += *c;
    }
  }
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

// name{rank="R",<extra>} — `extra` is already formatted ("" or `k="v"` pairs).
void sample_start(std::string& out, const char* name, const char* suffix, const std::string& rank,
                  const std::string& extra) {
  out += name;
  out += suffix;
  out += "{rank=";
  out += rank;
  if (!extra.empty()) {
    out += ',';
    out += extra;
  }
  out += "} ";
}

template <typename V>
void sample(std::string& out, const char* name, const std::string& rank, const std::string& extra,
            V value) {
  sample_start(out, name, "", rank, extra);
  append_sample_value(out, value);
  out += '\n';
}

void histogram(std::string& out, const char* name, const std::string& rank, const std::string& extra,
               const LatencyHistogram& h) {
  uint64_t cumulative = 0;
  for (int i = 0; i < LatencyHistogram::kBuckets; ++i) {
    cumulative += h.bucket(i);
    std::string le = extra.empty() ? "le=" : extra + ",le=";
    std::string bound;
    if (i < LatencyHistogram::kFinite) {
      append_sample_value(bound, LatencyHistogram::bound_seconds(i));
    } else {
      bound = "+Inf";
    }
    append_label_value(le, bound);
    sample_start(out, name, "_bucket", rank, le);
    append_sample_value(out, cumulative);
    out += '\n';
  }
  sample_start(out, name, "_sum", rank, extra);
  append_sample_value(out, h.sum_seconds());
  out += '\n';
  sample_start(out, name, "_count", rank, extra);
  append_sample_value(out, h.count());
  out += '\n';
}

std::string label(const char* k, const std::string& v) {
  std::string out = k;
  out += '=';
  append_label_value(out, v);
  return out;
}

}  // namespace

void Metrics::append_prometheus_ops(std::string& out, const std::string& rank, const View& v) const {
  std::vector<std::string> kind_labels;
  for (size_t k = 0; k < v.kinds.size(); ++k) {
    kind_labels.push_back(label("kind", op_kind_label(static_cast<uint8_t>(k))));
  }
  family(out, "taiji_ops_total", "counter", "Ops ended on this peer, by kind (failed ones included).");
  for (size_t k = 1; k < v.kinds.size(); ++k) sample(out, "taiji_ops_total", rank, kind_labels[k], v.kinds[k].count);
  family(out, "taiji_op_errors_total", "counter", "Ops that ended with an error, by kind.");
  for (size_t k = 1; k < v.kinds.size(); ++k) sample(out, "taiji_op_errors_total", rank, kind_labels[k], v.kinds[k].errors);
  family(out, "taiji_op_bytes_total", "counter", "Bytes of the ops' buffers (count times element size), by kind.");
  for (size_t k = 1; k < v.kinds.size(); ++k) sample(out, "taiji_op_bytes_total", rank, kind_labels[k], v.kinds[k].bytes);
  family(out, "taiji_op_duration_seconds", "histogram", "Time from posting an op to its end, by kind.");
  for (size_t k = 1; k < v.kinds.size(); ++k) histogram(out, "taiji_op_duration_seconds", rank, kind_labels[k], v.kinds[k].latency);

  std::vector<std::string> name_labels;
  for (const auto& [name, n] : v.names) name_labels.push_back(label("name", name));
  const bool other = v.other.stats.count > 0;
  if (other) name_labels.push_back(label("name", kOtherName));
  auto each_name = [&](auto fn) {
    for (size_t i = 0; i < v.names.size(); ++i) fn(name_labels[i], v.names[i].second.stats);
    if (other) fn(name_labels.back(), v.other.stats);
  };
  family(out, "taiji_named_ops_total", "counter", "Ops ended on this peer, by op name (names beyond the cap as \"taiji.other\").");
  each_name([&](const std::string& l, const OpStats& s) { sample(out, "taiji_named_ops_total", rank, l, s.count); });
  family(out, "taiji_named_op_errors_total", "counter", "Ops that ended with an error, by op name.");
  each_name([&](const std::string& l, const OpStats& s) { sample(out, "taiji_named_op_errors_total", rank, l, s.errors); });
  family(out, "taiji_named_op_bytes_total", "counter", "Bytes of the ops' buffers, by op name.");
  each_name([&](const std::string& l, const OpStats& s) { sample(out, "taiji_named_op_bytes_total", rank, l, s.bytes); });
  family(out, "taiji_named_op_duration_seconds", "histogram", "Time from posting an op to its end, by op name.");
  each_name([&](const std::string& l, const OpStats& s) { histogram(out, "taiji_named_op_duration_seconds", rank, l, s.latency); });
}

void Metrics::append_prometheus_rest(std::string& out, const std::string& rank, const View& v) const {
  std::vector<std::string> peers;
  for (size_t r = 0; r < v.links.size(); ++r) peers.push_back(label("peer", std::to_string(r)));
  const size_t me = static_cast<size_t>(rank_);
  auto each_link = [&](auto fn) {
    for (size_t r = 0; r < v.links.size(); ++r) {
      if (r != me) fn(peers[r], v.links[r]);
    }
  };
  family(out, "taiji_link_sent_bytes_total", "counter", "Bytes this peer handed to the link to a peer.");
  each_link([&](const std::string& l, const LinkView& k) { sample(out, "taiji_link_sent_bytes_total", rank, l, k.sent); });
  family(out, "taiji_link_received_bytes_total", "counter", "Bytes this peer read from the link to a peer.");
  each_link([&](const std::string& l, const LinkView& k) { sample(out, "taiji_link_received_bytes_total", rank, l, k.received); });
  family(out, "taiji_link_send_throughput_bytes_per_second", "gauge", "Smoothed send rate to a peer (5 s time constant).");
  each_link([&](const std::string& l, const LinkView& k) { sample(out, "taiji_link_send_throughput_bytes_per_second", rank, l, k.state.send_rate); });
  family(out, "taiji_link_receive_throughput_bytes_per_second", "gauge", "Smoothed receive rate from a peer (5 s time constant).");
  each_link([&](const std::string& l, const LinkView& k) { sample(out, "taiji_link_receive_throughput_bytes_per_second", rank, l, k.state.receive_rate); });
  family(out, "taiji_link_rtt_seconds", "gauge", "Round-trip time to a peer measured by the latest probe.");
  each_link([&](const std::string& l, const LinkView& k) {
    if (k.state.rtt_probes > 0) sample(out, "taiji_link_rtt_seconds", rank, l, static_cast<double>(k.state.rtt_ns) * 1e-9);
  });
  family(out, "taiji_link_rtt_probes_total", "counter", "Round-trip probes a peer answered.");
  each_link([&](const std::string& l, const LinkView& k) { sample(out, "taiji_link_rtt_probes_total", rank, l, k.state.rtt_probes); });
  family(out, "taiji_link_shm_sent_bytes_total", "counter", "Of the bytes sent to a peer, those that went through shared memory.");
  each_link([&](const std::string& l, const LinkView& k) { sample(out, "taiji_link_shm_sent_bytes_total", rank, l, k.shm_sent); });
  family(out, "taiji_link_read_pauses_total", "counter", "Times reads from a peer paused: the early-arrival buffer was full.");
  each_link([&](const std::string& l, const LinkView& k) { sample(out, "taiji_link_read_pauses_total", rank, l, k.read_pauses); });
  family(out, "taiji_early_arrival_bytes_max", "gauge", "Most bytes held at once for ops not posted yet (cap: TAIJI_UNEXPECTED_BYTES, past it by a frame and a mailbox at most).");
  sample(out, "taiji_early_arrival_bytes_max", rank, "", v.early_bytes_max);
  family(out, "taiji_refused_connections_total", "counter",
         "Connections refused before their handshake completed, by reason.");
  for (int r = 0; r < kRefusalReasons; ++r) {
    sample(out, "taiji_refused_connections_total", rank,
           label("reason", refusal_label(static_cast<RefusalReason>(r))), v.refused[r]);
  }

  family(out, "taiji_steps_total", "counter", "Steps marked by every rank (taiji_step_mark) and gathered.");
  sample(out, "taiji_steps_total", rank, "", v.steps.count);
  family(out, "taiji_step_median_seconds", "gauge", "Median over ranks of the latest step time.");
  sample(out, "taiji_step_median_seconds", rank, "", v.steps.median);
  family(out, "taiji_step_seconds", "gauge", "Latest step time of each rank (label peer), as gathered.");
  for (size_t r = 0; r < v.steps.last.size(); ++r) sample(out, "taiji_step_seconds", rank, peers[r], v.steps.last[r]);
  family(out, "taiji_straggler", "gauge", "1 when a rank's latest step took over 1.5 times the median.");
  for (size_t r = 0; r < v.steps.last.size(); ++r) {
    sample(out, "taiji_straggler", rank, peers[r], uint64_t{v.steps.straggler[r] ? 1u : 0u});
  }
  family(out, "taiji_straggler_steps_total", "counter", "Steps in which a rank was flagged as a straggler.");
  for (size_t r = 0; r < v.steps.last.size(); ++r) sample(out, "taiji_straggler_steps_total", rank, peers[r], v.steps.straggler_steps[r]);

  family(out, "taiji_flight_recorder_dumps_total", "counter", "Flight recorder dumps written after op timeouts.");
  sample(out, "taiji_flight_recorder_dumps_total", rank, "", v.dumps);
  family(out, "taiji_metrics_enabled", "gauge", "1 while ops are counted and recorded.");
  sample(out, "taiji_metrics_enabled", rank, "", uint64_t{v.enabled ? 1u : 0u});

  const std::string* current = nullptr;
  for (const Gauge& g : v.gauges) {
    if (current == nullptr || *current != g.name) {
      current = &g.name;
      family(out, g.name.c_str(), "gauge", g.help.empty() ? "Set by a taiji component." : g.help.c_str());
    }
    std::string extra;
    for (const auto& [k, val] : g.labels) {
      if (!extra.empty()) extra += ',';
      extra += label(k.c_str(), val);
    }
    sample(out, g.name.c_str(), rank, extra, g.value);
  }
}

std::string Metrics::prometheus() const {
  const View v = view();
  std::string rank;
  append_label_value(rank, std::to_string(rank_));
  std::string out;
  out.reserve(16384 + 4096 * v.names.size());
  append_prometheus_ops(out, rank, v);
  append_prometheus_rest(out, rank, v);
  return out;
}

}  // namespace taiji
