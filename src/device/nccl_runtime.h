// The process's GPU runtime: the CUDA runtime and NCCL, loaded with dlopen on first use so
// that libtaiji neither links them nor needs them on a machine without a GPU. Without a
// visible device NCCL is not even opened (it maps over 200 MB, and ncclGetUniqueId would
// start a listening socket); the runtime then says why in usable().
#pragma once

#include <memory>
#include <string>

#include "device/device_api.h"

namespace taiji {

struct DeviceLoadOptions {
  // Auto: device ops where a GPU and NCCL are usable. On: the user demanded them; usable()
  // still answers NoDevice when they are not, its text starting "TAIJI_NCCL=on but", and
  // the caller decides whether that is fatal. Off: no device ops, nothing is loaded.
  enum class Mode { Auto, On, Off } mode = Mode::Auto;
  std::string nccl_library;  // "": libnccl.so.2 from the loader's search path
  std::string cuda_library;  // "": libcudart.so.13, then libcudart.so
};

// The process's runtime, loaded on the first call with that call's options; later calls
// get the same object, whatever their options. Thread-safe; the first call blocks while
// the libraries load (the CUDA runtime's device query; NCCL only with a device). Never
// throws and never returns null.
std::shared_ptr<DeviceRuntime> device_runtime(const DeviceLoadOptions& options);

// Tests: every later device_runtime() call returns `runtime`; null goes back to the real
// one (loaded on the next call if it never was). Thread-safe.
void install_device_runtime_for_testing(std::shared_ptr<DeviceRuntime> runtime);

// The real loader, not cached: each call loads (a library already open is shared by the
// dynamic loader). For tests of the loader itself. Never throws, never returns null.
std::shared_ptr<DeviceRuntime> load_nccl_runtime(const DeviceLoadOptions& options);

}  // namespace taiji
