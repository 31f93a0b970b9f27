// The GPU backend (CUDA on sm_90a, HIP on gfx950) from one kernel source. Only present in
// builds configured with SMLA_GPU_BACKEND=cuda or hip.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "smla/kernels/backend.h"

namespace smla::kernels {

// Whether a usable device exists at `ordinal` (no error when the driver or device is absent).
bool GpuDevicePresent(int32_t ordinal);

absl::StatusOr<std::unique_ptr<Backend>> CreateGpuBackend(const BackendOptions& options = {});

}  // namespace smla::kernels
