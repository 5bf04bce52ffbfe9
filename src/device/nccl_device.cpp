#include "device/nccl_device.h"

#include <string>

#include "device/nccl_comm.h"
#include "device/nccl_loader.h"

namespace taiji {

namespace {

class NcclRuntime final : public DeviceRuntime {
 public:
  NcclRuntime(std::shared_ptr<const LoadedApis> api, int devices, std::string description)
      : api_(std::move(api)), devices_(devices), description_(std::move(description)) {}

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

 private:
  std::shared_ptr<const LoadedApis> api_;
  const int devices_;
  const std::string description_;
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
