#include "runtime/request.h"

#include <chrono>

namespace taiji {

void RequestState::complete(const Status& status) {
  Callback cb;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    status_ = status;
    cb = std::move(callback_);
  }
  cv_.notify_all();
  if (cb) cb(status);
}

bool RequestState::test(Status* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_ && out != nullptr) *out = status_;
  return done_;
}

bool RequestState::wait_for(int64_t timeout_ms, Status* out) const {
  std::unique_lock<std::mutex> lock(mu_);
  // Beyond a year is "no limit": steady_clock arithmetic would overflow.
  if (timeout_ms < 0 || timeout_ms > 365LL * 24 * 3600 * 1000) {
    cv_.wait(lock, [this] { return done_; });
  } else if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] { return done_; })) {
    return false;
  }
  if (out != nullptr) *out = status_;
  return true;
}

const char* RequestState::error_text() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ ? status_.message().c_str() : "";
}

}  // namespace taiji
