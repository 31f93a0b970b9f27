#include "absl/strings/str_cat.h"
#include "smla/kernels/backend.h"
#include "smla/kernels/cpu_backend.h"

#if defined(SMLA_WITH_CUDA) || defined(SMLA_WITH_HIP)
#include "smla/kernels/gpu_backend.h"
#endif

namespace smla::kernels {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(BackendChoice choice,
                                                       const BackendOptions& options) {
  switch (choice) {
    case BackendChoice::kCpu:
      return CreateCpuBackend(options);
    case BackendChoice::kCuda:
    case BackendChoice::kHip: {
#if defined(SMLA_WITH_CUDA)
      if (choice == BackendChoice::kCuda) return CreateGpuBackend(options);
#elif defined(SMLA_WITH_HIP)
      if (choice == BackendChoice::kHip) return CreateGpuBackend(options);
#endif
      return absl::UnimplementedError(
          absl::StrCat("backend '", choice == BackendChoice::kCuda ? "cuda" : "hip",
                       "' is not compiled into this build (configure with -DSMLA_GPU_BACKEND=",
                       choice == BackendChoice::kCuda ? "cuda" : "hip", ")"));
    }
    case BackendChoice::kAuto: {
#if defined(SMLA_WITH_CUDA) || defined(SMLA_WITH_HIP)
      if (GpuDevicePresent(options.device_ordinal)) return CreateGpuBackend(options);
#endif
      return CreateCpuBackend(options);
    }
  }
  return absl::InvalidArgumentError("unknown backend choice");
}

}  // namespace smla::kernels
