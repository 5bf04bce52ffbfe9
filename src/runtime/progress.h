// Adaptive progress: a thread that expects work within microseconds polls for it for a
// short window before it sleeps, because waking a sleeping thread (epoll, futex) costs
// tens of microseconds on a busy host, more than a small op's whole round trip. The
// window adapts: polling that keeps finding nothing shrinks it, so an idle peer soon
// sleeps again and gives its core back.
#pragma once

#include <algorithm>
#include <cstdint>

namespace taiji {

// Monotonic nanoseconds, cheap enough (vDSO) to read on every poll: steady_clock's, so a
// value is also a steady_clock time point.
uint64_t progress_now_ns();

// One step of a spin loop. Yields the core: with more runnable threads than cores, a
// spinner that never yields delays the very thread it waits for.
void progress_pause();

class SpinWindow {
 public:
  explicit SpinWindow(uint64_t max_ns = 0) : max_ns_(max_ns), ns_(max_ns) {}
  uint64_t ns() const { return ns_; }
  uint64_t max_ns() const { return max_ns_; }
  // The poll found work: the full window next time.
  void paid() { ns_ = max_ns_; }
  // The window ran out: halve it, down to a floor that still catches a quick reply.
  void missed() { ns_ = std::max(ns_ / 2, max_ns_ / kFloorDivisor); }

 private:
  static constexpr uint64_t kFloorDivisor = 16;
  uint64_t max_ns_;
  uint64_t ns_;
};

}  // namespace taiji
