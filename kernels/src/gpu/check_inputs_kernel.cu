// A step's input ranges checked on the device (Backend::CheckInputs): blocks of kCheckThreads
// threads share a range (blockIdx.y, striding over the ranges), each thread testing every stride-th
// word with the rules of input_checks.h that the CPU backend uses, and one atomic OR per block that
// found a value its check refuses.
#include <cstdint>
#include <cstring>

#include "gpu/kernel_params.h"
#include "smla/kernels/input_checks.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kCheckThreads = 256;
constexpr int kBlocksPerRange = 8;

// Whether any value of a 4-byte word is refused.
__device__ __forceinline__ bool WordRefused(InputCheck check, uint32_t w) {
  if (check == InputCheck::kKvRows) {
    return Bf16OutOfBounds(static_cast<uint16_t>(w)) ||
           Bf16OutOfBounds(static_cast<uint16_t>(w >> 16));
  }
  bool bad = false;
  for (int b = 0; b < 4; ++b) bad = bad || ByteRefused(check, static_cast<uint8_t>(w >> (8 * b)));
  return bad;
}

__global__ void __launch_bounds__(kCheckThreads)
    CheckInputsKernel(const __grid_constant__ CheckInputsParams p) {
  const int64_t stride = int64_t{gridDim.x} * kCheckThreads;
  const int64_t first = int64_t{blockIdx.x} * kCheckThreads + threadIdx.x;
  for (int32_t r = blockIdx.y; r < p.num_ranges; r += gridDim.y) {
    const CheckRange range = p.ranges[r];
    const InputCheck check = range.check;
    bool bad = false;
    if (reinterpret_cast<uintptr_t>(range.data) % 4 == 0 && range.bytes % 4 == 0) {
      const auto* w = reinterpret_cast<const uint32_t*>(range.data);
      for (int64_t i = first; i < range.bytes / 4; i += stride) {
        bad = bad || WordRefused(check, w[i]);
      }
    } else if (check == InputCheck::kKvRows) {
      for (int64_t i = first; i < range.bytes / 2; i += stride) {
        uint16_t bits;
        memcpy(&bits, range.data + 2 * i, 2);
        bad = bad || Bf16OutOfBounds(bits);
      }
    } else {
      for (int64_t i = first; i < range.bytes; i += stride) {
        bad = bad || ByteRefused(check, range.data[i]);
      }
    }
    // The range is the block's alike, so every thread reaches the barrier.
    if (__syncthreads_or(bad ? 1 : 0) != 0 && threadIdx.x == 0) {
      atomicOr(p.flags + range.group, kFlagInputValue);
    }
  }
}

}  // namespace

absl::Status LaunchCheckInputs(const CheckInputsParams& p, StreamHandle stream) {
  if (p.num_ranges == 0) return absl::OkStatus();
  const dim3 grid(kBlocksPerRange,
                  static_cast<unsigned>(p.num_ranges < 65535 ? p.num_ranges : 65535));
  CheckInputsKernel<<<grid, kCheckThreads, 0, stream>>>(p);
  return ToStatus(GetLastError(), "check-inputs kernel launch");
}

}  // namespace smla::kernels::gpu
