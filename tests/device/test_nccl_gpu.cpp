// The NCCL communicator on a real GPU, one rank in this process: init, one group of every
// kind, the fences with the caller's stream, finalize and abort. It needs a GPU, so it is
// not among the meson tests; scripts/gpu-check.sh runs it (tag device_gpu) and it fails
// where no device is usable.
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "device/nccl_loader.h"
#include "device/nccl_runtime.h"

using namespace taiji;

namespace {

// What the test itself does with the device: allocate, copy, synchronise. Same library as
// the runtime's (the loader shares an open one), so the same context.
struct TestCuda {
  // cuda_runtime.h adds a template overload of cudaMalloc: this is the plain one.
  cudaError_t (*cudaMalloc)(void**, size_t) = nullptr;
  decltype(&::cudaFree) cudaFree = nullptr;
  decltype(&::cudaMemcpy) cudaMemcpy = nullptr;
  decltype(&::cudaMemcpyAsync) cudaMemcpyAsync = nullptr;
  decltype(&::cudaStreamCreate) cudaStreamCreate = nullptr;
  decltype(&::cudaStreamDestroy) cudaStreamDestroy = nullptr;
  decltype(&::cudaStreamSynchronize) cudaStreamSynchronize = nullptr;
  decltype(&::cudaLaunchHostFunc) cudaLaunchHostFunc = nullptr;

  TestCuda() {
    void* lib = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
    REQUIRE(lib != nullptr);
    resolve(lib, "cudaMalloc", &cudaMalloc);
    resolve(lib, "cudaFree", &cudaFree);
    resolve(lib, "cudaMemcpy", &cudaMemcpy);
    resolve(lib, "cudaMemcpyAsync", &cudaMemcpyAsync);
    resolve(lib, "cudaStreamCreate", &cudaStreamCreate);
    resolve(lib, "cudaStreamDestroy", &cudaStreamDestroy);
    resolve(lib, "cudaStreamSynchronize", &cudaStreamSynchronize);
    resolve(lib, "cudaLaunchHostFunc", &cudaLaunchHostFunc);
  }

  template <typename F>
  static void resolve(void* lib, const char* name, F* out) {
    *out = reinterpret_cast<F>(dlsym(lib, name));
    INFO(name);
    REQUIRE(*out != nullptr);
  }

  void* alloc(size_t bytes) {
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, bytes) == cudaSuccess);
    return p;
  }
};

std::shared_ptr<DeviceRuntime> gpu_runtime() {
  std::shared_ptr<DeviceRuntime> runtime = load_nccl_runtime({});
  INFO(runtime->describe());
  REQUIRE(runtime->usable().is_ok());
  return runtime;
}

std::unique_ptr<DeviceComm> ready_comm(DeviceRuntime& runtime) {
  Result<std::string> id = runtime.make_id();
  REQUIRE(id.is_ok());
  REQUIRE(id.value().size() == 128);
  auto comm = runtime.create_comm(id.value(), 0, 1, 0);
  INFO(comm.status().message());
  REQUIRE(comm.is_ok());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  Status s = comm.value()->init_status();
  while (s.code() == Code::InProgress && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    s = comm.value()->init_status();
  }
  INFO(s.message());
  REQUIRE(s.is_ok());
  return std::move(comm.value());
}

void wait_done(DeviceComm& comm, uint64_t batch) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    Result<bool> d = comm.done(batch);
    INFO(d.status().message());
    REQUIRE(d.is_ok());
    if (d.value()) return;
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

