// One thread per executor runs every DeviceComm call but abort(). It sleeps poll_us
// between rounds while a communicator is starting or ops are in flight, and otherwise on
// the condition variable (bounded, see kIdleWake). Callbacks run on that thread only,
// never with mu_ held, so they may call submit(), abort() and error().
#include "device/device_executor.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "monitor/metrics.h"

namespace taiji {

namespace {

// An idle executor still wakes this often: an asynchronous error can arrive between ops,
// and ops queued before init() have deadlines too.
constexpr auto kIdleWake = std::chrono::milliseconds(100);
// How long finalize() waits past its timeout for the thread's answer. The thread's own
// waits end by the timeout, so only a callback that blocks can use this.
constexpr uint64_t kFinalizeGraceNs = 2'000'000'000;
constexpr uint64_t kNsPerMs = 1'000'000;

Status timed_out(const DeviceWork& w) {
  return Status(Code::Timeout, w.label +
                                   " did not complete before its deadline; the device "
                                   "communicator was aborted");
}

}  // namespace

DeviceExecutor::DeviceExecutor(std::shared_ptr<DeviceRuntime> runtime,
                               DeviceExecutorOptions options, Done done, Failed failed)
    : runtime_(std::move(runtime)),
      opt_(options),
      done_(std::move(done)),
      failed_(std::move(failed)) {
  thread_ = std::thread([this] { run(); });
}

DeviceExecutor::~DeviceExecutor() {
  bool running;
  {
    std::lock_guard lk(mu_);
    running = !ended_;
  }
  if (running) abort(Status(Code::Aborted, "peer closed"));
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    wake_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DeviceExecutor::init(std::string id, int rank, int size, int ordinal) {
  {
    std::lock_guard lk(mu_);
    if (init_requested_ || ended_) return;
    init_requested_ = true;
    id_ = std::move(id);
    rank_ = rank;
    size_ = size;
    ordinal_ = ordinal;
    wake_ = true;
  }
  cv_.notify_all();
}

void DeviceExecutor::submit(std::vector<DeviceWork> batch) {
  if (batch.empty()) return;
  {
    std::lock_guard lk(mu_);
    if (!error_.is_ok() || ended_ || fin_requested_ || stop_) {
      for (DeviceWork& w : batch) rejected_.push_back(std::move(w));
    } else {
      queued_.push_back(std::move(batch));
    }
    wake_ = true;
  }
  cv_.notify_all();
}

void DeviceExecutor::abort(const Status& why) {
  {
    std::lock_guard lk(mu_);
    if (error_.is_ok()) error_ = why.is_ok() ? Status(Code::Aborted, "aborted") : why;
    if (!ended_) fail_pending_ = true;
    // Under the lock, so that the thread cannot destroy the communicator meanwhile.
    if (comm_) comm_->abort();
    wake_ = true;
  }
  cv_.notify_all();
}

Status DeviceExecutor::finalize(int64_t timeout_ms) {
  if (std::this_thread::get_id() == thread_.get_id())
    return Status(Code::Internal, "device executor: finalize called from its own callback");
  std::unique_lock lk(mu_);
  if (!fin_requested_) {
    fin_requested_ = true;
    fin_timeout_ms_ = std::max<int64_t>(timeout_ms, 0);
    fin_deadline_ns_ = monotonic_ns() + static_cast<uint64_t>(fin_timeout_ms_) * kNsPerMs;
    wake_ = true;
    cv_.notify_all();
  }
  uint64_t limit = fin_deadline_ns_ + kFinalizeGraceNs;
  while (!fin_done_) {
    uint64_t now = monotonic_ns();
    if (now >= limit)
      return Status(Code::Timeout, "device executor: finalize did not end within " +
                                       std::to_string(fin_timeout_ms_) + " ms");
    fin_cv_.wait_for(lk, std::chrono::nanoseconds(limit - now));
  }
  return fin_result_;
}

Status DeviceExecutor::error() const {
  std::lock_guard lk(mu_);
  return error_;
}

bool DeviceExecutor::ready() const {
  std::lock_guard lk(mu_);
  return ready_ && error_.is_ok() && !ended_;
}

Status DeviceExecutor::reject_status_locked() const {
  if (!error_.is_ok()) return error_;
  return Status(Code::Finalized, "the device communicator was finalized");
}

void DeviceExecutor::run() {
  std::unique_lock lk(mu_);
  for (;;) {
    if (!rejected_.empty()) {
      std::vector<DeviceWork> late;
      late.swap(rejected_);
      Status why = reject_status_locked();
      lk.unlock();
      for (const DeviceWork& w : late) done_(w.tag, why);
      lk.lock();
      continue;
    }
    if (fail_pending_) {
      lk.unlock();
      take_down();
      lk.lock();
      continue;
    }
    if (ended_) {
      // Answered only now, after take_down's callbacks, so that finalize() returns once
      // every op has its outcome.
      if (fin_requested_ && !fin_done_) {
        fin_done_ = true;
        fin_result_ = error_;
        fin_cv_.notify_all();
      }
      if (stop_) return;
      cv_.wait_for(lk, kIdleWake, [this] { return wake_; });
      wake_ = false;
      continue;
    }
    if (stop_) return;
    wake_ = false;
    lk.unlock();
    bool busy = step();
    lk.lock();
    if (wake_ || fail_pending_ || ended_) continue;
    if (busy)
      cv_.wait_for(lk, std::chrono::microseconds(opt_.poll_us), [this] { return wake_; });
    else
      cv_.wait_for(lk, kIdleWake, [this] { return wake_; });
  }
}

bool DeviceExecutor::step() {
  if (!comm_started_ && !start_comm()) return false;
  if (comm_ && !ready_ && !poll_init(monotonic_ns())) return false;
  if (comm_ && ready_ && (!launch_queued() || !poll_done())) return false;
  if (comm_) {
    Status st = comm_->async_error();
    if (!st.is_ok() && st.code() != Code::InProgress) {
      fail(st);
      return false;
    }
  }
  uint64_t now = monotonic_ns();
  if (!check_deadlines(now)) return false;

  bool fin, queued;
  uint64_t fin_deadline;
  int64_t fin_timeout_ms;
  {
    std::lock_guard lk(mu_);
    fin = fin_requested_;
    fin_deadline = fin_deadline_ns_;
    fin_timeout_ms = fin_timeout_ms_;
    queued = !queued_.empty();
  }
  if (fin) {
    if (in_flight_.empty() && !queued) {
      finish_finalize(now, fin_deadline);
      return false;
    }
    if (now >= fin_deadline) {
      fail(Status(Code::Timeout, "device ops were still pending when finalize's " +
                                     std::to_string(fin_timeout_ms) +
                                     " ms ran out; the device communicator was aborted"));
      return false;
    }
  }
  return comm_ && (!ready_ || !in_flight_.empty());
}

bool DeviceExecutor::start_comm() {
  std::string id;
  int rank, size, ordinal;
  {
    std::lock_guard lk(mu_);
    if (!init_requested_) return true;
    id = id_;
    rank = rank_;
    size = size_;
    ordinal = ordinal_;
  }
  comm_started_ = true;
  init_start_ns_ = monotonic_ns();
  auto comm = runtime_->create_comm(id, rank, size, ordinal);
  if (!comm.is_ok()) {
    fail(comm.status());
    return false;
  }
  std::lock_guard lk(mu_);
  // An abort() before this point found no communicator to abort: take_down() does it.
  comm_ = std::move(comm.value());
  return true;
}

bool DeviceExecutor::poll_init(uint64_t now) {
  Status st = comm_->init_status();
  if (st.is_ok()) {
    std::lock_guard lk(mu_);
    ready_ = true;
    return true;
  }
  if (st.code() != Code::InProgress) {
    fail(st);
    return false;
  }
  if (now - init_start_ns_ > static_cast<uint64_t>(opt_.init_timeout_ms) * kNsPerMs) {
    fail(Status(Code::Timeout, "device communicator init did not finish within " +
                                   std::to_string(opt_.init_timeout_ms) + " ms"));
    return false;
  }
  return true;
}

bool DeviceExecutor::launch_queued() {
  for (;;) {
    std::vector<DeviceWork> batch;
    {
      std::lock_guard lk(mu_);
      if (queued_.empty() || fail_pending_) return true;
      batch = std::move(queued_.front());
      queued_.pop_front();
    }
    std::vector<DeviceOp> ops;
    ops.reserve(batch.size());
    for (const DeviceWork& w : batch) ops.push_back(w.op);
    auto handle = comm_->launch(ops);
    if (!handle.is_ok()) {
      Status why(handle.status().code(),
                 "launching " + batch.front().label + ": " + handle.status().message());
      {
        // Back in front, so that take_down() fails it in its place.
        std::lock_guard lk(mu_);
        queued_.push_front(std::move(batch));
      }
      fail(why);
      return false;
    }
    // The group's waits on the fences are enqueued: the events may be reused.
    for (DeviceWork& w : batch) w.fence.reset();
    in_flight_.push_back({handle.value(), std::move(batch)});
  }
}

bool DeviceExecutor::poll_done() {
  // One stream runs the groups in launch order: a later one is not done before this one.
  while (!in_flight_.empty()) {
    auto done = comm_->done(in_flight_.front().handle);
    if (!done.is_ok()) {
      fail(done.status());
      return false;
    }
    if (!done.value()) return true;
    InFlight finished = std::move(in_flight_.front());
    in_flight_.pop_front();
    for (const DeviceWork& w : finished.work) done_(w.tag, Status::ok());
  }
  return true;
}

bool DeviceExecutor::check_deadlines(uint64_t now) {
  auto past = [now](const DeviceWork& w) { return w.deadline_ns != 0 && now >= w.deadline_ns; };
  for (const InFlight& f : in_flight_) {
    for (const DeviceWork& w : f.work) {
      if (past(w)) {
        fail(timed_out(w));
        return false;
      }
    }
  }
  Status why;
  {
    std::lock_guard lk(mu_);
    for (const auto& batch : queued_) {
      auto it = std::find_if(batch.begin(), batch.end(), past);
      if (it != batch.end()) {
        why = timed_out(*it);
        break;
      }
    }
  }
  if (why.is_ok()) return true;
  fail(why);
  return false;
}

void DeviceExecutor::finish_finalize(uint64_t now, uint64_t deadline) {
  Status st;
  if (comm_) {
    uint64_t left = deadline > now ? deadline - now : 0;
    // Rounded up: the communicator gives up only once finalize's whole timeout has passed.
    st = comm_->finalize(static_cast<int64_t>((left + kNsPerMs - 1) / kNsPerMs));
  }
  std::unique_ptr<DeviceComm> comm;
  {
    std::lock_guard lk(mu_);
    comm = std::move(comm_);
    ready_ = false;
    ended_ = true;
    // An abort() during the finalize is the answer; a failed finalize becomes sticky, but
    // is the caller's to report (failed_ is not called for it).
    if (!error_.is_ok())
      st = error_;
    else if (!st.is_ok())
      error_ = st;
    fin_done_ = true;
    fin_result_ = st;
  }
  fin_cv_.notify_all();
}

void DeviceExecutor::fail(const Status& why) {
  std::lock_guard lk(mu_);
  if (error_.is_ok()) error_ = why;
  fail_pending_ = true;
}

void DeviceExecutor::take_down() {
  std::unique_ptr<DeviceComm> comm;
  std::deque<std::vector<DeviceWork>> queued;
  Status why;
  {
    std::lock_guard lk(mu_);
    why = error_;
    fail_pending_ = false;
    ended_ = true;
    ready_ = false;
    comm = std::move(comm_);
    queued.swap(queued_);
  }
  if (comm) {
    comm->abort();
    comm.reset();
  }
  if (!failed_called_) {
    failed_called_ = true;
    failed_(why);
  }
  std::deque<InFlight> flight;
  flight.swap(in_flight_);
  for (const InFlight& f : flight)
    for (const DeviceWork& w : f.work) done_(w.tag, why);
  for (const auto& batch : queued)
    for (const DeviceWork& w : batch) done_(w.tag, why);
}

}  // namespace taiji
