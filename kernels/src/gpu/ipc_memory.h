// Device memory of another process on this node, opened from its IPC handle (a GPU region,
// docs/architecture.md "GPU regions"): the backend copies from and to it like its own memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "smla/kernels/backend.h"

namespace smla::kernels::gpu {

// Opens the allocation behind `handle` (cudaIpcMemHandle_t / hipIpcMemHandle_t bytes) and
// returns its first `bytes` bytes, closed again when the Buffer goes. INVALID_ARGUMENT when
// the handle has the wrong size, names no allocation this device can reach, or the allocation
// holds fewer than `bytes` bytes (so no later copy can leave it).
absl::StatusOr<Buffer> OpenIpcMemory(std::span<const uint8_t> handle, size_t bytes);

}  // namespace smla::kernels::gpu
