// The one thread of a peer that calls NCCL. It owns the communicator: starts it
// (non-blocking, bounded), launches the sequencer's batches in order, one group each,
// polls their completion, and watches: an op past its deadline, an asynchronous NCCL
// error, or an init that does not finish in time aborts the communicator, fails every op
// in flight and queued, and makes the error sticky (PyTorch's ProcessGroupNCCL watchdog,
// in one thread with the launches, so that nothing but abort() touches NCCL from
// elsewhere).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "device/device_api.h"

namespace taiji {

struct DeviceWork {
  uint64_t tag = 0;          // the caller's handle, handed back with the outcome
  DeviceOp op;
  DeviceFence fence;         // holds op.fence: released once the op is launched, or dropped
  uint64_t deadline_ns = 0;  // monotonic_ns(); 0: none
  std::string label;         // "allreduce 'grad.0' version 3": for error messages
};

struct DeviceExecutorOptions {
  int64_t init_timeout_ms = 60000;
  uint32_t poll_us = 50;  // sleep between completion polls while work is in flight
};

class DeviceExecutor {
 public:
  // Both called on the executor thread. `done`: one op ended (Ok, or why not). `failed`:
  // the communicator failed (called once, before the `done` calls of the ops it takes
  // down); the caller tells the other peers.
  using Done = std::function<void(uint64_t tag, const Status& status)>;
  using Failed = std::function<void(const Status& why)>;

  DeviceExecutor(std::shared_ptr<DeviceRuntime> runtime, DeviceExecutorOptions options, Done done,
                 Failed failed);
  // Aborts the communicator if it still runs, fails what is left with Aborted, joins.
  ~DeviceExecutor();

  // Starts the communicator: every rank calls it with the same id. Batches submitted
  // before it completes wait for it.
  void init(std::string id, int rank, int size, int ordinal);
  // One batch, launched as one group after every batch submitted before it.
  void submit(std::vector<DeviceWork> batch);
  // Ends the communicator now: every op in flight or queued fails with `why`, later
  // submits fail with it at once (sticky). Any thread; the first error is the one kept.
  void abort(const Status& why);
  // A clean end: waits for the ops in flight (each until its deadline), then finalizes the
  // communicator within `timeout_ms`; past either it aborts. Ok, or why it aborted.
  Status finalize(int64_t timeout_ms);
  // The sticky error, or Ok.
  Status error() const;
  // Whether the communicator is ready (init completed) and not failed.
  bool ready() const;

 private:
  struct InFlight {
    uint64_t handle = 0;
    std::vector<DeviceWork> work;
  };

  void run();
  // One poll round, without the lock. Whether to poll again after poll_us (a communicator
  // starting or ops in flight) rather than wait for work; false after a failure too.
  bool step();
  // Creates the communicator once init() was called; false if that failed.
  bool start_comm();
  bool poll_init(uint64_t now);
  bool launch_queued();
  bool poll_done();
  bool check_deadlines(uint64_t now);
  void finish_finalize(uint64_t now, uint64_t deadline);
  // Records `why` as the sticky error (unless one is kept already) for take_down().
  void fail(const Status& why);
  // Aborts and drops the communicator, then calls failed_ once and done_ for every op.
  void take_down();
  Status reject_status_locked() const;

  std::shared_ptr<DeviceRuntime> runtime_;
  DeviceExecutorOptions opt_;
  Done done_;
  Failed failed_;

  mutable std::mutex mu_;
  std::condition_variable cv_;      // the executor thread's wake-up
  std::condition_variable fin_cv_;  // finalize()'s waiter
  // Guarded by mu_. comm_ and ready_ are written only by the executor thread (under the
  // lock), so that thread reads them without it; abort() uses comm_ under the lock.
  std::unique_ptr<DeviceComm> comm_;
  std::deque<std::vector<DeviceWork>> queued_;
  std::vector<DeviceWork> rejected_;  // submitted after the end: failed by the thread
  Status error_;                      // sticky
  bool fail_pending_ = false;         // error_ is set and the thread has not taken down yet
  bool init_requested_ = false;
  std::string id_;
  int rank_ = 0, size_ = 0, ordinal_ = 0;
  bool ready_ = false;
  bool ended_ = false;  // failed or finalized: the thread only fails late submits
  bool fin_requested_ = false;
  uint64_t fin_deadline_ns_ = 0;
  int64_t fin_timeout_ms_ = 0;
  bool fin_done_ = false;
  Status fin_result_;
  bool stop_ = false;
  bool wake_ = false;

  // The executor thread's own.
  std::deque<InFlight> in_flight_;
  bool comm_started_ = false;
  uint64_t init_start_ns_ = 0;
  bool failed_called_ = false;

  std::thread thread_;
};

}  // namespace taiji
