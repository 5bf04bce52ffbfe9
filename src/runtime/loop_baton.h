// Who runs a peer's event loop: its I/O thread, or for a while a caller waiting on one of
// its requests.
//
// On a host with more runnable threads than cores, a small op's time is mostly thread
// hand-overs: the I/O thread completes the request, the waiter must be scheduled to see
// it, and both spin for the core meanwhile. So a waiter that would spin anyway asks for
// the loop instead. The I/O thread, when it polls, sees the ask, lends the loop and parks;
// the waiter then runs the loop itself and completes its own op on its own thread. That
// leaves one spinning thread per process, as with MPI's progress-in-the-call, while the
// I/O thread still makes progress for everyone who does not wait.
//
// A waiter whose op completed gives the loop back without waking anyone: the next wait
// takes it again at no cost. The parked I/O thread takes it back itself after a short
// park (growing while waiters keep using it), or at once when a waiter stopped with work
// left in the loop. So ops posted and never waited on, timers and peers' traffic wait at
// most one park for the loop. Work that only the I/O thread may do (user callbacks) makes
// the give-back final: no waiter takes the loop again until the I/O thread has had it, or
// a caller waiting op after op would win every race for it and starve the callbacks.
//
// Ownership passes through state_ with acquire/release, which orders everything the loop
// touched between the threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace taiji {

class LoopBaton {
 public:
  // The peer side: runs the loop on the calling thread.
  class Driver {
   public:
    // Runs the loop until *done, or until no activity for window_ns, or past hard_ns, or
    // until sleeping pays better than polling. True if the loop has work left that the
    // I/O thread should take up at once (ops in flight, posts, deferred callbacks).
    virtual bool drive(const std::atomic<bool>& done, uint64_t window_ns, uint64_t hard_ns) = 0;
    // Called by the driving waiter right after drive(): whether the loop holds work that
    // only the I/O thread may do (user callbacks). The loop then goes back to the I/O
    // thread before any waiter may take it again.
    virtual bool owes_io_thread() const = 0;

   protected:
    ~Driver() = default;
  };

  LoopBaton(Driver* driver, uint64_t park_ns) : driver_(driver), park_min_ns_(park_ns) {}

  // A waiter: asks for the loop and runs it while it can; gives up when the loop is not
  // lent before window_ns. True once *done.
  bool wait_by_driving(const std::atomic<bool>& done, uint64_t window_ns, uint64_t hard_ns);

  // I/O thread, owning the loop: whether a waiter asks for it.
  bool wanted() const { return wanting_.load(std::memory_order_relaxed) > 0; }
  // I/O thread, owning the loop: lends it and parks; returns owning it again.
  void lend_and_park();
  // I/O thread, owning the loop, when it ends: nobody takes it from now on.
  void close() { state_.store(kClosed, std::memory_order_release); }

 private:
  // kReturning: given back with work for the I/O thread; only the I/O thread takes it.
  enum State : int { kIo, kLent, kDriven, kReturning, kClosed };
  void wake_io();

  Driver* const driver_;
  const uint64_t park_min_ns_;
  std::atomic<int> state_{kIo};
  std::atomic<int> wanting_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool woken_ = false;  // under mu_
};

// User callbacks run on the I/O thread: the C API promises it, and a callback that takes a
// lock its waiter holds must not run inside that wait. While a waiter runs the loop, they
// queue in the list it installed here, for the I/O thread to run.
using DeferredCallbacks = std::vector<std::function<void()>>;
void call_user_callback(std::function<void()> fn);

class DeferUserCallbacks {
 public:
  explicit DeferUserCallbacks(DeferredCallbacks* to);
  ~DeferUserCallbacks();
  DeferUserCallbacks(const DeferUserCallbacks&) = delete;
  DeferUserCallbacks& operator=(const DeferUserCallbacks&) = delete;

 private:
  DeferredCallbacks* outer_;
};

}  // namespace taiji
