#include "runtime/progress.h"

#include <sched.h>

#include <chrono>

namespace taiji {

uint64_t progress_now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void progress_pause() { sched_yield(); }

}  // namespace taiji
