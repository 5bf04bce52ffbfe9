// One NCCL communicator as a DeviceComm (NCCL builds only).
#pragma once

#include <memory>
#include <string>

#include "device/device_api.h"
#include "device/nccl_loader.h"

namespace taiji {

// Starts a non-blocking communicator (ncclCommInitRankConfig, blocking = 0) on device
// `ordinal` with its own non-blocking stream, as `rank` of `size`; `id` is the 128 bytes
// of an ncclUniqueId. Runs on the calling thread and makes `ordinal` its current device.
// The arguments are the caller's to check (DeviceRuntime::create_comm does).
Result<std::unique_ptr<DeviceComm>> start_nccl_comm(std::shared_ptr<const LoadedApis> api,
                                                    const std::string& id, int rank, int size,
                                                    int ordinal);

}  // namespace taiji
