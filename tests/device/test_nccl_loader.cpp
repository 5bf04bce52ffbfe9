// The loader of the device runtime: the modes, the process-wide runtime and the test hook,
// and, on a machine without a GPU (where these tests normally run), that it says why and
// never opens NCCL. This tag runs in a process of its own, and only the Auto case (which
// comes first) may load NCCL, with a GPU: so "NCCL is not loaded" means nothing here did.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "device/nccl_runtime.h"

#if TAIJI_HAVE_NCCL
#include "device/nccl_loader.h"
#endif

using namespace taiji;
using Mode = DeviceLoadOptions::Mode;

namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

bool nccl_loaded() {
  void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (handle) dlclose(handle);
  return handle != nullptr;
}

DeviceLoadOptions with_mode(Mode mode) {
  DeviceLoadOptions options;
  options.mode = mode;
  return options;
}

// Stands in for the real runtime; says who it is.
class NamedRuntime final : public DeviceRuntime {
 public:
  explicit NamedRuntime(std::string name) : name_(std::move(name)) {}
  Status usable() const override { return Status::ok(); }
  MemoryPlace place(const void*) const override { return {true, 3}; }
  Result<std::string> make_id() override { return name_; }
  Result<std::unique_ptr<DeviceComm>> create_comm(const std::string&, int, int, int) override {
    return Status(Code::Unsupported, "not in this test");
  }
  Status copy(void*, const void*, uint64_t, bool, int, void*) override {
    return Status(Code::Unsupported, "not in this test");
  }
  std::string describe() const override { return name_; }
  Result<uint64_t> record_fence(void*, int) override {
    return Status(Code::Unsupported, "not in this test");
  }
  void release_fence(uint64_t) override {}

 private:
  std::string name_;
};

// Why no device is usable, as the loader words it on a machine without one.
void check_no_device_reason(const std::string& why, const std::string& prefix) {
#if TAIJI_HAVE_NCCL
  // The CUDA runtime loaded and found no device (the usual case here), or it is not
  // installed at all.
  bool counted = starts_with(why, prefix + "no usable GPU: cudaGetDeviceCount") &&
                 (contains(why, ": cudaError") || contains(why, "found none"));
  bool no_runtime = starts_with(why, prefix + "could not load the CUDA runtime: ");
  CHECK((counted || no_runtime));
#else
  CHECK(why == prefix + "this libtaiji was built without NCCL (-Dnccl=disabled or no headers)");
#endif
}

}  // namespace

TEST_CASE("Auto without a GPU says why and does not open NCCL", "[device_loader]") {
  std::shared_ptr<DeviceRuntime> runtime = load_nccl_runtime(with_mode(Mode::Auto));
  REQUIRE(runtime);
  Status usable = runtime->usable();
  INFO(usable.message());
  if (usable.is_ok()) {
    // A machine with a GPU: the runtime names what it loaded.
    CHECK(starts_with(runtime->describe(), "CUDA runtime "));
    CHECK(contains(runtime->describe(), ", NCCL 2."));
    return;
  }
  CHECK(usable.code() == Code::NoDevice);
  check_no_device_reason(usable.message(), "");
  CHECK(runtime->describe() == usable.message());
  CHECK_FALSE(nccl_loaded());

  int on_stack = 0;
  auto on_heap = std::make_unique<int>(0);
  CHECK_FALSE(runtime->place(&on_stack).device);
  CHECK(runtime->place(&on_stack).ordinal == -1);
  CHECK_FALSE(runtime->place(on_heap.get()).device);
  CHECK_FALSE(runtime->place(nullptr).device);
  // Without a device there is no id to make (ncclGetUniqueId would start a listener) and no
  // communicator.
  CHECK(runtime->make_id().status().code() == Code::NoDevice);
  CHECK(runtime->create_comm(std::string(128, '\0'), 0, 1, 0).status().code() == Code::NoDevice);
  CHECK_FALSE(nccl_loaded());
}

TEST_CASE("On without a GPU says that NCCL was demanded", "[device_loader]") {
  std::shared_ptr<DeviceRuntime> runtime = load_nccl_runtime(with_mode(Mode::On));
  REQUIRE(runtime);
  Status usable = runtime->usable();
  INFO(usable.message());
  if (usable.is_ok()) return;  // a machine with a GPU: the Auto case checks that
  CHECK(usable.code() == Code::NoDevice);
  check_no_device_reason(usable.message(), "TAIJI_NCCL=on but ");
  CHECK_FALSE(nccl_loaded());
}