TEST_CASE("one rank runs a group of every kind, fenced with the caller's stream",
          "[device_gpu]") {
  auto runtime = gpu_runtime();
  TestCuda cuda;
  auto comm = ready_comm(*runtime);

  constexpr size_t n = 1 << 20;
  constexpr size_t bytes = n * sizeof(float);
  std::vector<float> input(n);
  for (size_t i = 0; i < n; ++i) input[i] = static_cast<float>(i % 1000) * 0.5f;
  auto* a = static_cast<float*>(cuda.alloc(bytes));
  int on_host = 0;
  CHECK(runtime->place(a).device);
  CHECK(runtime->place(a).ordinal == 0);
  CHECK_FALSE(runtime->place(&on_host).device);

  // NCCL does not order the ops of one group among themselves: each reads `a` and writes
  // a buffer of its own. With one rank each result is the input.
  std::vector<float*> out(5);
  for (float*& o : out) o = static_cast<float*>(cuda.alloc(bytes));
  cudaStream_t stream = nullptr;
  REQUIRE(cuda.cudaStreamCreate(&stream) == cudaSuccess);
  // The upload, the group and the downloads are queued without a host wait between them:
  // only the fences order them.
  REQUIRE(cuda.cudaMemcpyAsync(a, input.data(), bytes, cudaMemcpyHostToDevice, stream) ==
          cudaSuccess);
  Result<uint64_t> fence = runtime->record_fence(stream, 0);
  INFO(fence.status().message());
  REQUIRE(fence.is_ok());
  std::vector<DeviceOp> ops = {
      {OpKind::Allreduce, DType::F32, RedOp::Sum, n, 0, a, out[0], stream, fence.value()},
      {OpKind::Broadcast, DType::F32, RedOp::Sum, n, 0, a, out[1], stream, fence.value()},
      {OpKind::Allgather, DType::F32, RedOp::Sum, n, 0, a, out[2], stream, fence.value()},
      {OpKind::Reduce, DType::F32, RedOp::Max, n, 0, a, out[3], stream, fence.value()},
      {OpKind::ReduceScatter, DType::F32, RedOp::Avg, n, 0, a, out[4], stream, fence.value()}};
  Result<uint64_t> batch = comm->launch(ops);
  runtime->release_fence(fence.value());
  INFO(batch.status().message());
  REQUIRE(batch.is_ok());
  std::vector<std::vector<float>> got(out.size(), std::vector<float>(n));
  for (size_t i = 0; i < out.size(); ++i)
    REQUIRE(cuda.cudaMemcpyAsync(got[i].data(), out[i], bytes, cudaMemcpyDeviceToHost, stream) ==
            cudaSuccess);
  wait_done(*comm, batch.value());
  REQUIRE(cuda.cudaStreamSynchronize(stream) == cudaSuccess);
  for (size_t i = 0; i < out.size(); ++i) {
    INFO(op_kind_name(ops[i].kind));
    CHECK(std::memcmp(got[i].data(), input.data(), bytes) == 0);
  }

  // The default stream as the caller's, and an in-place broadcast (no send buffer).
  fence = runtime->record_fence(nullptr, 0);
  REQUIRE(fence.is_ok());
  std::vector<DeviceOp> on_default = {
      {OpKind::Broadcast, DType::F32, RedOp::Sum, n, 0, nullptr, out[0], nullptr, fence.value()}};
  batch = comm->launch(on_default);
  runtime->release_fence(fence.value());
  REQUIRE(batch.is_ok());
  wait_done(*comm, batch.value());
  REQUIRE(cuda.cudaMemcpy(got[0].data(), out[0], bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(std::memcmp(got[0].data(), input.data(), bytes) == 0);

  CHECK(comm->done(batch.value()).status().code() == Code::InvalidArgument);
  std::vector<DeviceOp> gather = {
      {OpKind::Gather, DType::F32, RedOp::Sum, n, 0, a, out[0], nullptr}};
  CHECK(comm->launch(gather).status().code() == Code::Unsupported);
  CHECK(comm->async_error().is_ok());

  CHECK(comm->finalize(10000).is_ok());
  CHECK(comm->async_error().code() == Code::Finalized);
  on_default[0].fence = 0;
  CHECK(comm->launch(on_default).status().code() == Code::Finalized);
  comm.reset();
  REQUIRE(cuda.cudaStreamDestroy(stream) == cudaSuccess);
  cuda.cudaFree(a);
  for (float* o : out) cuda.cudaFree(o);
}

namespace {

// Holds the stream it runs on until the test lets it go (or 30 s pass).
void CUDART_CB hold_stream(void* flag) {
  auto* released = static_cast<std::atomic<bool>*>(flag);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!released->load() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
}

}  // namespace

TEST_CASE("an op waits for its stream up to its fence, not for work queued after it",
          "[device_gpu]") {
  auto runtime = gpu_runtime();
  TestCuda cuda;
  auto comm = ready_comm(*runtime);
  constexpr size_t n = 1024;
  auto* a = static_cast<float*>(cuda.alloc(n * sizeof(float)));
  cudaStream_t stream = nullptr;
  REQUIRE(cuda.cudaStreamCreate(&stream) == cudaSuccess);
  Result<uint64_t> fence = runtime->record_fence(stream, 0);
  REQUIRE(fence.is_ok());
  // Queued after the fence: work that waits for the op's result, as a caller may queue
  // between its post and the launch. Waiting for it would never end.
  std::atomic<bool> released{false};
  REQUIRE(cuda.cudaLaunchHostFunc(stream, hold_stream, &released) == cudaSuccess);
  std::vector<DeviceOp> ops = {
      {OpKind::Allreduce, DType::F32, RedOp::Sum, n, 0, a, a, stream, fence.value()}};
  Result<uint64_t> batch = comm->launch(ops);
  runtime->release_fence(fence.value());
  INFO(batch.status().message());
  REQUIRE(batch.is_ok());
  bool done = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done && std::chrono::steady_clock::now() < deadline) {
    Result<bool> d = comm->done(batch.value());
    REQUIRE(d.is_ok());
    done = d.value();
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  released = true;
  CHECK(done);
  REQUIRE(cuda.cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(comm->finalize(10000).is_ok());
  comm.reset();
  REQUIRE(cuda.cudaStreamDestroy(stream) == cudaSuccess);
  cuda.cudaFree(a);
}

TEST_CASE("an aborted communicator refuses everything after", "[device_gpu]") {
  auto runtime = gpu_runtime();
  auto comm = ready_comm(*runtime);
  comm->abort();
  comm->abort();
  CHECK(comm->init_status().code() == Code::Aborted);
  CHECK(comm->async_error().code() == Code::Aborted);
  std::vector<DeviceOp> ops = {{OpKind::Allreduce, DType::F32, RedOp::Sum, 0, 0, nullptr,
                                nullptr, nullptr}};
  CHECK(comm->launch(ops).status().code() == Code::Aborted);
  CHECK(comm->finalize(1000).code() == Code::Aborted);
}

TEST_CASE("create_comm checks its arguments", "[device_gpu]") {
  auto runtime = gpu_runtime();
  std::string id = runtime->make_id().value();
  CHECK(runtime->create_comm("short", 0, 1, 0).status().code() == Code::InvalidArgument);
  CHECK(runtime->create_comm(id, 1, 1, 0).status().code() == Code::InvalidArgument);
  CHECK(runtime->create_comm(id, 0, 1, 4096).status().code() == Code::InvalidArgument);
}
