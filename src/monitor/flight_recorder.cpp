#include "monitor/flight_recorder.h"

#include <algorithm>

#include "monitor/metric_names.h"
#include "monitor/text_format.h"

namespace taiji {

namespace {

double seconds(uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

}  // namespace

FlightEntry* FlightRecorder::begin() {
  if (ring_.empty()) return nullptr;
  FlightEntry& e = ring_[(next_seq_ - 1) % ring_.size()];
  e.seq = next_seq_++;
  e.ended_ns = 0;
  e.code = 0;
  e.failed = false;
  e.error.clear();
  return &e;
}

FlightEntry* FlightRecorder::find(uint64_t seq) {
  if (ring_.empty() || seq == 0) return nullptr;
  FlightEntry& e = ring_[(seq - 1) % ring_.size()];
  return e.seq == seq ? &e : nullptr;
}

void FlightRecorder::append_json(std::string& out, int rank, const std::string& reason,
                                 uint64_t now_ns) const {
  out += "{\"schema_version\":1,\"rank\":";
  out += std::to_string(rank);
  out += ",\"capacity\":";
  out += std::to_string(ring_.size());
  out += ",\"reason\":";
  append_json_string(out, reason);
  out += ",\"ops\":[";
  bool first = true;
  const size_t n = ring_.size();
  // Oldest first: the slot after the newest one, around the ring.
  for (size_t k = 0; k < n; ++k) {
    const FlightEntry& e = ring_[((next_seq_ - 1) + k) % n];
    if (e.seq == 0) continue;
    if (!first) out.push_back(',');
    first = false;
    const bool running = e.ended_ns == 0;
    const char* state = e.failed ? (running ? "failing" : "failed") : (running ? "running" : "ok");
    out += "{\"seq\":";
    out += std::to_string(e.seq);
    out += ",\"name\":";
    append_json_string(out, e.name);
    out += ",\"version\":";
    append_json_number(out, e.version);
    out += ",\"kind\":\"";
    out += op_kind_label(e.kind);
    out += "\",\"bytes\":";
    append_json_number(out, e.bytes);
    out += ",\"strategy\":";
    append_json_string(out, e.strategy);
    out += ",\"state\":\"";
    out += state;
    out += "\",\"status\":\"";
    out += status_label(e.code);
    out += "\",\"error\":";
    append_json_string(out, e.error);
    out += ",\"start_unix_us\":";
    append_json_number(out, e.wall_us);
    out += ",\"queued_seconds\":";
    append_json_number(out, seconds(e.started_ns - std::min(e.posted_ns, e.started_ns)));
    out += ",\"run_seconds\":";
    append_json_number(out, seconds((running ? now_ns : e.ended_ns) - e.started_ns));
    out += '}';
  }
  out += "]}";
}

}  // namespace taiji
