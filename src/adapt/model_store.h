// The model store: each peer keeps the last few versions of the models its user saved,
// by name, so that any other rank can fetch one without this peer's caller taking part
// (asynchronous pair averaging reads a random peer's latest model this way). A pure
// container: the runtime serves it (runtime/model_service.h).
//
// Saves come from caller threads and lookups from the I/O thread, so every call locks.
// A version is handed out as a shared, immutable blob: one that is evicted while it is
// still being sent stays alive until the last holder lets go of it, and the bytes counted
// against the bound are the kept versions' only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace taiji {

using ModelBlob = std::shared_ptr<const std::vector<uint8_t>>;

struct ModelVersion {
  uint64_t version = 0;
  ModelBlob bytes;
};

class ModelStore {
 public:
  // keep: versions kept per name (>= 1); max_bytes: bound on all kept versions together.
  ModelStore(uint64_t keep, uint64_t max_bytes) : keep_(keep < 1 ? 1 : keep), max_bytes_(max_bytes) {}

  // Copies bytes into the store as `version` (0: the latest kept + 1, or 1 for a new name);
  // an explicit version must be above the latest kept one (StaleVersion). Evicts the
  // oldest beyond keep. A save that would hold more than max_bytes fails with NoMemory,
  // counting the version it would evict as freed, and changes nothing.
  Result<uint64_t> save(const std::string& name, const void* data, uint64_t bytes, uint64_t version);
  // The version asked for (0: the latest); NotFound names what is kept instead.
  Result<ModelVersion> find(const std::string& name, uint64_t version) const;

  uint64_t bytes_held() const;
  uint64_t keep() const { return keep_; }
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  const uint64_t keep_;
  const uint64_t max_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, std::vector<ModelVersion>> models_;  // under mu_: oldest first
  uint64_t held_ = 0;                                        // under mu_
};

}  // namespace taiji
