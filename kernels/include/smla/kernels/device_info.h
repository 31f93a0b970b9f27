// Facts about the device a backend runs on, read once at start-up and passed around.
#pragma once

#include <cstdint>
#include <string>

namespace smla::kernels {

enum class BackendKind : uint8_t { kCpu = 0, kCuda = 1, kHip = 2 };

struct DeviceInfo {
  BackendKind kind = BackendKind::kCpu;
  std::string name;           // "cpu (2 threads)", "NVIDIA H200", ...
  std::string arch;           // "x86_64", "sm_90a", "gfx950"
  int32_t compute_units = 1;  // SMs / CUs / worker threads
  int32_t warp_size = 1;
  int64_t l2_bytes = 0;
  int64_t shared_memory_per_block = 0;
  int64_t total_memory = 0;
};

std::string_view BackendKindName(BackendKind k);

}  // namespace smla::kernels
