// The state behind a taiji_request_t: completed once by the thread running the peer's
// loop, waited on by any number of caller threads. A waiter may first run the loop itself
// for a short while (runtime/loop_baton.h), or spin on an atomic flag, before it sleeps
// on the condition variable (adaptive progress, runtime/progress.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "common/status.h"
#include "runtime/loop_baton.h"

namespace taiji {

class RequestState {
 public:
  using Callback = std::function<void(const Status&)>;

  RequestState(uint64_t version, Callback callback)
      : version_(version), callback_(std::move(callback)) {}

  // Before the request is shared: waiters may spend up to spin_ns (longer while the loop
  // they run makes progress) before they sleep, running the loop through baton when it is
  // lent, else spinning.
  void set_spin(uint64_t spin_ns, std::shared_ptr<LoopBaton> baton) {
    spin_ns_ = spin_ns;
    baton_ = std::move(baton);
  }

  // First call wins; wakes waiters, then runs the callback (on the calling thread).
  void complete(const Status& status);
  // True once completed; *out gets the final status.
  bool test(Status* out) const;
  // Waits up to timeout_ms (negative: no limit); true if completed.
  bool wait_for(int64_t timeout_ms, Status* out) const;
  uint64_t version() const { return version_; }
  // The final status's message once completed, "" before; stable from then on.
  const char* error_text() const;
  // Posted inside a group still open on the thread with this group_thread_token()
  // (runtime/post_groups.h): a wait there would never end. Set before the request is
  // handed out, cleared when the group ends or the peer closes.
  void hold(uint64_t holder) {
    holder_ = holder;
    held_.store(true, std::memory_order_release);
  }
  void release_hold() { held_.store(false, std::memory_order_release); }
  // Before the request is handed out: it is held whenever `inner` is (an op the caller
  // sees as one request but the runtime posted as another).
  void hold_with(const std::shared_ptr<const RequestState>& inner) { hold_with_ = inner; }
  bool held_by(uint64_t thread) const {
    if (held_.load(std::memory_order_acquire) && holder_ == thread) return true;
    auto inner = hold_with_.lock();  // gone: it completed, so it is held no longer
    return inner && inner->held_by(thread);
  }
  // Digest of the graphs the op runs on (0 until it started).
  uint64_t topology_digest() const { return topology_digest_; }
  void set_topology_digest(uint64_t d) { topology_digest_ = d; }

 private:
  // Drives or spins until done or the calling thread's adaptive window ends, never past
  // hard_ns (progress_now_ns() time; UINT64_MAX: no limit).
  void spin(uint64_t now_ns, uint64_t hard_ns) const;

  const uint64_t version_;
  uint64_t spin_ns_ = 0;
  std::shared_ptr<LoopBaton> baton_;
  std::atomic<bool> done_flag_{false};   // done_, readable without the lock
  std::atomic<uint64_t> topology_digest_{0};
  std::atomic<bool> held_{false};
  uint64_t holder_ = 0;                  // written once, before the request is shared
  std::weak_ptr<const RequestState> hold_with_;  // set once, before the request is shared
  Callback callback_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

}  // namespace taiji
