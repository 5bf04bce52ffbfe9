#include "device/nccl_loader.h"

#include <dlfcn.h>

#include <vector>

#include "device/nccl_types.h"

namespace taiji {

namespace {

std::string last_dlerror(const std::string& fallback) {
  const char* e = dlerror();
  return e ? std::string(e) : fallback;
}

// The first of `names` that opens, or null with every name's dlerror() text in `error`.
// RTLD_LOCAL: another copy of a library in the process (a framework's own NCCL) keeps its
// own symbols; RTLD_NOW: a library missing a dependency fails here, not at the first call.
void* open_first(const std::vector<std::string>& names, std::string* error) {
  for (const std::string& name : names) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    if (!error->empty()) *error += "; ";
    *error += last_dlerror(name + ": dlopen failed");
  }
  return nullptr;
}

template <typename F>
bool resolve(void* handle, const char* name, F* out, std::string* error) {
  dlerror();
  void* symbol = dlsym(handle, name);
  if (!symbol) {
    *error = last_dlerror(std::string(name) + ": no such symbol");
    return false;
  }
  *out = reinterpret_cast<F>(symbol);
  return true;
}

}  // namespace

Status load_cuda_symbols(const std::string& path, CudaApi* api) {
  std::vector<std::string> names = {path};
  if (path.empty()) names = {"libcudart.so.13", "libcudart.so"};
  std::string error;
  void* handle = open_first(names, &error);
  if (!handle) return Status(Code::NoDevice, "could not load the CUDA runtime: " + error);
  CudaApi loaded;
#define TAIJI_RESOLVE_(name)                         \
  if (!resolve(handle, #name, &loaded.name, &error)) { \
    dlclose(handle);                                  \
    return Status(Code::NoDevice, "the CUDA runtime lacks a function: " + error); \
  }
  TAIJI_CUDA_FUNCTIONS(TAIJI_RESOLVE_)
#undef TAIJI_RESOLVE_
  *api = loaded;
  return Status::ok();
}

Status load_nccl_symbols(const std::string& path, NcclApi* api) {
  std::string error;
  void* handle = open_first({path.empty() ? std::string("libnccl.so.2") : path}, &error);
  if (!handle) return Status(Code::NoDevice, "could not load NCCL: " + error);
  NcclApi loaded;
#define TAIJI_RESOLVE_(name)                                               \
  if (!resolve(handle, #name, &loaded.name, &error)) {                       \
    dlclose(handle);                                                        \
    return Status(Code::NoDevice, "NCCL lacks a function (too old?): " + error); \
  }
  TAIJI_NCCL_FUNCTIONS(TAIJI_RESOLVE_)
#undef TAIJI_RESOLVE_
  *api = loaded;
  return Status::ok();
}

std::string cuda_error_text(const CudaApi& api, cudaError_t err) {
  return std::string(api.cudaGetErrorName(err)) + ": " + api.cudaGetErrorString(err);
}

Status nccl_error(const NcclApi& api, ncclResult_t result, const char* call, ncclComm_t comm) {
  std::string text = std::string(call) + ": " + nccl_result_name(result) + " (" +
                     api.ncclGetErrorString(result) + ")";
  const char* last = api.ncclGetLastError(comm);
  if (last && *last) text += ": " + std::string(last);
  return Status(nccl_result_code(result), text);
}

}  // namespace taiji
