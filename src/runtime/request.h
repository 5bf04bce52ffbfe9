// The state behind a taiji_request_t: completed once by the I/O thread, waited on by
// any number of caller threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

#include "common/status.h"

namespace taiji {

class RequestState {
 public:
  using Callback = std::function<void(const Status&)>;

  RequestState(uint64_t version, Callback callback)
      : version_(version), callback_(std::move(callback)) {}

  // First call wins; wakes waiters, then runs the callback (on the calling thread).
  void complete(const Status& status);
  // True once completed; *out gets the final status.
  bool test(Status* out) const;
  // Waits up to timeout_ms (negative: no limit); true if completed.
  bool wait_for(int64_t timeout_ms, Status* out) const;
  uint64_t version() const { return version_; }
  // The final status's message once completed, "" before; stable from then on.
  const char* error_text() const;
  // Digest of the graphs the op runs on (0 until it started).
  uint64_t topology_digest() const { return topology_digest_; }
  void set_topology_digest(uint64_t d) { topology_digest_ = d; }

 private:
  const uint64_t version_;
  std::atomic<uint64_t> topology_digest_{0};
  Callback callback_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

}  // namespace taiji
