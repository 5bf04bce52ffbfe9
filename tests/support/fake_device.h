// A device runtime for tests on machines without a GPU: ranks are threads of one process
// and "device memory" is host memory this runtime hands out. It behaves like NCCL where
// the device backend's ordering and failure logic can tell: a group completes only once
// every rank has launched its k-th group, ranks that launch different collectives are a
// violation that never completes (NCCL hangs or corrupts), a rank that never launches
// leaves the others hanging, abort() ends one rank's communicator at once, and finalize
// waits for every rank. Results are computed with taiji's own reduce kernels.
//
// Streams are counters: a test queues "work" on one (queue_work), a fence records the
// count at the time (record_fence), and a launch notes the count each op waited for: its
// fence's, or, for an op without one, the count at the launch. A launch with a fence that
// is not held (released, or never recorded) fails.
//
// Thread safety: every call, on the runtime and on its communicators, may come from any
// thread; one mutex guards all of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/op_kind.h"
#include "device/device_api.h"

namespace taiji_test {

struct LaunchedOp {
  taiji::OpKind kind = taiji::OpKind::None;
  uint64_t count = 0;
  bool operator==(const LaunchedOp&) const = default;
};

// Where on its stream a launched op started.
struct FenceWait {
  bool fenced = false;           // it had a fence (else: it waited for the stream at launch)
  const void* stream = nullptr;  // the op's stream
  uint64_t position = 0;         // the work items on `stream` it waited for
};

class FakeDeviceRuntime : public taiji::DeviceRuntime {
 public:
  FakeDeviceRuntime();
  ~FakeDeviceRuntime() override;
  FakeDeviceRuntime(const FakeDeviceRuntime&) = delete;
  FakeDeviceRuntime& operator=(const FakeDeviceRuntime&) = delete;

  // DeviceRuntime. create_comm takes ids from make_id() only; the world's size is the
  // first caller's, and a later rank that disagrees, or a rank that joins twice, is
  // InvalidArgument.
  taiji::Status usable() const override;
  taiji::MemoryPlace place(const void* ptr) const override;
  taiji::Result<std::string> make_id() override;
  taiji::Result<std::unique_ptr<taiji::DeviceComm>> create_comm(const std::string& id, int rank,
                                                                int size, int ordinal) override;
  // A memcpy; the device side must be fake memory of device 0.
  taiji::Status copy(void* dst, const void* src, uint64_t bytes, bool to_device, int ordinal,
                     void* stream) override;
  std::string describe() const override;
  // Fails for a stream make_stream() did not make (null, the default stream, is one) and
  // for a device other than 0.
  taiji::Result<uint64_t> record_fence(void* stream, int ordinal) override;
  void release_fence(uint64_t fence) override;

  // Fake device memory (device 0), 64-byte aligned; alloc(0) gives a valid pointer.
  // release(nullptr) and pointers it did not hand out are ignored. What is not released
  // is freed with the runtime.
  void* alloc(size_t bytes);
  void release(void* ptr);

  // usable() becomes NoDevice with `why`, and place() says host for every pointer.
  void make_unusable(const std::string& why);

  // Injections, keyed by rank (in every world); set them before the comms or batches they
  // affect are created or launched.
  // Init completes for every rank of a world once all have joined and each one's delay,
  // counted from its join, has passed: a slow rank holds up all, as in NCCL.
  void init_delay_ms(int rank, int64_t ms);
  // The k-th batch (0-based) of `rank`'s world never completes, for any rank.
  void hang_batch(int rank, uint64_t k);
  // Once `rank`'s k-th batch has completed, its async_error() reports `status`.
  void async_error_after(int rank, uint64_t k, taiji::Status status);
  // `rank`'s init_status() (and async_error()) report `status` instead of completing.
  void fail_init(int rank, taiji::Status status);
  // Device time per op: a batch completes this long after it was matched (after the
  // previous batch, since one stream runs them in order) times its number of ops.
  void device_time_us(uint64_t us);

  // Fake streams: a new one, with no work queued; `items` more work items queued on
  // `stream` (null: the default stream), returning how many it has now.
  void* make_stream();
  uint64_t queue_work(void* stream, uint64_t items = 1);

  // Inspection.
  // Batches whose ranks disagreed (op count, or kind, dtype, count, and redop or root where
  // the kind has one), and a line for each saying how.
  uint64_t violations() const;
  std::string violation_text() const;
  // Communicators aborted, each counted once: by abort(), or by a finalize that timed out.
  uint64_t aborts() const;
  // Calls of copy() that succeeded.
  uint64_t copies() const;
  // Every op `rank` launched, in order, across its worlds.
  std::vector<LaunchedOp> launched(int rank) const;
  // For each op `rank` launched, in order, where on its stream it started.
  std::vector<FenceWait> fence_waits(int rank) const;
  // Fences recorded, fences recorded and not released yet, and releases of a fence that
  // was not held (released twice, or never recorded).
  uint64_t fences_recorded() const;
  uint64_t fences_held() const;
  uint64_t stray_fence_releases() const;

  struct State;

 private:
  std::shared_ptr<State> s_;
};

}  // namespace taiji_test
