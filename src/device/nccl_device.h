// The runtime over the CUDA runtime and NCCL loaded with dlopen (NCCL builds only).
#pragma once

#include <memory>

#include "device/device_api.h"
#include "device/nccl_runtime.h"

namespace taiji {

// Loads the CUDA runtime, counts the devices, and only when there is one loads NCCL.
// A usable runtime, or NoDevice saying which step failed (prefixed "TAIJI_NCCL=on but "
// in Mode::On). Does not look at Mode::Off: load_nccl_runtime does.
Result<std::shared_ptr<DeviceRuntime>> open_nccl_runtime(const DeviceLoadOptions& options);

}  // namespace taiji
