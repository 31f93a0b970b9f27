// A launch's inputs checked on the device in one kernel (Backend::CheckInputs), with the rules of
// input_checks.h that the CPU backend uses. The grid's parts, in block order:
// - the new rows (RowWrites), kRowsPerBlock to a block: each read once, checked, copied where
//   read elsewhere, its slot's old bytes saved where asked (`old`), and written into the pool;
// - value ranges, kBlocksPerRange to a range, each thread testing (and copying, where the range
//   has a copy) every stride-th word;
// - chosen entries translated, one row per block;
// - changed table blocks written, one page id per thread;
// - the rows' windows (PositionRuns) written, one run per block.
// Something refused sets its group's flag (SetFlag: a byte store, the flags may lie in host
// memory). One kernel: on a small launch each kernel boundary costs about as much as the work
// (docs/architecture.md, "Input checks on the device").
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gpu/grid_order.h"
#include "gpu/kernel_params.h"
#include "gpu/row_encoder.cuh"
#include "smla/kernels/input_checks.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kCheckThreads = 256;
constexpr int kRowsPerBlock = kCheckThreads / kRowLanes;
constexpr int kBlocksPerRange = 8;
constexpr int32_t kMaxRangeSlots = 1 << 13;    // ranges checked at once (then strided)
constexpr int32_t kMaxRowBlocks = 1 << 16;     // translate blocks (then strided)
constexpr int32_t kMaxWriteBlocks = 1 << 10;   // table-block writing blocks (then strided)
constexpr int32_t kMaxRunBlocks = 1 << 16;     // window-writing blocks (then strided)
constexpr int32_t kMaxNewRowBlocks = 1 << 16;  // row-writing blocks (then strided)

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

// Range words of type W (uint4 or uint32_t) from `first` on, every stride-th: each read once,
// checked and, where the range has one, written to its copy.
template <typename W>
__device__ __forceinline__ bool CheckWords(const CheckRange& range, int64_t first, int64_t stride) {
  const auto* from = reinterpret_cast<const W*>(range.data);
  auto* to = reinterpret_cast<W*>(range.copy_to);
  constexpr int kWords = sizeof(W) / 4;
  bool bad = false;
  for (int64_t i = first; i < range.bytes / static_cast<int64_t>(sizeof(W)); i += stride) {
    const W x = from[i];
    if (to != nullptr) to[i] = x;
    uint32_t w[kWords];
    memcpy(w, &x, sizeof(W));
#pragma unroll
    for (int k = 0; k < kWords; ++k) bad = bad || WordRefused(range.check, w[k]);
  }
  return bad;
}

// Lane t's share of saving slot `slot`'s bytes to row i's place in w.old (SlotParts), 8 bytes at
// a time: data rows are 16-byte aligned and 8-byte multiples, as are RowBytes and scale records.
__device__ void SaveOldBytes(const RowWrites& w, int64_t slot, int32_t i, int t) {
  const MutableCacheView& c = w.cache;
  SlotPart parts[2];
  const int n = SlotParts(c.format, c.geometry, slot, c.rows_per_page, c.pitch_bytes, parts);
  uint8_t* to = w.old + int64_t{i} * RowBytes(c.format, c.geometry);
  for (int part = 0; part < n; ++part) {
    const auto* from =
        reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(c.base) + parts[part].offset);
    for (int64_t k = t; k < parts[part].bytes / 8; k += kRowLanes) {
      reinterpret_cast<uint2*>(to)[k] = from[k];
    }
    to += parts[part].bytes;
  }
}

// The first blocks of the grid: rows [block * kRowsPerBlock, + kRowsPerBlock) and every
// row_blocks-th group of rows after them, kRowLanes threads to a row. Nothing waits for the other
// checks (params.h, RowWrites, says why that is safe).
__device__ void WriteNewRows(const CheckInputsParams& p, int32_t block, int32_t row_blocks) {
  __shared__ RowScratch amax_s[kRowsPerBlock];
  const RowWrites& w = p.rows;
  const int sub = static_cast<int>(threadIdx.x) / kRowLanes;
  const int t = static_cast<int>(threadIdx.x) % kRowLanes;
  const int width = QkWidth(w.cache.geometry);
  const int64_t num_slots = w.cache.num_pages * w.cache.rows_per_page;
  // `first` is the block's alike, so every thread reaches the encoder's barriers equally often.
  for (int32_t first = block * kRowsPerBlock; first < w.num_rows;
       first += row_blocks * kRowsPerBlock) {
    const int32_t i = first + sub;
    const bool here = i < w.num_rows;
    RowWrite row;
    uint16_t x[kRowChunks] = {};
    if (here) {
      row = w.rows[i];
      LoadRowValues(row.from, width, t, x);
    }
    const bool in_pool = here && row.slot >= 0 && row.slot < num_slots;
    if (in_pool && w.old != nullptr) SaveOldBytes(w, row.slot, i, t);
    if (here) {
      uint16_t* copy = w.copies + int64_t{i} * width;
      const bool copying = copy != row.from;
      bool bad = false;
#pragma unroll
      for (int k = 0; k < kRowChunks; ++k) {
        if (k * kRowLanes >= width) continue;
        bad = bad || Bf16OutOfBounds(x[k]);
        if (copying) copy[k * kRowLanes + t] = x[k];
      }
      if (bad) SetFlag(p.flags, row.group, kFlagInputValue);
    }
    __syncthreads();  // every lane's saved bytes are read before any lane writes the slot
    EncodeRowValues(w.cache, row.slot, x, t, amax_s[sub], in_pool);
  }
}