TEST_CASE("Off loads nothing and says so", "[device_loader]") {
  std::shared_ptr<DeviceRuntime> runtime = load_nccl_runtime(with_mode(Mode::Off));
  REQUIRE(runtime);
  CHECK(runtime->usable().code() == Code::NoDevice);
  CHECK(runtime->usable().message() == "device ops are turned off (TAIJI_NCCL=off)");
  CHECK(runtime->describe() == "device ops are turned off (TAIJI_NCCL=off)");
  int x = 0;
  CHECK_FALSE(runtime->place(&x).device);
  CHECK(runtime->make_id().status().code() == Code::NoDevice);
}

TEST_CASE("A CUDA runtime that is not there is named", "[device_loader]") {
  DeviceLoadOptions options = with_mode(Mode::On);
  options.cuda_library = "/nonexistent/libcudart.so.13";
  Status usable = load_nccl_runtime(options)->usable();
  CHECK(usable.code() == Code::NoDevice);
#if TAIJI_HAVE_NCCL
  CHECK(starts_with(usable.message(), "TAIJI_NCCL=on but could not load the CUDA runtime: "));
  CHECK(contains(usable.message(), "/nonexistent/libcudart.so.13"));
#else
  CHECK(contains(usable.message(), "built without NCCL"));
#endif
}

TEST_CASE("The process's runtime is loaded once, and a test can stand in for it",
          "[device_loader]") {
  // The first call's options decide; this is the first call in this process.
  std::shared_ptr<DeviceRuntime> first = device_runtime(with_mode(Mode::Off));
  REQUIRE(first);
  CHECK(first->usable().message() == "device ops are turned off (TAIJI_NCCL=off)");
  CHECK(device_runtime(with_mode(Mode::Auto)) == first);
  CHECK(device_runtime(with_mode(Mode::On)) == first);

  auto fake = std::make_shared<NamedRuntime>("fake");
  install_device_runtime_for_testing(fake);
  CHECK(device_runtime(with_mode(Mode::Off)) == fake);
  CHECK(device_runtime({})->describe() == "fake");
  int x = 0;
  CHECK(device_runtime({})->place(&x).ordinal == 3);

  install_device_runtime_for_testing(nullptr);
  CHECK(device_runtime(with_mode(Mode::Auto)) == first);
}

#if TAIJI_HAVE_NCCL

TEST_CASE("An NCCL library that is not there is named", "[device_loader]") {
  NcclApi api;
  Status s = load_nccl_symbols("/nonexistent/dir/libnccl.so.2", &api);
  CHECK(s.code() == Code::NoDevice);
  CHECK(starts_with(s.message(), "could not load NCCL: "));
  CHECK(contains(s.message(), "/nonexistent/dir/libnccl.so.2"));
  CHECK(api.ncclAllReduce == nullptr);
}

TEST_CASE("A library without NCCL's functions is refused, naming the first missing",
          "[device_loader]") {
  NcclApi api;
  Status s = load_nccl_symbols("libm.so.6", &api);
  CHECK(s.code() == Code::NoDevice);
  CHECK(starts_with(s.message(), "NCCL lacks a function (too old?): "));
  CHECK(contains(s.message(), "ncclGetVersion"));
  CHECK(api.ncclGetVersion == nullptr);
  CudaApi cuda;
  Status c = load_cuda_symbols("libm.so.6", &cuda);
  CHECK(c.code() == Code::NoDevice);
  CHECK(contains(c.message(), "cudaGetDeviceCount"));
}

// Loads the real library, so it runs in a process of its own (tag device_nccl_symbols).
TEST_CASE("The installed NCCL has every function the backend calls", "[device_nccl_symbols]") {
  // Beside the headers the build used, else wherever the loader finds it.
  std::string path = "libnccl.so.2";
  for (const char* dir : {"/lib64/", "/lib/"}) {
    std::string candidate = std::string(TAIJI_TEST_NCCL_ROOT) + dir + "libnccl.so.2";
    if (access(candidate.c_str(), R_OK) == 0) {
      path = candidate;
      break;
    }
  }
  NcclApi api;
  Status s = load_nccl_symbols(path, &api);
  INFO(s.message());
  REQUIRE(s.is_ok());
  int version = 0;
  REQUIRE(api.ncclGetVersion(&version) == ncclSuccess);
  // Non-blocking communicators and ncclCommFinalize came in 2.14.
  CHECK(version >= NCCL_VERSION(2, 14, 0));
  CHECK(version / 10000 == NCCL_MAJOR);
  CHECK(std::string(api.ncclGetErrorString(ncclRemoteError)).size() > 0);
  CHECK(nccl_loaded());
}

#endif
