// A launch's inputs checked on the device in one kernel (Backend::CheckInputs), with the rules of
// input_checks.h that the CPU backend uses. The grid's first blocks check value ranges,
// kBlocksPerRange to a range, each thread testing every stride-th word; the next translate chosen
// entries, one row per block; the last write the changed table blocks, one page id per thread.
// A block that found something refused sets its group's flag with one atomic OR. One kernel: on
// a small launch each kernel boundary costs about as much as the work (docs/architecture.md,
// "Input checks on the device").
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gpu/kernel_params.h"
#include "smla/kernels/input_checks.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kCheckThreads = 256;
constexpr int kBlocksPerRange = 8;
constexpr int32_t kMaxRangeSlots = 1 << 13;   // ranges checked at once (then strided)
constexpr int32_t kMaxRowBlocks = 1 << 16;    // translate blocks (then strided)
constexpr int32_t kMaxWriteBlocks = 1 << 10;  // table-block writing blocks (then strided)

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
      row.out[k] =
          TranslateEntry(row.ids[k], row.blocks, e.page_shift, e.block_shift, row.limit, bad);
    }
    if (__syncthreads_or(bad ? 1 : 0) != 0 && threadIdx.x == 0) {
      atomicOr(p.flags + row.group, kFlagChosenEntry);
    }
  }
}

// The blocks after the translation: page id `block * kCheckThreads + threadIdx.x` of all the
// writes' ids and every stride-th after it.
__device__ void WriteTableBlocks(const TranslateParams& e, int32_t block, int32_t write_blocks) {
  const int64_t total = int64_t{e.num_block_writes} << e.block_shift;
  const int64_t stride = int64_t{write_blocks} * kCheckThreads;
  const int32_t mask = (int32_t{1} << e.block_shift) - 1;
  for (int64_t i = int64_t{block} * kCheckThreads + threadIdx.x; i < total; i += stride) {
    const TableBlockWrite w = e.block_writes[i >> e.block_shift];
    w.to[i & mask] = w.from[i & mask];
  }
}

__global__ void __launch_bounds__(kCheckThreads)
    CheckInputsKernel(const __grid_constant__ CheckInputsParams p, int32_t range_slots,
                      int32_t row_blocks, int32_t write_blocks) {
  const int32_t check_blocks = range_slots * kBlocksPerRange;
  const auto block = static_cast<int32_t>(blockIdx.x);
  if (block < check_blocks) {
    CheckRanges(p, block, range_slots);
  } else if (block < check_blocks + row_blocks) {
    TranslateRows(p, block - check_blocks, row_blocks);
  } else {
    WriteTableBlocks(p.entries, block - check_blocks - row_blocks, write_blocks);
  }
}

}  // namespace

absl::Status LaunchCheckInputs(const CheckInputsParams& p, StreamHandle stream) {
  const int32_t range_slots = p.num_ranges < kMaxRangeSlots ? p.num_ranges : kMaxRangeSlots;
  const int32_t row_blocks =
      p.entries.num_rows < kMaxRowBlocks ? p.entries.num_rows : kMaxRowBlocks;
  const int64_t write_ids = int64_t{p.entries.num_block_writes} << p.entries.block_shift;
  const auto write_blocks = static_cast<int32_t>(
      std::min<int64_t>((write_ids + kCheckThreads - 1) / kCheckThreads, kMaxWriteBlocks));
  const int32_t blocks = range_slots * kBlocksPerRange + row_blocks + write_blocks;
  if (blocks == 0) return absl::OkStatus();
  CheckInputsKernel<<<static_cast<unsigned>(blocks), kCheckThreads, 0, stream>>>(
      p, range_slots, row_blocks, write_blocks);
  return ToStatus(GetLastError(), "check-inputs kernel launch");
}

}  // namespace smla::kernels::gpu
