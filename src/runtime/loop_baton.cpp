#include "runtime/loop_baton.h"

#include <algorithm>
#include <chrono>

#include "runtime/progress.h"

namespace taiji {

namespace {
// The longest park while waiters keep the loop: the most an op posted but not waited on
// can wait for the I/O thread to take the loop back.
constexpr uint64_t kParkMaxNs = 1000000;

thread_local DeferredCallbacks* t_deferred = nullptr;
}  // namespace

void call_user_callback(std::function<void()> fn) {
  if (t_deferred != nullptr) {
    t_deferred->push_back(std::move(fn));
  } else {
    fn();
  }
}

DeferUserCallbacks::DeferUserCallbacks(DeferredCallbacks* to) : outer_(t_deferred) { t_deferred = to; }
DeferUserCallbacks::~DeferUserCallbacks() { t_deferred = outer_; }

bool LoopBaton::wait_by_driving(const std::atomic<bool>& done, uint64_t window_ns,
                                uint64_t hard_ns) {
  wanting_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t ask_until = std::min(progress_now_ns() + window_ns, hard_ns);
  bool drove = false;
  while (!done.load(std::memory_order_acquire)) {
    int lent = kLent;
    if (state_.compare_exchange_strong(lent, kDriven, std::memory_order_acquire)) {
      const bool left = driver_->drive(done, window_ns, hard_ns);
      const bool owed = driver_->owes_io_thread();
      drove = true;
      // Before the give-back: an I/O thread taking the loop back must not lend it again
      // to a waiter that has stopped asking.
      wanting_.fetch_sub(1, std::memory_order_relaxed);
      state_.store(owed ? kReturning : kLent, std::memory_order_release);
      if (left || owed) wake_io();
      break;
    }
    if (lent == kClosed || progress_now_ns() >= ask_until) break;
    progress_pause();
  }
  if (!drove) wanting_.fetch_sub(1, std::memory_order_relaxed);
  return done.load(std::memory_order_acquire);
}

void LoopBaton::wake_io() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    woken_ = true;
  }
  cv_.notify_one();
}

void LoopBaton::lend_and_park() {
  state_.store(kLent, std::memory_order_release);
  uint64_t park_ns = park_min_ns_;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait_for(lock, std::chrono::nanoseconds(park_ns), [this] { return woken_; });
    woken_ = false;
    int back = kReturning;
    if (state_.compare_exchange_strong(back, kIo, std::memory_order_acq_rel)) return;
    int lent = kLent;
    if (state_.compare_exchange_strong(lent, kIo, std::memory_order_acq_rel)) return;
    // A waiter runs the loop: it makes progress for everyone, so look again later.
    park_ns = std::min(park_ns * 2, std::max(kParkMaxNs, park_min_ns_));
  }
}

}  // namespace taiji
