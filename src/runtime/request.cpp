#include "runtime/request.h"

#include <chrono>

#include "runtime/progress.h"

namespace taiji {

void RequestState::complete(const Status& status) {
  Callback cb;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    status_ = status;
    done_flag_.store(true, std::memory_order_release);
    cb = std::move(callback_);
  }
  cv_.notify_all();
  if (cb) cb(status);
}

bool RequestState::test(Status* out) const {
  // Polling callers ask often; an op still running costs them no lock.
  if (!done_flag_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (out != nullptr) *out = status_;
  return true;
}

void RequestState::spin(int64_t timeout_ms) const {
  // Per thread: whether spinning pays depends on what this thread waits for.
  thread_local SpinWindow window;
  if (window.max_ns() != spin_ns_) window = SpinWindow(spin_ns_);
  uint64_t limit = window.ns();
  if (timeout_ms >= 0 && static_cast<uint64_t>(timeout_ms) <= limit / 1000000) {
    limit = static_cast<uint64_t>(timeout_ms) * 1000000;
  }
  const uint64_t deadline = progress_now_ns() + limit;
  while (!done_flag_.load(std::memory_order_acquire)) {
    // A polling I/O thread delivers the completion within microseconds anyway; a second
    // spinner would only take its core.
    if (io_polling_ && io_polling_->load(std::memory_order_relaxed)) return;
    if (progress_now_ns() >= deadline) {
      window.missed();
      return;
    }
    progress_pause();
  }
  window.paid();
}

bool RequestState::wait_for(int64_t timeout_ms, Status* out) const {
  if (spin_ns_ > 0 && timeout_ms != 0) spin(timeout_ms);
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
