// What the device backend needs of a GPU collective library, as one interface: the CUDA
// runtime (where a pointer lives, streams, events) and NCCL (communicators, grouped
// collectives, asynchronous errors, abort). The real pair is loaded at run time
// (device/nccl_runtime.h); tests run the same backend over an in-process fake whose ranks
// are threads (tests/support/fake_device.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/op_kind.h"
#include "common/status.h"

namespace taiji {

struct MemoryPlace {
  bool device = false;  // device memory (or managed memory the device can address)
  int ordinal = -1;     // the device's index when `device`
};

// One collective as NCCL takes it. Counts are in elements: of the whole buffer for
// allreduce, broadcast and reduce; of one rank's block for allgather and reduce_scatter.
struct DeviceOp {
  OpKind kind = OpKind::Allreduce;  // Allreduce, Broadcast, Reduce, Allgather, ReduceScatter
  DType dtype = DType::F32;
  RedOp redop = RedOp::Sum;
  uint64_t count = 0;
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  // The caller's CUDA stream (a cudaStream_t) or null (the legacy default stream): the op
  // starts after the work queued on it before the post, and work queued on it after the op
  // completes starts after the op.
  void* stream = nullptr;
  // Where the op starts on `stream`: a fence DeviceRuntime::record_fence recorded there at
  // the post, which the launch makes the group wait for; 0: the op waits for nothing
  // queued on `stream`. The fence stays the launcher's: it releases it once launch()
  // returned (the wait is enqueued by then), or when the op ends without a launch.
  uint64_t fence = 0;
};

// One communicator of `size` ranks. One thread (the backend's executor) calls everything
// except abort(), which any thread may call at any time.
class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  // Initialisation is non-blocking: Ok once the communicator is ready, InProgress while it
  // is not, or the error that ended it.
  virtual Status init_status() = 0;
  // Enqueues `ops` as one group (ncclGroupStart .. ncclGroupEnd) and returns a handle for
  // their completion, or the error. Returns without waiting for the device or other ranks.
  virtual Result<uint64_t> launch(const std::vector<DeviceOp>& ops) = 0;
  // Whether the group `launch` returned `batch` for has completed on the device.
  virtual Result<bool> done(uint64_t batch) = 0;
  // The communicator's asynchronous error (ncclCommGetAsyncError): Ok, InProgress while a
  // non-blocking call is still running, or the error.
  virtual Status async_error() = 0;
  // Ends the communicator at once (ncclCommAbort): launched groups are abandoned and no
  // call blocks on other ranks after it. Any thread; idempotent.
  virtual void abort() = 0;
  // A clean end (ncclCommFinalize, then destroy) that waits at most `timeout_ms`; past it
  // the communicator is aborted and the result is Timeout.
  virtual Status finalize(int64_t timeout_ms) = 0;
};

// The process's GPU runtime: loaded once, shared by every peer.
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  // Ok when device ops can run here; otherwise NoDevice (or Config) with the reason: the
  // build has no NCCL, TAIJI_NCCL=off, a library did not load, no device is visible.
  virtual Status usable() const = 0;
  // Where `ptr` points. Host memory, and every pointer when the runtime is not usable.
  virtual MemoryPlace place(const void* ptr) const = 0;
  // A fresh communicator id (ncclGetUniqueId): made by rank 0, sent to the others.
  virtual Result<std::string> make_id() = 0;
  // Starts a non-blocking communicator on device `ordinal` as `rank` of `size` (every rank
  // calls it with the same id); it is ready once init_status() is Ok.
  virtual Result<std::unique_ptr<DeviceComm>> create_comm(const std::string& id, int rank, int size,
                                                          int ordinal) = 0;
  // Copies `bytes` between device memory on device `ordinal` and host memory (to_device:
  // host -> device; else device -> host), queued on `stream` (a cudaStream_t, or null) and
  // waited for: returns once the copy is done, Ok or the error. Any thread.
  virtual Status copy(void* dst, const void* src, uint64_t bytes, bool to_device, int ordinal,
                      void* stream) = 0;
  // "CUDA runtime 13000, NCCL 2.28.9, 1 device" or why there is none: for logs and errors.
  virtual std::string describe() const = 0;
  // Records, now, the position of the work queued so far on `stream` (a cudaStream_t, or
  // null: the legacy default stream of device `ordinal`), without waiting for it: a handle
  // for DeviceOp::fence, or the error. The calling thread's current device is left as it
  // was. Every fence is released once (release_fence); 0 is never returned. Any thread.
  virtual Result<uint64_t> record_fence(void* stream, int ordinal) = 0;
  // Gives back a fence record_fence returned; 0 and unknown handles are ignored. A wait
  // already enqueued on it is not affected. Any thread.
  virtual void release_fence(uint64_t fence) = 0;
};

// One fence of a runtime, shared by its copies and released with the last of them: what
// holds an op's fence from its post until its launch, on whichever path the op ends.
class DeviceFence {
 public:
  DeviceFence() = default;
  DeviceFence(std::shared_ptr<DeviceRuntime> runtime, uint64_t fence)
      : hold_(fence == 0 ? nullptr : std::make_shared<const Hold>(std::move(runtime), fence)) {}
  // The handle for DeviceOp::fence; 0 when this holds none.
  uint64_t handle() const { return hold_ ? hold_->fence : 0; }
  // Drops this copy's share: the fence is released if no other copy holds it.
  void reset() { hold_.reset(); }

 private:
  struct Hold {
    Hold(std::shared_ptr<DeviceRuntime> r, uint64_t f) : runtime(std::move(r)), fence(f) {}
    ~Hold() { runtime->release_fence(fence); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    std::shared_ptr<DeviceRuntime> runtime;
    uint64_t fence;
  };
  std::shared_ptr<const Hold> hold_;
};

}  // namespace taiji
