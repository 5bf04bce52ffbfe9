// A communicator runs its collectives on a stream of its own, fenced against each caller's
// stream with events both ways: the group waits for each op's fence, the event recorded on
// the caller's stream when the op was posted (DeviceRuntime::record_fence, whose handle is
// that cudaEvent_t), and work queued there after the launch waits for the group. Work the
// caller queues between the post and the launch is not waited for: it may itself wait for
// the op. The caller's stream is never blocked on the host. NCCL calls are serialised by
// one mutex so that abort() from another thread cannot free the communicator under a call
// in progress; in non-blocking mode every such call returns promptly, so abort() never
// waits long.
#include "device/nccl_comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "device/nccl_types.h"

namespace taiji {

namespace {

using Clock = std::chrono::steady_clock;

// How long launch() waits for a group that NCCL reports in progress to be enqueued. The
// first op of each algorithm sets up its connections then, which needs every rank to post
// it, so this is a bound on how far ranks may drift apart, as the op deadline (60 s by
// default) is.
constexpr auto kEnqueueTimeout = std::chrono::seconds(60);
constexpr auto kPollInterval = std::chrono::microseconds(20);

class NcclComm final : public DeviceComm {
 public:
  NcclComm(std::shared_ptr<const LoadedApis> api, int ordinal)
      : api_(std::move(api)), ordinal_(ordinal) {}
  ~NcclComm() override;

  Status start(const std::string& id, int rank, int size);

  Status init_status() override;
  Result<uint64_t> launch(const std::vector<DeviceOp>& ops) override;
  Result<bool> done(uint64_t batch) override;
  Status async_error() override;
  void abort() override;
  Status finalize(int64_t timeout_ms) override;

 private:
  const CudaApi& cuda() const { return api_->cuda; }
  const NcclApi& nccl() const { return api_->nccl; }
  Status cuda_error(cudaError_t err, const char* call) const {
    return Status(Code::Internal, std::string(call) + ": " + cuda_error_text(cuda(), err));
  }
  // Why the communicator is gone: finalized or aborted. Under mu_, with comm_ == nullptr.
  Status ended() const;
  // The communicator's state (ncclCommGetAsyncError) under mu_: Ok, InProgress (`what` is
  // still running) or the error, reported as coming from `what`.
  Status poll_locked(const char* what);
  // Polls until the state is not InProgress or `deadline` passes (then InProgress).
  Status wait_settled(const char* what, Clock::time_point deadline);
  Status enqueue_locked(const DeviceOp& op);
  Result<cudaEvent_t> take_event();
  void release_cuda();

