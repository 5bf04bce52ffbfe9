// taiji-device-info: what the device backend finds here (the CUDA runtime, the driver, NCCL
// and the devices, or why not), as libtaiji's loader sees it. Exits 0 when device ops can
// run, 77 when they cannot, 2 on a usage error.
#include <cstdio>
#include <cstring>

#include "device/nccl_runtime.h"

int main(int argc, char** argv) {
  taiji::DeviceLoadOptions options;
  for (int i = 1; i < argc; ++i) {
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (std::strcmp(argv[i], "--on") == 0) {
      options.mode = taiji::DeviceLoadOptions::Mode::On;
    } else if (std::strcmp(argv[i], "--nccl") == 0 && next) {
      options.nccl_library = argv[++i];
    } else if (std::strcmp(argv[i], "--cudart") == 0 && next) {
      options.cuda_library = argv[++i];
    } else {
      std::fprintf(stderr, "usage: taiji-device-info [--on] [--nccl PATH] [--cudart PATH]\n");
      return 2;
    }
  }
  auto runtime = taiji::device_runtime(options);
  std::printf("%s\n", runtime->describe().c_str());
  return runtime->usable().is_ok() ? 0 : 77;
}
