// A peer's I/O loop: the libuv loop, the thread that runs it, the inbox through which any
// thread hands it work, and progress (runtime/progress.h): in adaptive mode the loop polls
// for a while after traffic before it sleeps in epoll again, and lends itself to a waiting
// caller (runtime/loop_baton.h). "I/O thread only" in the runtime means "on the thread
// running this loop": the I/O thread, or a waiter it lent the loop to, never two at once.
#pragma once

#include <uv.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/loop_baton.h"
#include "runtime/progress.h"
#include "transport/transport_stack.h"

namespace taiji {

class IoLoop final : private LoopBaton::Driver {
 public:
  // spin_us > 0 with adaptive progress: poll, and lend the loop to waiters.
  IoLoop(bool adaptive, int64_t spin_us);
  ~IoLoop();

  uv_loop_t* uv() { return &loop_; }
  bool adaptive() const { return adaptive_; }
  uint64_t spin_ns() const { return spin_ns_; }
  // Adaptive mode: what requests hand to their waiters; it outlives the loop.
  const std::shared_ptr<LoopBaton>& baton() const { return baton_; }

  // Before start: the transports the loop polls.
  void set_transports(TransportStack* transports) { transports_ = transports; }
  // Every rank on this host: poll through bulk transfers and large ops too.
  void set_one_host(bool one_host) { one_host_ = one_host; }
  bool one_host() const { return one_host_; }
  // I/O thread: an op above the eager size began or ended (the loop sleeps while one runs
  // with peers on other hosts: their data comes at the link's pace).
  void large_op_began() { ++large_ops_; }
  void large_op_ended() { --large_ops_; }

  // Starts the I/O thread. tick runs on it every kTickMs; busy tells whether work is left
  // that the I/O thread should take up now (ops in flight, a close under way).
  void start(std::function<void()> tick, std::function<bool()> busy);
  bool running() const { return thread_.joinable(); }
  // Runs fn on the I/O thread, after the tasks handed over before it; false (fn dropped)
  // once the loop refuses work.
  bool run_on_loop(std::function<void()> fn);
  bool on_io_thread() const { return io_thread_id() == std::this_thread::get_id(); }
  std::thread::id io_thread_id() const { return io_thread_id_; }
  // Waits for the I/O thread to end; nothing from the I/O thread itself (no self-join).
  void join();
  bool joined() const { return joined_; }

  // I/O thread: later run_on_loop calls fail; what was handed over runs at drain().
  void refuse_work();
  // I/O thread: runs the work handed over so far.
  void drain() { drain_inbox(); }
  // I/O thread: closes the loop's own handles; the loop ends once every other is closed.
  void close_handles();
  // When the I/O thread never ran: runs the loop on this thread until it ends.
  void run_here() { uv_run(&loop_, UV_RUN_DEFAULT); }

  IoLoop(const IoLoop&) = delete;
  IoLoop& operator=(const IoLoop&) = delete;

 private:
  void drain_inbox();
  // After queueing work for the loop: wakes it unless it is polling its inbox anyway.
  void wake_loop();
  void run_loop();
  // One polling window, ended early by bulk reads from other hosts; false once the loop
  // has nothing left to run. Lends the loop to a waiter that asks for it.
  bool poll(SpinWindow& window, uint64_t* seen, uint64_t* bytes);
  // A waiter, holding the baton: runs the loop on its own thread (LoopBaton::Driver).
  bool drive(const std::atomic<bool>& done, uint64_t window_ns, uint64_t hard_ns) override;
  // Callbacks deferred while a waiter drove: the I/O thread must run them.
  bool owes_io_thread() const override { return !deferred_.empty(); }
  bool busy() const;
  // I/O thread: user callbacks that completed while a waiter ran the loop.
  void run_deferred_callbacks();
  // Whether data now comes at a remote link's pace, so the loop should sleep rather than
  // poll: peers on other hosts and a large op in flight, or a bulk read since *bytes
  // (which it advances).
  bool paced_by_network(uint64_t* bytes);
  // Changes whenever traffic arrives or work was posted.
  uint64_t activity() const { return transports_->arrivals() + drained_; }

  const bool adaptive_;
  const uint64_t spin_ns_;
  uv_loop_t loop_{};
  uv_async_t wake_{};
  uv_timer_t tick_{};
  std::function<void()> on_tick_;
  std::function<bool()> busy_;
  TransportStack* transports_ = nullptr;
  std::shared_ptr<LoopBaton> baton_;
  DeferredCallbacks deferred_;           // loop owner only
  std::thread thread_;
  std::atomic<std::thread::id> io_thread_id_{};
  std::mutex join_mu_;
  std::atomic<bool> joined_{false};

  std::mutex inbox_mu_;
  std::vector<std::function<void()>> inbox_;
  bool refusing_ = false;                // under inbox_mu_
  // Written under inbox_mu_; read without it by the polling loop as a hint.
  std::atomic<bool> inbox_nonempty_{false};
  // True while the loop polls or is lent to a waiter: posters then skip the eventfd. The
  // I/O thread clears it, then drains the inbox once more (under inbox_mu_), so no post
  // goes unseen.
  std::atomic<bool> polling_{false};
  uint64_t drained_ = 0;                 // I/O thread only: inbox batches run
  uint64_t large_ops_ = 0;               // I/O thread only
  bool one_host_ = false;
};

}  // namespace taiji
