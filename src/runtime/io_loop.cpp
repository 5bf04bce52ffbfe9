#include "runtime/io_loop.h"

#include <algorithm>

#include "transport/sigpipe.h"

namespace taiji {

namespace {

constexpr uint64_t kTickMs = 20;
// More than this read in one loop round is a bulk transfer. From another host the next
// data then comes at the link's pace: a wake-up costs little next to waiting for it, and
// a polling thread would only burn CPU time (twice the CPU per op, measured on the
// emulated 1 Gbit/s cluster). Peers on this host answer within microseconds, so a job
// with every rank on one host keeps polling through bulk transfers and large ops: each
// hop of a pipelined chunk is a hand-over between loops, and sleeping added a wake-up to
// every one (1 MiB allreduce over shared memory 2-2.5x faster polling).
constexpr uint64_t kBulkReadBytes = 64 * 1024;

}  // namespace

IoLoop::IoLoop(bool adaptive, int64_t spin_us)
    : adaptive_(adaptive && spin_us > 0),
      spin_ns_(adaptive_ ? static_cast<uint64_t>(spin_us) * 1000 : 0) {
  uv_loop_init(&loop_);
  uv_async_init(&loop_, &wake_, [](uv_async_t* a) { static_cast<IoLoop*>(a->data)->drain_inbox(); });
  wake_.data = this;
  uv_timer_init(&loop_, &tick_);
  tick_.data = this;
  if (adaptive_) {
    // The I/O thread parks for a quarter of the spin window at first: the most an op
    // posted without a waiter waits for it right after a waiter gave the loop back.
    LoopBaton::Driver* driver = this;
    baton_ = std::make_shared<LoopBaton>(driver, spin_ns_ / 4);
  }
}

IoLoop::~IoLoop() { uv_loop_close(&loop_); }

void IoLoop::start(std::function<void()> tick, std::function<bool()> busy) {
  on_tick_ = std::move(tick);
  busy_ = std::move(busy);
  uv_timer_start(&tick_, [](uv_timer_t* t) { static_cast<IoLoop*>(t->data)->on_tick_(); }, kTickMs,
                 kTickMs);
  thread_ = std::thread([this] {
    io_thread_id_ = std::this_thread::get_id();
    // A write to a connection the peer just closed raises SIGPIPE in the writing thread;
    // blocked here, it stays pending and the write fails with EPIPE instead of killing
    // the process. A waiter running the loop blocks it too, while it does, from its first
    // write (drive(), transport/sigpipe.h).
    block_sigpipe_for_good();
    run_loop();
    if (baton_) baton_->close();
    run_deferred_callbacks();
    // A later thread may get this one's id: it must not pass for the I/O thread.
    io_thread_id_ = std::thread::id();
  });
  // Set before the first post can read it (with one rank nothing waits for the loop).
  io_thread_id_ = thread_.get_id();
}

void IoLoop::join() {
  if (on_io_thread()) return;
  std::lock_guard<std::mutex> lock(join_mu_);
  if (thread_.joinable()) thread_.join();
  joined_ = true;
}

bool IoLoop::run_on_loop(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    if (refusing_) return false;
    inbox_.push_back(std::move(fn));
    inbox_nonempty_.store(true, std::memory_order_relaxed);
  }
  wake_loop();
  return true;
}

void IoLoop::refuse_work() {
  std::lock_guard<std::mutex> lock(inbox_mu_);
  refusing_ = true;
}

void IoLoop::close_handles() {
  uv_close(reinterpret_cast<uv_handle_t*>(&tick_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&wake_), nullptr);
}

void IoLoop::wake_loop() {
  if (!polling_.load()) uv_async_send(&wake_);
}

void IoLoop::drain_inbox() {
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    work.swap(inbox_);
    inbox_nonempty_.store(false, std::memory_order_relaxed);
  }
  if (work.empty()) return;
  ++drained_;
  for (auto& fn : work) fn();
}

void IoLoop::run_loop() {
  if (!adaptive_) {
    uv_run(&loop_, UV_RUN_DEFAULT);
    return;
  }
  SpinWindow window(spin_ns_);
  uint64_t seen = activity();
  uint64_t bytes = transports_->socket_bytes();
  while (uv_run(&loop_, UV_RUN_ONCE) != 0) {
    // Woken by the tick alone: nothing suggests more traffic soon, so no polling.
    if (activity() == seen) continue;
    seen = activity();
    if (!paced_by_network(&bytes) && !poll(window, &seen, &bytes)) return;
  }
}

bool IoLoop::paced_by_network(uint64_t* bytes) {
  const uint64_t read = transports_->socket_bytes();
  const bool bulk = read - *bytes > kBulkReadBytes;
  *bytes = read;
  return !one_host_ && (large_ops_ > 0 || bulk);
}

bool IoLoop::poll(SpinWindow& window, uint64_t* seen, uint64_t* bytes) {
  polling_.store(true);
  transports_->set_polling(true);
  bool alive = true;
  bool paid = false;
  uint64_t deadline = progress_now_ns() + window.ns();
  for (;;) {
    if (baton_->wanted()) {
      baton_->lend_and_park();
      run_deferred_callbacks();
      // The waiter left work, or stopped using the loop a while ago: poll a full window.
      paid = true;
      deadline = progress_now_ns() + window.ns();
    }
    if (inbox_nonempty_.load(std::memory_order_relaxed)) drain_inbox();
    if (uv_run(&loop_, UV_RUN_NOWAIT) == 0) {
      alive = false;
      break;
    }
    transports_->poll();
    if (paced_by_network(bytes)) break;
    uint64_t now = progress_now_ns();
    if (activity() != *seen) {
      *seen = activity();
      paid = true;
      window.paid();
      deadline = now + window.ns();
    } else if (now >= deadline) {
      break;
    }
    progress_pause();
  }
  if (!paid) window.missed();
  // Posters that saw polling_ set skipped the eventfd: their work is in the inbox now;
  // senders that saw the mailbox polled rang no doorbell: their frames are in it.
  transports_->set_polling(false);
  polling_.store(false);
  drain_inbox();
  transports_->poll();
  return alive;
}

bool IoLoop::drive(const std::atomic<bool>& done, uint64_t window_ns, uint64_t hard_ns) {
  // A write to a peer that just closed must fail with EPIPE, not kill the process.
  LazySigpipeBlock no_sigpipe;
  if (transports_->writes_queued()) no_sigpipe.block();
  DeferUserCallbacks defer(&deferred_);
  uint64_t seen = activity();
  uint64_t bytes = transports_->socket_bytes();
  uint64_t deadline = std::min(progress_now_ns() + window_ns, hard_ns);
  for (;;) {
    if (inbox_nonempty_.load(std::memory_order_relaxed)) drain_inbox();
    if (done.load(std::memory_order_acquire)) break;
    if (uv_run(&loop_, UV_RUN_NOWAIT) == 0) return true;
    transports_->poll();
    if (done.load(std::memory_order_acquire) || paced_by_network(&bytes)) break;
    const uint64_t now = progress_now_ns();
    if (activity() != seen) {
      seen = activity();
      deadline = std::min(now + window_ns, hard_ns);
    } else if (now >= deadline) {
      break;
    }
    progress_pause();
  }
  return busy();
}

bool IoLoop::busy() const {
  return inbox_nonempty_.load(std::memory_order_relaxed) || !deferred_.empty() || busy_();
}

void IoLoop::run_deferred_callbacks() {
  DeferredCallbacks work;
  work.swap(deferred_);
  for (auto& fn : work) fn();
}

}  // namespace taiji
