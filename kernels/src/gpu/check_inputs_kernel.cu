// A launch's inputs checked on the device in one kernel (Backend::CheckInputs), with the rules of
// input_checks.h that the CPU backend uses. The grid's first blocks check value ranges,
// kBlocksPerRange to a range, each thread testing every stride-th word; the rest translate chosen
// entries, one row per block. A block that found something refused sets its group's flag with one
// atomic OR. One kernel rather than two: on a small launch each kernel boundary costs about as
// much as the work (docs/architecture.md, "Input checks on the device").
#include <cstdint>
#include <cstring>

#include "gpu/kernel_params.h"
#include "smla/kernels/input_checks.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kCheckThreads = 256;
constexpr int kBlocksPerRange = 8;
constexpr int32_t kMaxRangeSlots = 1 << 13;  // ranges checked at once (then strided)
constexpr int32_t kMaxRowBlocks = 1 << 16;   // translate blocks (then strided)

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

// Blocks [0, range_slots * kBlocksPerRange) of the grid.
__device__ void CheckRanges(const CheckInputsParams& p, int32_t block, int32_t range_slots) {
  const int64_t stride = int64_t{kBlocksPerRange} * kCheckThreads;
  const int64_t first = int64_t{block % kBlocksPerRange} * kCheckThreads + threadIdx.x;
  for (int32_t r = block / kBlocksPerRange; r < p.num_ranges; r += range_slots) {
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

// The blocks after the range checks: row `block` and every row_blocks-th after it.
__device__ void TranslateRows(const CheckInputsParams& p, int32_t block, int32_t row_blocks) {
  const TranslateParams& e = p.entries;
  for (int32_t r = block; r < e.num_rows; r += row_blocks) {
    const TranslateRow row = e.rows[r];
    bool bad = false;
    for (int32_t k = threadIdx.x; k < row.width; k += kCheckThreads) {
      row.out[k] = TranslateEntry(row.ids[k], row.table, e.page_shift, row.limit, bad);
    }
    if (__syncthreads_or(bad ? 1 : 0) != 0 && threadIdx.x == 0) {
      atomicOr(p.flags + row.group, kFlagChosenEntry);
    }
  }
}

__global__ void __launch_bounds__(kCheckThreads)
    CheckInputsKernel(const __grid_constant__ CheckInputsParams p, int32_t range_slots,
                      int32_t row_blocks) {
  const int32_t check_blocks = range_slots * kBlocksPerRange;
  const auto block = static_cast<int32_t>(blockIdx.x);
  if (block < check_blocks) {
    CheckRanges(p, block, range_slots);
  } else {
    TranslateRows(p, block - check_blocks, row_blocks);
  }
}

}  // namespace

absl::Status LaunchCheckInputs(const CheckInputsParams& p, StreamHandle stream) {
  const int32_t range_slots = p.num_ranges < kMaxRangeSlots ? p.num_ranges : kMaxRangeSlots;
  const int32_t row_blocks =
      p.entries.num_rows < kMaxRowBlocks ? p.entries.num_rows : kMaxRowBlocks;
  const int32_t blocks = range_slots * kBlocksPerRange + row_blocks;
  if (blocks == 0) return absl::OkStatus();
  CheckInputsKernel<<<static_cast<unsigned>(blocks), kCheckThreads, 0, stream>>>(p, range_slots,
                                                                                 row_blocks);
  return ToStatus(GetLastError(), "check-inputs kernel launch");
}

}  // namespace smla::kernels::gpu
