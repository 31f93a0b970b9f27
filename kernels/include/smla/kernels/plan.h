// Launch configuration: a pure function from the shape of a call and the device's facts to
// (head block, split count, work order). GPU backends launch what it says; the CPU backend
// uses the head block for its work items. Rules follow docs/gpu.md ("Launch configuration"), to be
// re-measured per device.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "smla/kernels/device_info.h"
#include "smla/kernels/formats.h"

namespace smla::kernels {

inline constexpr int32_t kKeyTile = 64;  // keys gathered per tile
inline constexpr int32_t kMaxSplits = 64;
inline constexpr int32_t kPrefillRows = 2048;  // T at or above this counts as prefill

struct PlanInput {
  int32_t num_rows = 0;   // T
  int32_t num_heads = 0;  // H
  KvFormat format = KvFormat::kBf16;
  int64_t max_main_keys = 0;      // longest main segment of any row
  int64_t max_extra_keys = 0;     // longest extra segment of any row (0 without one)
  int32_t compute_units = 1;      // SMs / CUs
  int32_t programs_per_unit = 1;  // programs of 16 heads resident per compute unit at once
};

enum class WorkOrder : uint8_t {
  // Program id runs head block fastest, then split, then row: a row's head blocks and splits,
  // then the next row of the same request, run together and share the L2.
  kRowMajor = 0,
};

struct LaunchPlan {
  int32_t head_block = 16;  // heads per program: 16, 32 or 64 (H = 8 runs masked in 16)
  int32_t head_blocks = 1;  // ceil(H / head_block)
  int32_t splits = 1;       // key splits per (row, head block); > 1 needs the combine
  int32_t tiles = 0;        // 64-key tiles of the longest row (both segments)
  int64_t programs = 0;     // T * head_blocks * splits
  WorkOrder order = WorkOrder::kRowMajor;

  std::string ToString() const;
};

// Split count sized as if every program held 16 heads (docs/gpu.md): one split for <= 2 tiles;
// when the grid already fills the device (programs >= N), min(2S/programs,
// tiles/(4 * programs_per_unit)) with S = N * programs_per_unit resident slots; otherwise
// min(2N/programs, tiles, 64). Always at least 1.
int32_t PlanSplits(int64_t rows, int32_t heads, int32_t tiles, int32_t compute_units,
                   int32_t programs_per_unit = 1);

// Head block for H = 32 or 64 (16 otherwise).
int32_t PlanHeadBlock(int64_t rows, int32_t heads, int32_t tiles, int32_t splits,
                      int32_t compute_units);

LaunchPlan MakePlan(const PlanInput& input);

// The direct fp8 kernel (fp8_dsv4 / fp8_per_tensor on the GPU) chooses its head block and split
// count by an estimate of the launch's time instead of the rules above: a program of k tiles
// costs p + k*t (per format and head block), two resident on one SM each take longer by a
// factor, programs run in rounds of (programs per SM) x SMs, and a split launch adds the
// combine (a constant plus a cost per partial output vector). Only split counts that leave no
// program without tiles are considered. The constants are per architecture (DirectCostModel).

// Per-program cost of the direct kernel: p + k * t microseconds for k tiles, per head block.
struct DirectProgramCost {
  double p16 = 0, t16 = 0, p32 = 0, t32 = 0;
};

// The direct cost model's constants for one device architecture (docs/gpu.md, "The cost model
// by architecture").
struct DirectCostModel {
  const char* source = "";  // where the constants come from
  DirectProgramCost fp8_dsv4;
  DirectProgramCost per_tensor_512;  // fp8_per_tensor, QK width 512
  DirectProgramCost per_tensor_576;  // fp8_per_tensor, QK width 576
  double shared_unit_slowdown = 1;   // each of two programs resident on one SM / CU
  double combine_us = 0;             // a split launch's combine kernel, fixed part
  double combine_us_per_vector = 0;  // per partial (row, head, split) vector
};

// sm_90 / sm_90a: the fit to 1,012 forced (head block, splits) measurements of the grid's decode
// cells on the H200 (4 % RMS error; docs/results/kbench-h200.md, "Split planning").
// Every other architecture, gfx950 included: an unmeasured default (plan.cc says what it
// assumes), until a fit is made there.
const DirectCostModel& DirectCostModelFor(std::string_view arch);

struct DirectPlanInput {
  int64_t units = 0;  // query rows, or row pairs for paired programs
  int32_t heads = 0;  // heads per unit (16 for a pair of 8-head rows)
  int32_t tiles = 0;  // 64-key tiles of the longest unit (both segments)
  int32_t compute_units = 1;
  std::string arch;  // DeviceInfo::arch: picks the cost model
  KvFormat format = KvFormat::kFp8Dsv4;
  int32_t qk_width = 576;
  int32_t blocks16 = 0;  // 16-head programs resident per SM (0: no 16-head program)
  int32_t blocks32 = 0;  // 32-head programs resident per SM (0: none; used where heads % 32 == 0)
};

// An input with the device's facts (compute units, architecture) filled in.
DirectPlanInput DirectPlanInputFor(const DeviceInfo& device);

struct DirectPlan {
  int32_t head_block = 16;
  int32_t splits = 1;
  double estimate_us = 0;  // without the launch's fixed cost
};

// The estimate of one (head block, splits) choice, in microseconds.
double EstimateDirectUs(const DirectPlanInput& in, int32_t head_block, int32_t splits);
// The cheapest choice by that estimate (on ties the 16-head block, then fewer splits).
DirectPlan PlanDirect(const DirectPlanInput& in);

// Applies overrides (0 = keep): a forced head block must divide into the legal set and a
// forced split count is clamped to [1, max(tiles, 1)].
LaunchPlan OverridePlan(LaunchPlan plan, int32_t num_rows, int32_t num_heads,
                        int32_t force_head_block, int32_t force_splits);

// Longest segment in a CSR indptr ([T+1]).
int64_t MaxSegmentLength(std::span<const int32_t> indptr);

// The entries the row-union kernel (gpu/row_union_kernel.cu) writes for one segment of a unit of
// rows: every entry of the first row (its sentinels stay, masked off), and of each later row
// every valid entry (0 <= id < num_slots) except the first occurrence of each key that an
// earlier row holds.
int64_t UnionLength(std::span<const std::span<const int32_t>> rows, int64_t num_slots);

}  // namespace smla::kernels
