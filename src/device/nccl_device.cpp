#include "device/nccl_device.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "device/nccl_comm.h"
#include "device/nccl_loader.h"

namespace taiji {

namespace {

class NcclRuntime final : public DeviceRuntime {
 public:
  NcclRuntime(std::shared_ptr<const LoadedApis> api, int devices, std::string description)
      : api_(std::move(api)), devices_(devices), description_(std::move(description)) {}
  ~NcclRuntime() override {
    for (auto& [ordinal, events] : spare_fences_)
      for (cudaEvent_t event : events) api_->cuda.cudaEventDestroy(event);
    for (auto& [fence, ordinal] : lent_fences_)
      api_->cuda.cudaEventDestroy(reinterpret_cast<cudaEvent_t>(static_cast<uintptr_t>(fence)));
  }
  NcclRuntime(const NcclRuntime&) = delete;
  NcclRuntime& operator=(const NcclRuntime&) = delete;

  Status usable() const override { return Status::ok(); }

  MemoryPlace place(const void* ptr) const override {
    if (!ptr) return {};
    cudaPointerAttributes attr{};
    cudaError_t err = api_->cuda.cudaPointerGetAttributes(&attr, ptr);
    if (err != cudaSuccess) {
      // Older runtimes fail for memory they never saw, and leave the error to be
      // returned by the caller's next CUDA call: clear it.
      api_->cuda.cudaGetLastError();
      return {};
    }
    if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged)
      return {true, attr.device};
    return {};
  }

  Result<std::string> make_id() override {
    ncclUniqueId id;
    if (ncclResult_t r = api_->nccl.ncclGetUniqueId(&id); r != ncclSuccess)
      return nccl_error(api_->nccl, r, "ncclGetUniqueId", nullptr);
    return std::string(id.internal, NCCL_UNIQUE_ID_BYTES);
  }

  Result<std::unique_ptr<DeviceComm>> create_comm(const std::string& id, int rank, int size,
                                                  int ordinal) override {
    if (id.size() != NCCL_UNIQUE_ID_BYTES)
      return Status(Code::InvalidArgument, "an NCCL id has " +
                                               std::to_string(NCCL_UNIQUE_ID_BYTES) +
                                               " bytes, not " + std::to_string(id.size()));
    if (size < 1 || rank < 0 || rank >= size)
      return Status(Code::InvalidArgument, "rank " + std::to_string(rank) + " of " +
                                               std::to_string(size) + " ranks");
    if (ordinal < 0 || ordinal >= devices_)
      return Status(Code::InvalidArgument, "device " + std::to_string(ordinal) + " of " +
                                               std::to_string(devices_) + " visible here");
    return start_nccl_comm(api_, id, rank, size, ordinal);
  }

  Status copy(void* dst, const void* src, uint64_t bytes, bool to_device, int ordinal,
              void* stream) override {
    if (bytes == 0) return Status::ok();
    const auto& cuda = api_->cuda;
    auto failed = [&](const char* call, cudaError_t err) {
      cuda.cudaGetLastError();
      return Status(Code::Internal, std::string(call) + ": " + cuda_error_text(cuda, err));
    };
    if (cudaError_t err = cuda.cudaSetDevice(ordinal); err != cudaSuccess) return failed("cudaSetDevice", err);
    auto s = static_cast<cudaStream_t>(stream);
    if (cudaError_t err = cuda.cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice
                                                                          : cudaMemcpyDeviceToHost, s);
        err != cudaSuccess) {
      return failed("cudaMemcpyAsync", err);
    }
    if (cudaError_t err = cuda.cudaStreamSynchronize(s); err != cudaSuccess) return failed("cudaStreamSynchronize", err);
    return Status::ok();
  }

  std::string describe() const override { return description_; }

  // A fence is an event recorded on the caller's stream; its handle is the cudaEvent_t
  // itself, which the communicator's launch waits on (nccl_comm.cpp). Events come from a
  // pool per device: posting threads record, the executor's thread releases.
  Result<uint64_t> record_fence(void* stream, int ordinal) override {
    if (ordinal < 0 || ordinal >= devices_)
      return Status(Code::InvalidArgument, "device " + std::to_string(ordinal) + " of " +
                                               std::to_string(devices_) + " visible here");
    const auto& cuda = api_->cuda;
    auto failed = [&](const char* call, cudaError_t err) {
      cuda.cudaGetLastError();
      return Status(Code::Internal, std::string(call) + ": " + cuda_error_text(cuda, err));
    };
    // The event is made on, and a null stream means, device `ordinal`: it is made current
    // for the calls, then the caller's is restored.
    int current = 0;
    if (cudaError_t err = cuda.cudaGetDevice(&current); err != cudaSuccess)
      return failed("cudaGetDevice", err);
    if (current != ordinal) {
      if (cudaError_t err = cuda.cudaSetDevice(ordinal); err != cudaSuccess)
        return failed("cudaSetDevice", err);
    }
    Result<uint64_t> fence = record_on(stream, ordinal);
    if (current != ordinal) {
      if (cudaError_t err = cuda.cudaSetDevice(current); err != cudaSuccess) {
        release_fence(fence.is_ok() ? fence.value() : 0);
        return failed("cudaSetDevice (restoring the caller's device)", err);
      }
    }
    return fence;
  }

