// Per-name version bookkeeping, shared by caller threads (posting) and the I/O thread
// (matching arrivals). The automatic version of a name is one past the highest version
// posted under it, so the n-th call with a name is version n on every peer.
#pragma once

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "common/status.h"

namespace taiji {

class NameTable {
 public:
  // Reserves (name, version) for a new op; version 0 picks the automatic one.
  // Duplicate: in flight already. StaleVersion: at or below the highest version of the
  // name that already ended.
  Result<uint64_t> reserve(const std::string& name, uint64_t version);
  // The op ended, successfully or not.
  void release(const std::string& name, uint64_t version);
  // The post failed before the op was handed over: as if it had never been reserved, so
  // that a retry gets the same version (the other peers' n-th call is version n).
  void unreserve(const std::string& name, uint64_t version);
  // A message for (name, version) concerns an op that ended here and is not in flight.
  bool is_past(const std::string& name, uint64_t version) const;
  // This peer has posted (name, version): it is in flight or ended (or was skipped over).
  bool posted(const std::string& name, uint64_t version) const;

 private:
  struct Entry {
    uint64_t last_posted = 0;
    uint64_t ended_max = 0;
    std::set<uint64_t> in_flight;
  };
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> names_;
};

}  // namespace taiji
