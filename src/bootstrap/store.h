// The key/value store that bootstrap and membership coordinate through, as its clients see
// it. The embedded rendezvous server (bootstrap/rendezvous.h) is one backend; another (an
// etcd client, say) implements the same calls with the same meaning.
//
// Every call blocks its thread until answered or until its timeout_ms passes, so a
// loop-driven caller runs them off its loop. A key that was never set and a deleted key are
// both "absent" (std::nullopt below).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace taiji {

inline constexpr uint32_t kRendezvousMaxKey = 1024;
inline constexpr uint32_t kRendezvousMaxValue = 64 * 1024;
inline constexpr uint64_t kRendezvousMaxStoreBytes = 64 << 20;

// Why a key or value exceeds the bounds above (empty when both fit): the same words from
// every backend.
inline std::string store_bounds_error(const std::string& key, size_t value_size) {
  if (key.size() <= kRendezvousMaxKey && value_size <= kRendezvousMaxValue) return "";
  return "key is " + std::to_string(key.size()) + " bytes (max " + std::to_string(kRendezvousMaxKey) +
         "), value " + std::to_string(value_size) + " bytes (max " + std::to_string(kRendezvousMaxValue) + ")";
}

struct CasResult {
  bool swapped = false;
  std::optional<std::string> current;  // the value after the call
};

class Store {
 public:
  virtual ~Store() = default;

  // Sets the key.
  virtual Status set(const std::string& key, const std::string& value, int64_t timeout_ms) = 0;
  // Blocks until the key is present (Code::Timeout naming the key past timeout_ms).
  virtual Result<std::string> get(const std::string& key, int64_t timeout_ms) = 0;
  // Adds `delta` to the counter at `key` (absent: 0) and returns the new value. The
  // counter is stored as decimal text, so get() reads it; a value that is not one, or a
  // sum that overflows, is Code::InvalidArgument and leaves the key as it was.
  virtual Result<int64_t> add(const std::string& key, int64_t delta, int64_t timeout_ms) = 0;
  // Sets the key to `value` only if it now holds `expected` (std::nullopt: only if absent),
  // as one step no other client's change can come between.
  virtual Result<CasResult> compare_and_set(const std::string& key,
                                            const std::optional<std::string>& expected,
                                            const std::string& value, int64_t timeout_ms) = 0;
  // Deletes the key; returns whether it was present.
  virtual Result<bool> remove(const std::string& key, int64_t timeout_ms) = 0;
  // Blocks until the key no longer holds `known` (std::nullopt: until it is present) and
  // returns what it holds then: the new value, or std::nullopt when it was deleted. Passing
  // what an earlier call returned misses no change in between. Code::Timeout past timeout_ms.
  virtual Result<std::optional<std::string>> watch(const std::string& key,
                                                   const std::optional<std::string>& known,
                                                   int64_t timeout_ms) = 0;
};

}  // namespace taiji
