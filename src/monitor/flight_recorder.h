// The flight recorder: a ring of the last N ops this peer ran (name, version, kind, size,
// strategy, timings, state), kept so that an op that hangs or fails can be seen next to
// what ran before it. Entries are written when an op starts and updated when it fails or
// ends; an entry whose slot was reused by a newer op is left alone. Not thread-safe: its
// owner (Metrics) holds a lock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace taiji {

struct FlightEntry {
  uint64_t seq = 0;            // 1, 2, ...: order of start on this peer; 0: empty slot
  std::string name;
  uint64_t version = 0;
  uint8_t kind = 0;            // OpKind value
  uint64_t bytes = 0;
  std::string strategy;
  uint64_t wall_us = 0;        // Unix time the op started here, in microseconds
  uint64_t posted_ns = 0;      // steady clock
  uint64_t started_ns = 0;
  uint64_t ended_ns = 0;       // 0 while running
  int32_t code = 0;            // status code (taiji_status_t) once failed or ended
  bool failed = false;
  std::string error;
};

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity) : ring_(capacity) {}

  size_t capacity() const { return ring_.size(); }
  // Takes the next slot (the oldest entry) for a new op; nullptr when the capacity is 0.
  FlightEntry* begin();
  // The entry of seq, or nullptr once its slot was reused.
  FlightEntry* find(uint64_t seq);
  // {"schema_version":1,"capacity":N,"rank":R,"reason":...,"ops":[oldest .. newest]};
  // times in the entries are relative to now_ns (steady clock).
  void append_json(std::string& out, int rank, const std::string& reason, uint64_t now_ns) const;

 private:
  std::vector<FlightEntry> ring_;
  uint64_t next_seq_ = 1;
};

}  // namespace taiji