  void release_fence(uint64_t fence) override {
    if (fence == 0) return;
    std::lock_guard lock(fence_mu_);
    auto it = lent_fences_.find(fence);
    if (it == lent_fences_.end()) return;
    spare_fences_[it->second].push_back(
        reinterpret_cast<cudaEvent_t>(static_cast<uintptr_t>(fence)));
    lent_fences_.erase(it);
  }

 private:
  // record_fence with device `ordinal` current.
  Result<uint64_t> record_on(void* stream, int ordinal) {
    const auto& cuda = api_->cuda;
    cudaEvent_t event = nullptr;
    {
      std::lock_guard lock(fence_mu_);
      std::vector<cudaEvent_t>& spare = spare_fences_[ordinal];
      if (!spare.empty()) {
        event = spare.back();
        spare.pop_back();
      }
    }
    if (!event) {
      if (cudaError_t err = cuda.cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
          err != cudaSuccess) {
        cuda.cudaGetLastError();
        return Status(Code::Internal,
                      "cudaEventCreateWithFlags: " + cuda_error_text(cuda, err));
      }
    }
    // The legacy default stream by name, as the communicator's launch names it.
    auto s = stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy;
    cudaError_t err = cuda.cudaEventRecord(event, s);
    std::lock_guard lock(fence_mu_);
    if (err != cudaSuccess) {
      spare_fences_[ordinal].push_back(event);
      cuda.cudaGetLastError();
      return Status(Code::Internal,
                    "cudaEventRecord (the caller's stream): " + cuda_error_text(cuda, err));
    }
    auto fence = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(event));
    lent_fences_[fence] = ordinal;
    return fence;
  }

  std::shared_ptr<const LoadedApis> api_;
  const int devices_;
  const std::string description_;
  std::mutex fence_mu_;
  std::map<int, std::vector<cudaEvent_t>> spare_fences_;  // by device; under fence_mu_
  std::unordered_map<uint64_t, int> lent_fences_;         // fence -> device; under fence_mu_
};

// CUDA's version numbers are 1000 * major + 10 * minor.
std::string cuda_version_text(int code) {
  return std::to_string(code / 1000) + "." + std::to_string(code % 1000 / 10);
}

// NCCL's (since 2.9) are 10000 * major + 100 * minor + patch.
std::string nccl_version_text(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code % 10000 / 100) + "." +
         std::to_string(code % 100);
}

}  // namespace

Result<std::shared_ptr<DeviceRuntime>> open_nccl_runtime(const DeviceLoadOptions& options) {
  const std::string prefix = options.mode == DeviceLoadOptions::Mode::On ? "TAIJI_NCCL=on but " : "";
  auto api = std::make_shared<LoadedApis>();
  if (Status s = load_cuda_symbols(options.cuda_library, &api->cuda); !s.is_ok())
    return Status(s.code(), prefix + s.message());
  int devices = 0;
  if (cudaError_t err = api->cuda.cudaGetDeviceCount(&devices); err != cudaSuccess) {
    api->cuda.cudaGetLastError();
    return Status(Code::NoDevice, prefix + "no usable GPU: cudaGetDeviceCount: " +
                                      cuda_error_text(api->cuda, err));
  }
  if (devices < 1)
    return Status(Code::NoDevice, prefix + "no usable GPU: cudaGetDeviceCount found none");
  // Only now, with a device to use, is NCCL worth opening.
  if (Status s = load_nccl_symbols(options.nccl_library, &api->nccl); !s.is_ok())
    return Status(s.code(), prefix + s.message());

  int runtime = 0, driver = 0, nccl = 0;
  api->cuda.cudaRuntimeGetVersion(&runtime);
  api->cuda.cudaDriverGetVersion(&driver);
  api->nccl.ncclGetVersion(&nccl);
  std::string description = "CUDA runtime " + cuda_version_text(runtime) + ", driver " +
                            cuda_version_text(driver) + ", NCCL " + nccl_version_text(nccl) +
                            ", " + std::to_string(devices) +
                            (devices == 1 ? " device" : " devices");
  return std::shared_ptr<DeviceRuntime>(
      std::make_shared<NcclRuntime>(std::move(api), devices, std::move(description)));
}

}  // namespace taiji
