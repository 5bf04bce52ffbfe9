// The CUDA runtime and NCCL functions the device backend calls, resolved with dlsym from
// libraries opened at run time. Built only with NCCL's headers (TAIJI_HAVE_NCCL): each
// pointer's type is the header's own declaration, so a prototype cannot drift from it.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "common/status.h"

namespace taiji {

#define TAIJI_CUDA_FUNCTIONS(X) \
  X(cudaGetDeviceCount)         \
  X(cudaGetErrorString)         \
  X(cudaGetErrorName)           \
  X(cudaGetLastError)           \
  X(cudaRuntimeGetVersion)      \
  X(cudaDriverGetVersion)       \
  X(cudaPointerGetAttributes)   \
  X(cudaGetDevice)              \
  X(cudaSetDevice)              \
  X(cudaStreamCreateWithFlags)  \
  X(cudaStreamDestroy)          \
  X(cudaStreamWaitEvent)        \
  X(cudaStreamSynchronize)      \
  X(cudaMemcpyAsync)            \
  X(cudaEventCreateWithFlags)   \
  X(cudaEventRecord)            \
  X(cudaEventQuery)             \
  X(cudaEventDestroy)

#define TAIJI_NCCL_FUNCTIONS(X) \
  X(ncclGetVersion)             \
  X(ncclGetUniqueId)            \
  X(ncclCommInitRankConfig)     \
  X(ncclCommGetAsyncError)      \
  X(ncclCommAbort)              \
  X(ncclCommFinalize)           \
  X(ncclCommDestroy)            \
  X(ncclGroupStart)             \
  X(ncclGroupEnd)               \
  X(ncclAllReduce)              \
  X(ncclBroadcast)              \
  X(ncclReduce)                 \
  X(ncclAllGather)              \
  X(ncclReduceScatter)          \
  X(ncclGetErrorString)         \
  X(ncclGetLastError)

#define TAIJI_API_POINTER_(name) decltype(&::name) name = nullptr;

struct CudaApi {
  TAIJI_CUDA_FUNCTIONS(TAIJI_API_POINTER_)
};

struct NcclApi {
  TAIJI_NCCL_FUNCTIONS(TAIJI_API_POINTER_)
};

#undef TAIJI_API_POINTER_

// Both libraries, loaded; shared by the runtime and its communicators, which keep it alive.
struct LoadedApis {
  CudaApi cuda;
  NcclApi nccl;
};

// Opens the CUDA runtime (`path`; "": libcudart.so.13, then libcudart.so) and resolves
// every function of CudaApi. Ok, or NoDevice naming the library and dlerror()'s text.
// A library that loaded stays open for the process (the CUDA runtime keeps threads and
// exit handlers in it); one that lacks a function is closed again.
Status load_cuda_symbols(const std::string& path, CudaApi* api);

// The same for NCCL (`path`; "": libnccl.so.2). Loads NCCL but calls nothing in it.
Status load_nccl_symbols(const std::string& path, NcclApi* api);

// "cudaErrorInsufficientDriver: CUDA driver version is insufficient ..." for `err`.
std::string cuda_error_text(const CudaApi& api, cudaError_t err);

// The status for a failed NCCL call: its code (nccl_result_code), the call, NCCL's name
// for the result and its last-error text. `comm` may be null.
Status nccl_error(const NcclApi& api, ncclResult_t result, const char* call, ncclComm_t comm);

}  // namespace taiji