// Blocks [0, range_slots * kBlocksPerRange) of the grid.
__device__ void CheckRanges(const CheckInputsParams& p, int32_t block, int32_t range_slots) {
  const int64_t stride = int64_t{kBlocksPerRange} * kCheckThreads;
  const int64_t first = int64_t{block % kBlocksPerRange} * kCheckThreads + threadIdx.x;
  for (int32_t r = block / kBlocksPerRange; r < p.num_ranges; r += range_slots) {
    const CheckRange range = p.ranges[r];
    const uintptr_t ends =
        reinterpret_cast<uintptr_t>(range.data) | reinterpret_cast<uintptr_t>(range.copy_to);
    bool bad = false;
    if (ends % 16 == 0 && range.bytes % 16 == 0) {
      bad = CheckWords<uint4>(range, first, stride);
    } else if (ends % 4 == 0 && range.bytes % 4 == 0) {
      bad = CheckWords<uint32_t>(range, first, stride);
    } else if (range.check == InputCheck::kKvRows) {
      for (int64_t i = first; i < range.bytes / 2; i += stride) {
        uint16_t bits;
        memcpy(&bits, range.data + 2 * i, 2);
        if (range.copy_to != nullptr) memcpy(range.copy_to + 2 * i, &bits, 2);
        bad = bad || Bf16OutOfBounds(bits);
      }
    } else {
      for (int64_t i = first; i < range.bytes; i += stride) {
        const uint8_t byte = range.data[i];
        if (range.copy_to != nullptr) range.copy_to[i] = byte;
        bad = bad || ByteRefused(range.check, byte);
      }
    }
    // The range is the block's alike, so every thread reaches the barrier.
    if (__syncthreads_or(bad ? 1 : 0) != 0 && threadIdx.x == 0) {
      SetFlag(p.flags, range.group, kFlagInputValue);
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
      const int32_t id = row.ids[k];
      if (row.seen != nullptr) row.seen[k] = id;
      row.out[k] = TranslateEntry(id, row.blocks, e.page_shift, e.block_shift, row.limit, bad);
    }
    if (__syncthreads_or(bad ? 1 : 0) != 0 && threadIdx.x == 0) {
      SetFlag(p.flags, row.group, kFlagChosenEntry);
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

// The last blocks: run `block` and every run_blocks-th after it.
__device__ void WriteRuns(const TranslateParams& e, int32_t block, int32_t run_blocks) {
  for (int32_t r = block; r < e.num_runs; r += run_blocks) {
    const PositionRun run = e.runs[r];
    for (int32_t j = threadIdx.x; j < run.count; j += kCheckThreads) {
      run.out[j] = RunSlot(run, j, e.page_shift);
    }
  }
}

// The grid's parts, in block order.
struct CheckGrid {
  int32_t new_row_blocks = 0, range_slots = 0, row_blocks = 0, write_blocks = 0, run_blocks = 0;
  __host__ __device__ int32_t check_blocks() const { return range_slots * kBlocksPerRange; }
  __host__ __device__ int32_t blocks() const {
    return new_row_blocks + check_blocks() + row_blocks + write_blocks + run_blocks;
  }
};

__global__ void __launch_bounds__(kCheckThreads)
    CheckInputsKernel(const __grid_constant__ CheckInputsParams p, CheckGrid g) {
  EnterGrid();  // grid_order.h: before any access to memory
  auto block = static_cast<int32_t>(blockIdx.x);
  // The rows first: theirs is the longest chain of dependent accesses (entry, row, maxima, slot).
  if (block < g.new_row_blocks) {
    WriteNewRows(p, block, g.new_row_blocks);
    return;
  }
  block -= g.new_row_blocks;
  if (block < g.check_blocks()) {
    CheckRanges(p, block, g.range_slots);
    return;
  }
  block -= g.check_blocks();
  if (block < g.row_blocks) {
    TranslateRows(p, block, g.row_blocks);
    return;
  }
  block -= g.row_blocks;
  if (block < g.write_blocks) {
    WriteTableBlocks(p.entries, block, g.write_blocks);
    return;
  }
  WriteRuns(p.entries, block - g.write_blocks, g.run_blocks);
}

}  // namespace

absl::Status LaunchCheckInputs(const CheckInputsParams& p, StreamHandle stream) {
  CheckGrid g;
  g.new_row_blocks =
      std::min((p.rows.num_rows + kRowsPerBlock - 1) / kRowsPerBlock, kMaxNewRowBlocks);
  g.range_slots = std::min(p.num_ranges, kMaxRangeSlots);
  g.row_blocks = std::min(p.entries.num_rows, kMaxRowBlocks);
  const int64_t write_ids = int64_t{p.entries.num_block_writes} << p.entries.block_shift;
  g.write_blocks = static_cast<int32_t>(
      std::min<int64_t>((write_ids + kCheckThreads - 1) / kCheckThreads, kMaxWriteBlocks));
  g.run_blocks = std::min(p.entries.num_runs, kMaxRunBlocks);
  if (g.blocks() == 0) return absl::OkStatus();
  return ToStatus(Launch(CheckInputsKernel, dim3(static_cast<unsigned>(g.blocks())),
                         dim3(kCheckThreads), 0, stream, p, g),
                  "check-inputs kernel launch");
}

}  // namespace smla::kernels::gpu
