// Parameters of the GPU kernel families, one flat struct per family passed by value, and the
// host-callable launchers. Plain C++ so that the backend (host code) and the kernels (.cu)
// share them.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "smla/kernels/backend.h"
#include "smla/kernels/formats.h"
#include "smla/kernels/gpu/runtime.h"
#include "smla/kernels/params.h"
#include "smla/kernels/plan.h"

namespace smla::kernels::gpu {

inline constexpr int kTileKeys = kKeyTile;     // keys gathered per tile (the plan's tile)
inline constexpr int kMaxWarpsPer16Heads = 8;  // a 16-head group has 4 or 8 warps
inline constexpr int kMaxStages = 3;           // gather stages in flight per program
inline constexpr int kDirectMaxStages = 4;     // the same for the direct kernel

// Row pitch of a stage of the direct kernel: the data row plus 32 bytes, so that the 8-byte
// operand reads of both dots hit distinct banks (row pitch = 8 words mod 16).
constexpr int DirectRowStride(int format, int qk_width) {
  return (format == static_cast<int>(KvFormat::kFp8Dsv4) ? kDsv4DataBytes : qk_width) + 32;
}

// One CSR segment as the kernel reads it.
struct SegmentArgs {
  const uint8_t* base = nullptr;     // num_pages * pitch bytes, device
  const int32_t* indptr = nullptr;   // [T+1] device
  const int32_t* indices = nullptr;  // [nnz] device, slot ids; < 0 = sentinel
  int64_t pitch = 0;                 // bytes per page
  int64_t num_slots = 0;             // ids at or past this are treated as sentinels
  int32_t rows_per_page_log2 = 0;    // B = 1 << this
  int32_t rows_per_page = 1;
  int32_t format = 0;      // KvFormat
  float score_scale2 = 0;  // softmax_scale * q_scale * sigma * log2(e)
  float p_scale = 1;       // sigma folded into P before the PV product (else 1)
  // The warpgroup program's running maxima move only when a tile's maximum passes them by more
  // than this (base 2), so its weights reach 2^rescale_slack (times p_scale, which bounds it).
  float rescale_slack = 0;
  // Paired rows (AttendKernelParams::paired): the union of the keys of unit i's rows g i ..
  // g i + g - 1 (g = AttendKernelParams::union_rows), written by the row-union kernel at the
  // unit's CSR range indptr[g i] .. indptr[g i + g] (its capacity), with per-entry row masks
  // (bit r: row g i + r attends the key) and the union length per unit.
  int32_t* union_indices = nullptr;  // [nnz] device workspace
  uint8_t* union_mask = nullptr;     // [nnz]
  int32_t* union_count = nullptr;    // [T / g]
};

// How a paired program's head slots map to query rows (AttendKernelParams::paired).
enum class PairMode : int32_t {
  kNone = 0,    // one row: slot h is head head_block * hb + h
  kGroups = 1,  // 32-head variant: slot h is head 16 hb + h % 16 of row 2i + h / 16
  kHalves = 2,  // 16-head variant, H <= 8: slot h is head h % 8 of row 2i + h / 8
  // The warpgroup program, H = 2^row_heads_log2 <= 32: its 64 product rows hold the rows of a
  // unit of g = union_rows rows, product row h head h % H of row g i + h / H (rows past g H
  // are empty).
  kRowGroups = 3,
};

// Rows a unit of the row-union kernel may hold: its row masks are bytes.
inline constexpr int kMaxUnionRows = 8;

struct AttendKernelParams {
  const void* q = nullptr;  // [T, H, Dqk] bf16, or e4m3 codes when q_fp8
  int32_t q_fp8 = 0;
  int32_t q_before_launch = 0;  // AttendParams::q_before_launch
  int32_t num_rows = 0;         // T
  int32_t num_heads = 0;        // H
  int32_t num_segments = 1;
  SegmentArgs seg[2];
  int32_t head_blocks = 1;  // ceil(H / head block)
  int32_t splits = 1;
  int32_t tiles_per_split = 1;  // tiles of the longest row / splits, rounded up
  // Warpgroup program, head_blocks 1: its first `whole_units` units (rows, or row groups) run
  // unsplit, first in the grid, and only the rest in `splits` splits (0: every unit split).
  int32_t whole_units = 0;
  int32_t stage_bytes = 0;  // one gather stage in shared memory
  int32_t num_stages = 2;   // 1..kMaxStages: tiles gathered ahead of the one in use, plus it
  int32_t use_tile = 0;     // some segment is fp8: stages are converted into a bf16 tile
  int32_t fold_scales = 1;  // direct kernel: fold the fp8_dsv4 rebias into the scale
  // PairMode (direct kernel, or the warpgroup program as kRowGroups): a program owns the
  // union_rows rows g i .. g i + g - 1 of a unit (pairs for the direct kernel) of one head block
  // over the union of their keys (SegmentArgs::union_*); the grid is T / g * head_blocks *
  // splits, and each program takes its share of the unit's union tiles (tiles_per_split is
  // unused).
  int32_t paired = 0;
  int32_t union_rows = 2;              // paired: rows per unit, 2 .. kMaxUnionRows
  int32_t row_heads_log2 = 0;          // kRowGroups: log2(H)
  int32_t union_bits = 6;              // paired: log2 of the row-union kernel's hash table entries
  const float* sink = nullptr;         // [H] device; may be null
  const int32_t* positions = nullptr;  // [T] device; may be null (no inverse RoPE)
  const float* cos_sin = nullptr;      // [P, 64] f32 device
  // Final outputs (splits == 1).
  int32_t out_mxfp8 = 0;
  uint16_t* out_bf16 = nullptr;  // [T, H, 512] bf16
  uint8_t* mx_data = nullptr;    // [T, H*512] e4m3
  uint8_t* mx_scales = nullptr;  // [T, H*16] E8M0
  float* lse = nullptr;          // [T, H]; may be null
  // Split-K partials (splits > 1).
  float* part_acc = nullptr;  // [T, H, splits, 512] f32, unnormalised
  float* part_ml = nullptr;   // [T, H, splits, 2] f32: m (base 2), l
  // The warpgroup program: bring bf16 Q by its tensor map (AttendParams::wgmma_q_tensor_map;
  // query_tensor_map.h), where the map can describe it.
  int32_t q_tensor_map = 0;
  // The warpgroup program's final rows through shared memory (AttendParams::wgmma_staged_rows).
  int32_t staged_rows = 0;
};

// The units a launch's programs own: rows, or a paired launch's units of union_rows rows.
inline int64_t ProgramUnits(const AttendKernelParams& p) {
  return p.paired != 0 ? p.num_rows / p.union_rows : p.num_rows;
}

struct CombineKernelParams {
  int32_t num_rows = 0;
  int32_t num_heads = 0;
  int32_t splits = 1;
  const float* part_acc = nullptr;     // [T, H, splits, 512]
  const float* part_ml = nullptr;      // [T, H, splits, 2]
  const float* sink = nullptr;         // [H]; may be null
  const int32_t* positions = nullptr;  // [T]; may be null
  const float* cos_sin = nullptr;      // [P, 64]
  int32_t out_mxfp8 = 0;
  uint16_t* out_bf16 = nullptr;
  uint8_t* mx_data = nullptr;
  uint8_t* mx_scales = nullptr;
  float* lse = nullptr;
};

struct WriteRowsKernelParams {
  MutableCacheView cache;
  const int64_t* slots = nullptr;  // [n] device
  const uint16_t* rows = nullptr;  // [n, QkWidth] bf16, device
  int64_t num_rows = 0;
};

// MXFP8 query expansion: `lanes` = vectors * width lanes (even, as width is a multiple of 32);
// codes are read two at a time, so `codes` is 2-byte aligned and `out` 4-byte aligned.
struct ExpandQueryKernelParams {
  const uint8_t* codes = nullptr;   // [lanes] e4m3, device
  const uint8_t* scales = nullptr;  // [lanes / 32] UE8M0, device
  uint16_t* out = nullptr;          // [lanes] bf16, device
  int64_t lanes = 0;
};

// Copies between two places in device memory (Backend::CopyBatch, CopyDirection::kOnDevice), as
// one kernel: copy i is split into kDeviceCopyChunk-byte chunks, one block each, its chunks
// numbered from first_block[i]. Few copies a launch: a block finds its copy by a loop with
// constant indices (a run-time index into the parameter goes through local memory).
inline constexpr int kMaxDeviceCopies = 16;
inline constexpr int64_t kDeviceCopyChunk = 16384;
struct DeviceCopyKernelParams {
  CopyOp ops[kMaxDeviceCopies];
  int32_t first_block[kMaxDeviceCopies + 1] = {};
  int32_t count = 0;
};

// Shared memory one attention program needs (bytes), with `keys`-key tiles.
int64_t AttendSharedBytes(int qk_width, int head_block, int stage_bytes, int num_stages,
                          bool use_tile, int keys);
// Bytes of one gather stage of `keys` rows for a segment format.
int32_t StageBytes(KvFormat format, int qk_width, int keys);

// Whether the direct kernel (fp8 operands converted from the stage into registers; 16- and
// 32-head programs) runs a segment format; bytes of one of its stages; its shared memory.
bool DirectFormat(KvFormat format);
int32_t DirectStageBytes(KvFormat format, int qk_width);
int64_t DirectSharedBytes(int qk_width, int head_block, int stage_bytes, int num_stages);
// Programs per SM the direct variant is compiled for (0: no such variant).
int DirectVariantBlocks(int qk_width, int head_block);
// Rows whose union the row-union kernel handles with de-duplication (a unit with a longer row,
// or with more keys before its last row than half its table, is concatenated instead: correct,
// without the saving).
inline constexpr int kUnionMaxRow = 2048;
// Whether this build pairs rows (CUDA; gfx950 keeps one row per program for now).
bool RowPairsSupported();
// The row-union kernel's hash table: 2^union_bits entries of 13 bytes (key, first entry, claim,
// row mask), up to kMaxUnionBits, and where shared memory allows kUnionSlotsPerKey entries per
// key of a unit's longest row (linear probing by a whole warp waits for its longest probe, and
// each probe is an atomic).
inline constexpr int kMaxUnionBits = 14;
inline constexpr int kUnionSlotsPerKey = 8;
int64_t RowUnionSharedBytes(int union_bits);
// Lets the row-union kernel use up to max_bytes of shared memory (once per device).
absl::Status PrepareRowUnion(int64_t max_bytes);
// Builds the units' key unions of every segment (SegmentArgs::union_*) for a paired launch.
absl::Status LaunchRowUnion(const AttendKernelParams& p, StreamHandle stream);
absl::Status LaunchAttendDirect(const AttendKernelParams& p, int qk_width, int head_block,
                                int64_t shared_bytes, StreamHandle stream);

// Keys per tile of the compiled (QK width, head block) variant; 0 when it is not compiled in.
// The list lives in attend_variants.cu.
int AttendVariantKeys(int qk_width, int head_block);
bool AttendVariantExists(int qk_width, int head_block);
// Raises every variant's dynamic shared-memory limit to `max_bytes` (once, at start-up).
absl::Status PrepareAttendVariants(int64_t max_bytes);
absl::Status LaunchAttend(const AttendKernelParams& p, int qk_width, int head_block,
                          int64_t shared_bytes, StreamHandle stream);

// The 64-head warpgroup program (attend_wgmma_kernel.cuh; sm_90a builds, QK width 512,
// fp8_dsv4 and fp8_per_tensor segments): whether this build has it, its shared memory (fixed:
// Q, two dequantised tiles, P), its launch.
bool WgmmaProgramSupported();
int64_t WgmmaSharedBytes();
absl::Status LaunchAttendWgmma(const AttendKernelParams& p, int64_t shared_bytes,
                               StreamHandle stream);
absl::Status LaunchCombine(const CombineKernelParams& p, StreamHandle stream);
absl::Status LaunchWriteRows(const WriteRowsKernelParams& p, StreamHandle stream);
absl::Status LaunchExpandQuery(const ExpandQueryKernelParams& p, StreamHandle stream);
absl::Status LaunchCheckInputs(const CheckInputsParams& p, StreamHandle stream);
// Copies of at most kMaxDeviceCopies ops at a time, as many launches as that takes.
absl::Status LaunchDeviceCopies(std::span<const CopyOp> copies, StreamHandle stream);

}  // namespace smla::kernels::gpu
