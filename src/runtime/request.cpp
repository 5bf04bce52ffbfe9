#include "runtime/request.h"

#include <algorithm>
#include <chrono>

#include "common/time_limit.h"
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

void RequestState::spin(uint64_t now_ns, uint64_t hard_ns) const {
  // Per thread: whether spinning pays depends on what this thread waits for.
  thread_local SpinWindow window;
  if (window.max_ns() != spin_ns_) window = SpinWindow(spin_ns_);
  const uint64_t limit = std::min(window.ns(), hard_ns - now_ns);
  bool done;
  if (baton_) {
    done = baton_->wait_by_driving(done_flag_, limit, hard_ns);
  } else {
    const uint64_t deadline = now_ns + limit;
    while (!(done = done_flag_.load(std::memory_order_acquire)) && progress_now_ns() < deadline) {
      progress_pause();
    }
  }
  if (done) {
    window.paid();
  } else {
    window.missed();
  }
}

bool RequestState::wait_for(int64_t timeout_ms, Status* out) const {
  // One deadline for the spin (or the loop a waiter runs, which may go on while it makes
  // progress) and the sleep after it.
  const bool limited = timeout_ms >= 0 && timeout_ms <= kMaxTimeoutMs;
  const uint64_t now = progress_now_ns();
  const uint64_t deadline = limited ? now + static_cast<uint64_t>(timeout_ms) * 1000000 : UINT64_MAX;
  if (spin_ns_ > 0 && timeout_ms != 0) spin(now, deadline);
  std::unique_lock<std::mutex> lock(mu_);
  if (!limited) {
    cv_.wait(lock, [this] { return done_; });
  } else if (!cv_.wait_until(lock, std::chrono::steady_clock::time_point(std::chrono::nanoseconds(deadline)),
                             [this] { return done_; })) {
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