  std::shared_ptr<const LoadedApis> api_;
  const int ordinal_;
  std::mutex mu_;
  ncclComm_t comm_ = nullptr;  // under mu_; null once aborted or destroyed
  std::atomic<bool> aborted_{false};
  bool finalized_ = false;  // under mu_
  bool ready_ = false;      // the executor's thread only, as everything below
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> spare_events_;
  std::unordered_map<uint64_t, cudaEvent_t> batches_;
  uint64_t next_batch_ = 1;
};

NcclComm::~NcclComm() {
  abort();
  release_cuda();
}

void NcclComm::release_cuda() {
  for (auto& [batch, event] : batches_) cuda().cudaEventDestroy(event);
  batches_.clear();
  for (cudaEvent_t event : spare_events_) cuda().cudaEventDestroy(event);
  spare_events_.clear();
  if (stream_) cuda().cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

Status NcclComm::start(const std::string& id, int rank, int size) {
  if (cudaError_t err = cuda().cudaSetDevice(ordinal_); err != cudaSuccess)
    return cuda_error(err, "cudaSetDevice");
  if (cudaError_t err = cuda().cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
      err != cudaSuccess)
    return cuda_error(err, "cudaStreamCreateWithFlags");
  ncclUniqueId unique_id;
  std::memcpy(unique_id.internal, id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::lock_guard lock(mu_);
  ncclResult_t r = nccl().ncclCommInitRankConfig(&comm_, size, unique_id, rank, &config);
  if (r == ncclSuccess || r == ncclInProgress) return Status::ok();
  Status error = nccl_error(nccl(), r, "ncclCommInitRankConfig", comm_);
  if (comm_) nccl().ncclCommAbort(comm_);
  comm_ = nullptr;
  aborted_ = true;
  return error;
}

Status NcclComm::ended() const {
  if (finalized_) return Status(Code::Finalized, "the NCCL communicator was finalized");
  return Status(Code::Aborted, "the NCCL communicator was aborted");
}

Status NcclComm::poll_locked(const char* what) {
  if (!comm_) return ended();
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = nccl().ncclCommGetAsyncError(comm_, &state);
  if (r != ncclSuccess) return nccl_error(nccl(), r, "ncclCommGetAsyncError", comm_);
  if (state == ncclSuccess) return Status::ok();
  if (state == ncclInProgress) return Status(Code::InProgress, std::string(what) + " is running");
  return nccl_error(nccl(), state, what, comm_);
}

Status NcclComm::wait_settled(const char* what, Clock::time_point deadline) {
  for (;;) {
    Status s;
    {
      std::lock_guard lock(mu_);
      s = poll_locked(what);
    }
    if (s.code() != Code::InProgress || Clock::now() >= deadline) return s;
    std::this_thread::sleep_for(kPollInterval);
  }
}

Status NcclComm::init_status() {
  std::lock_guard lock(mu_);
  if (ready_) return comm_ ? Status::ok() : ended();
  Status s = poll_locked("ncclCommInitRankConfig");
  ready_ = s.is_ok();
  return s;
}

Status NcclComm::async_error() {
  std::lock_guard lock(mu_);
  return poll_locked("a non-blocking NCCL call");
}

Result<cudaEvent_t> NcclComm::take_event() {
  if (!spare_events_.empty()) {
    cudaEvent_t event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  if (cudaError_t err = cuda().cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      err != cudaSuccess)
    return cuda_error(err, "cudaEventCreateWithFlags");
  return event;
}

Status NcclComm::enqueue_locked(const DeviceOp& op) {
  // launch() mapped these already; they cannot fail here.
  auto dtype = static_cast<ncclDataType_t>(nccl_dtype(op.dtype).value());
  ncclResult_t r = ncclSuccess;
  const char* call = "";
  if (op.kind == OpKind::Broadcast) {
    call = "ncclBroadcast";
    // taiji's broadcast is in place: a null send means the root sends from recv.
    r = nccl().ncclBroadcast(op.send ? op.send : op.recv, op.recv, op.count, dtype, op.root,
                             comm_, stream_);
  } else if (op.kind == OpKind::Allgather) {
    call = "ncclAllGather";
    r = nccl().ncclAllGather(op.send, op.recv, op.count, dtype, comm_, stream_);
  } else {
    auto redop = static_cast<ncclRedOp_t>(nccl_redop(op.redop).value());
    if (op.kind == OpKind::Allreduce) {
      call = "ncclAllReduce";
      r = nccl().ncclAllReduce(op.send, op.recv, op.count, dtype, redop, comm_, stream_);
    } else if (op.kind == OpKind::Reduce) {
      call = "ncclReduce";
      r = nccl().ncclReduce(op.send, op.recv, op.count, dtype, redop, op.root, comm_, stream_);
    } else {
      call = "ncclReduceScatter";
      r = nccl().ncclReduceScatter(op.send, op.recv, op.count, dtype, redop, comm_, stream_);
    }
  }
  // Inside a group NCCL only records the op; ncclInProgress is not an error there.
  if (r == ncclSuccess || r == ncclInProgress) return Status::ok();
  return nccl_error(nccl(), r, call, comm_);
}

Result<uint64_t> NcclComm::launch(const std::vector<DeviceOp>& ops) {
  if (!ready_) {
    Status s = init_status();
    if (s.code() == Code::InProgress)
      return Status(Code::InProgress, "launch before the NCCL communicator finished its init");
    if (!s.is_ok()) return s;
  }
  std::vector<cudaStream_t> callers;
  std::vector<uint64_t> fences;
  for (const DeviceOp& op : ops) {
    if (Status s = device_op_supported(op.kind); !s.is_ok()) return s;
    if (Result<int> t = nccl_dtype(op.dtype); !t.is_ok()) return t.status();
    if (op_kind_reduces(op.kind)) {
      if (Result<int> o = nccl_redop(op.redop); !o.is_ok()) return o.status();
    }
    // A null stream is the legacy default stream, named explicitly so that a caller built
    // with per-thread default streams still means the stream it passed.
    auto stream = op.stream ? static_cast<cudaStream_t>(op.stream) : cudaStreamLegacy;
    bool seen = false;
    for (cudaStream_t s : callers) seen = seen || s == stream;
    if (!seen) callers.push_back(stream);
    // One wait for each distinct fence.
    if (op.fence != 0 && std::find(fences.begin(), fences.end(), op.fence) == fences.end())
      fences.push_back(op.fence);
  }
  if (cudaError_t err = cuda().cudaSetDevice(ordinal_); err != cudaSuccess)
    return cuda_error(err, "cudaSetDevice");
  for (uint64_t fence : fences) {
    auto entry = reinterpret_cast<cudaEvent_t>(static_cast<uintptr_t>(fence));
    if (cudaError_t err = cuda().cudaStreamWaitEvent(stream_, entry, 0); err != cudaSuccess)
      return cuda_error(err, "cudaStreamWaitEvent (communicator's stream, the op's fence)");
  }
  Result<cudaEvent_t> completion = take_event();
  if (!completion.is_ok()) return completion.status();
  cudaEvent_t event = completion.value();
  auto fail = [&](Status s) -> Result<uint64_t> {
    spare_events_.push_back(event);
    return s;
  };

  ncclResult_t end = ncclSuccess;
  {
    std::lock_guard lock(mu_);
    if (!comm_) return fail(ended());
    if (ncclResult_t r = nccl().ncclGroupStart(); r != ncclSuccess)
      return fail(nccl_error(nccl(), r, "ncclGroupStart", comm_));
    Status first;
    for (const DeviceOp& op : ops) {
      Status s = enqueue_locked(op);
      if (first.is_ok() && !s.is_ok()) first = s;
    }
    // The group is closed even after a failed op: NCCL's group state is per thread.
    end = nccl().ncclGroupEnd();
    if (!first.is_ok()) return fail(first);
  }
  if (end != ncclSuccess && end != ncclInProgress)
    return fail(nccl_error(nccl(), end, "ncclGroupEnd", nullptr));
  if (end == ncclInProgress) {
    Status s = wait_settled("ncclGroupEnd", Clock::now() + kEnqueueTimeout);
    if (s.code() == Code::InProgress)
      return fail(Status(Code::Timeout, "ncclGroupEnd still in progress after " +
                                            std::to_string(kEnqueueTimeout.count()) +
                                            " s (do all ranks launch the same ops?)"));
    if (!s.is_ok()) return fail(s);
  }

  if (cudaError_t err = cuda().cudaEventRecord(event, stream_); err != cudaSuccess)
    return fail(cuda_error(err, "cudaEventRecord (communicator's stream)"));
  for (cudaStream_t caller : callers) {
    if (cudaError_t err = cuda().cudaStreamWaitEvent(caller, event, 0); err != cudaSuccess)
      return fail(cuda_error(err, "cudaStreamWaitEvent (caller's stream)"));
  }
  uint64_t batch = next_batch_++;
  batches_.emplace(batch, event);
  return batch;
}

Result<bool> NcclComm::done(uint64_t batch) {
  auto it = batches_.find(batch);
  if (it == batches_.end())
    return Status(Code::InvalidArgument,
                  "no launched batch " + std::to_string(batch) + " (already reported done?)");
  cudaError_t err = cuda().cudaEventQuery(it->second);
  if (err == cudaErrorNotReady) return false;
  if (err != cudaSuccess) return cuda_error(err, "cudaEventQuery");
  spare_events_.push_back(it->second);
  batches_.erase(it);
  return true;
}

void NcclComm::abort() {
  if (aborted_.exchange(true)) return;
  std::lock_guard lock(mu_);
  if (comm_) nccl().ncclCommAbort(comm_);
  comm_ = nullptr;
}

Status NcclComm::finalize(int64_t timeout_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  {
    std::lock_guard lock(mu_);
    if (!comm_) return ended();
    ncclResult_t r = nccl().ncclCommFinalize(comm_);
    if (r != ncclSuccess && r != ncclInProgress) {
      Status s = nccl_error(nccl(), r, "ncclCommFinalize", comm_);
      nccl().ncclCommAbort(comm_);
      comm_ = nullptr;
      aborted_ = true;
      return s;
    }
  }
  Status s = wait_settled("ncclCommFinalize", deadline);
  if (!s.is_ok()) {
    abort();
    if (s.code() == Code::InProgress)
      return Status(Code::Timeout, "ncclCommFinalize did not finish within " +
                                       std::to_string(timeout_ms) +
                                       " ms; the communicator was aborted");
    return s;
  }
  std::lock_guard lock(mu_);
  if (!comm_) return ended();
  ncclResult_t r = nccl().ncclCommDestroy(comm_);
  comm_ = nullptr;
  finalized_ = true;
  if (r != ncclSuccess) return nccl_error(nccl(), r, "ncclCommDestroy", nullptr);
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<DeviceComm>> start_nccl_comm(std::shared_ptr<const LoadedApis> api,
                                                    const std::string& id, int rank, int size,
                                                    int ordinal) {
  auto comm = std::make_unique<NcclComm>(std::move(api), ordinal);
  if (Status s = comm->start(id, rank, size); !s.is_ok()) return s;
  return std::unique_ptr<DeviceComm>(std::move(comm));
}

}  // namespace taiji
