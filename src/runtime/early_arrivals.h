// The early-arrival pool: what peers sent for an op this peer has not started yet (Ready
// frames, data chunks, an Abort), held by (name, version) until the op starts and claims
// it, or until it can never be claimed. Held bytes are bounded: past the cap, reads from
// the sender pause until enough is claimed or dropped. Runs on the peer's I/O thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "monitor/metrics.h"
#include "transport/frame.h"

namespace taiji {

struct EarlyArrivalOptions {
  int size = 1;
  // Bytes held past which reads from a sender pause.
  uint64_t cap_bytes = 64ull << 20;
  // The largest early payload accepted at all (a larger one is refused before it is
  // allocated).
  uint64_t max_payload = 64ull << 20;
  Metrics* metrics = nullptr;  // the high-water mark and pause counts; nullptr: none
  std::function<void(int)> pause_reading;
  std::function<void(int)> resume_reading;
};

class EarlyArrivals {
 public:
  using Key = std::pair<std::string, uint64_t>;
  struct Data {
    FrameHeader header;
    std::vector<uint8_t> payload;
    bool complete = false;
  };
  // What a starting op takes: every Ready and every data frame already in. Frames still
  // arriving stay; complete() hands them over.
  struct Claimed {
    std::vector<FrameHeader> readies;
    std::vector<std::unique_ptr<Data>> data;
  };

  explicit EarlyArrivals(EarlyArrivalOptions options);

  bool holds(const Key& key) const { return held_.count(key) != 0; }
  uint64_t bytes() const { return bytes_; }
  // The Abort a peer sent for key; ok when none.
  Status abort_for(const Key& key) const;

  void hold_ready(int src, const Key& key, const FrameHeader& h);
  // Replaces an earlier Abort for key.
  void hold_abort(int src, const Key& key, const Status& why);
  // A data frame for key begins: *target is where its payload goes.
  Status begin_data(int src, const Key& key, const FrameHeader& h, uint8_t** target);
  // Whether src's frame in progress is one begin_data took.
  bool arriving(int src) const { return rx_[src] != nullptr; }
  // src's early frame (arriving(src)) is in. keep: it stays held (its op has not started),
  // and reads from src pause past the cap; else it is handed back and its bytes released.
  std::unique_ptr<Data> complete(int src, const Key& key, bool keep);
  Claimed claim(const Key& key);

  // Drops what is held for key (but payloads still being read), releasing its bytes.
  void discard(const Key& key);
  // The same for every key pred holds true for.
  void discard_if(const std::function<bool(const Key&)>& pred);
  // The frame src was sending when its link went down: dropped, its bytes released.
  void drop_partial(int src);
  // No frame arrives any more (every link closed): what was in progress stays as it is.
  void abandon_partials();

 private:
  struct Entry {
    std::vector<FrameHeader> readies;
    std::vector<std::unique_ptr<Data>> data;
    Status abort;
  };
  // Counts bytes held; past the cap, reads from src pause (call only between frames: a
  // pause inside one would stop the very payload that frees the bytes).
  void charge(int src, uint64_t bytes);
  // Counts bytes held (and their high-water mark in the metrics), pausing nothing.
  void hold_bytes(uint64_t bytes);
  void release(uint64_t bytes);
  // Takes item out of entry e's list (dropping the entry once it holds nothing) and
  // releases its bytes; null if the list does not hold it.
  std::unique_ptr<Data> unlink(std::map<Key, Entry>::iterator e, const Data* item);

  EarlyArrivalOptions opt_;
  std::map<Key, Entry> held_;
  std::vector<Data*> rx_;  // per source: the early frame being received
  std::set<int> paused_;
  uint64_t bytes_ = 0;
};

}  // namespace taiji
