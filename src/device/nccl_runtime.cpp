#include "device/nccl_runtime.h"

#include <mutex>
#include <utility>

#if TAIJI_HAVE_NCCL
#include "device/nccl_device.h"
#endif

namespace taiji {

namespace {

// A process without device ops: every pointer is host memory and every device call fails
// with the reason.
class UnusableRuntime final : public DeviceRuntime {
 public:
  explicit UnusableRuntime(Status why) : why_(std::move(why)) {}
  Status usable() const override { return why_; }
  MemoryPlace place(const void*) const override { return {}; }
  Result<std::string> make_id() override { return why_; }
  Result<std::unique_ptr<DeviceComm>> create_comm(const std::string&, int, int, int) override {
    return why_;
  }
  Status copy(void*, const void*, uint64_t, bool, int, void*) override { return why_; }
  std::string describe() const override { return why_.message(); }
  Result<uint64_t> record_fence(void*, int) override { return why_; }
  void release_fence(uint64_t) override {}

 private:
  const Status why_;
};

// What load_nccl_runtime returns when not even the small object above can be allocated:
// made before main and handed out through shared_ptr's aliasing constructor, which
// allocates nothing, so that the loader never throws.
UnusableRuntime out_of_memory(Status(Code::NoDevice,
                                     "out of memory while loading the device runtime"));

struct Cache {
  std::mutex mu;
  std::shared_ptr<DeviceRuntime> loaded;     // the real one, once loaded
  std::shared_ptr<DeviceRuntime> installed;  // a test's, which wins while set
};

Cache& cache() {
  static Cache c;
  return c;
}

std::shared_ptr<DeviceRuntime> load(const DeviceLoadOptions& options) {
  using Mode = DeviceLoadOptions::Mode;
  if (options.mode == Mode::Off)
    return std::make_shared<UnusableRuntime>(
        Status(Code::NoDevice, "device ops are turned off (TAIJI_NCCL=off)"));
#if TAIJI_HAVE_NCCL
  Result<std::shared_ptr<DeviceRuntime>> opened = open_nccl_runtime(options);
  if (opened.is_ok()) return opened.value();
  return std::make_shared<UnusableRuntime>(opened.status());
#else
  const char* prefix = options.mode == Mode::On ? "TAIJI_NCCL=on but " : "";
  return std::make_shared<UnusableRuntime>(Status(
      Code::NoDevice,
      std::string(prefix) + "this libtaiji was built without NCCL (-Dnccl=disabled or no headers)"));
#endif
}

}  // namespace

std::shared_ptr<DeviceRuntime> load_nccl_runtime(const DeviceLoadOptions& options) {
  try {
    return load(options);
  } catch (...) {
    return std::shared_ptr<DeviceRuntime>(std::shared_ptr<void>(), &out_of_memory);
  }
}

std::shared_ptr<DeviceRuntime> device_runtime(const DeviceLoadOptions& options) {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  if (c.installed) return c.installed;
  if (!c.loaded) c.loaded = load_nccl_runtime(options);
  return c.loaded;
}

void install_device_runtime_for_testing(std::shared_ptr<DeviceRuntime> runtime) {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  c.installed = std::move(runtime);
}

}  // namespace taiji
