#include "smla/kernels/plan.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "smla/base/align.h"

namespace smla::kernels {
namespace {

// Whether a grid of `programs` fills its last round of `units` more than half, or, past four
// rounds (where a ragged tail matters little), whether each program has at least four tiles.
bool LastRoundWorthIt(int64_t programs, int32_t units, int64_t tiles_per_program) {
  if (programs > 4 * int64_t{units}) return tiles_per_program >= 4;
  const int64_t rem = programs % units;
  return rem == 0 || rem * 2 > units;
}

}  // namespace

int32_t PlanSplits(int64_t rows, int32_t heads, int32_t tiles, int32_t compute_units,
                   int32_t programs_per_unit) {
  // Few tiles: the combine would cost more than the parallelism gains.
  if (tiles <= 2) return 1;
  const int64_t per_unit = std::max<int32_t>(1, programs_per_unit);
  const int64_t programs = std::max<int64_t>(1, rows * CeilDiv<int64_t>(heads, 16));
  int64_t splits;
  if (programs >= compute_units) {
    // The grid is already full: aim for two programs per resident slot, splitting only rows
    // long enough to keep 4 tiles per split per resident program (a split that shares its
    // unit pays more for its partials).
    const int64_t fill = 2 * int64_t{compute_units} * per_unit / programs;
    splits = std::min<int64_t>(fill, tiles / (4 * per_unit));
  } else {
    // Two programs per unit so a slow one does not leave the device idle (measured on the
    // H200 with two resident programs per SM: more splits than this were slower).
    const int64_t fill = 2 * int64_t{compute_units} / programs;
    splits = std::min<int64_t>({fill, tiles, kMaxSplits});
  }
  return static_cast<int32_t>(std::clamp<int64_t>(splits, 1, kMaxSplits));
}

int32_t PlanHeadBlock(int64_t rows, int32_t heads, int32_t tiles, int32_t splits,
                      int32_t compute_units) {
  // A bigger block gathers and dequantises each key tile once for more heads; it pays only if
  // the smaller grid still keeps the device busy.
  for (int32_t block : {64, 32}) {
    if (heads < block || heads % block != 0) continue;
    const int64_t programs = rows * (heads / block) * splits;
    const int64_t tiles_per_program = CeilDiv<int64_t>(tiles, splits);
    if (tiles_per_program <= 1) continue;
    if (!LastRoundWorthIt(programs, compute_units, tiles_per_program)) continue;
    // 64-head programs hold Q in shared memory and have no combine path.
    if (block == 64 && (splits > 1 || programs < compute_units)) continue;
    return block;
  }
  return 16;
}

namespace {

// The H200 fit (plan.h): fp8_dsv4 rows (584 bytes, with chunk scales) cost the most per tile;
// fp8_per_tensor rows of 576 and 512 codes less.
constexpr DirectCostModel kH200Fit = {
    .source = "H200 fit (sm_90)",
    .fp8_dsv4 = {2.16, 2.40, 5.25, 3.51},
    .per_tensor_512 = {2.29, 1.85, 5.53, 3.02},
    .per_tensor_576 = {2.74, 2.07, 6.56, 3.25},
    .shared_unit_slowdown = 1.66,
    .combine_us = 0.47,
    .combine_us_per_vector = 11.3e-4,
};

// Not measured: round numbers that encode only what holds by construction. A tile costs the
// same in every format (the gather dominates); a 32-head program pays twice a 16-head one's
// fixed cost and 1.5 times its per-tile cost (one gather, twice the products); two programs
// sharing a compute unit each take twice as long (no gain assumed from overlapping them); the
// combine costs as on the H200, rounded.
constexpr DirectProgramCost kDefaultProgram = {2.0, 2.0, 4.0, 3.0};
constexpr DirectCostModel kDefaultModel = {
    .source = "default (not measured)",
    .fp8_dsv4 = kDefaultProgram,
    .per_tensor_512 = kDefaultProgram,
    .per_tensor_576 = kDefaultProgram,
    .shared_unit_slowdown = 2.0,
    .combine_us = 0.5,
    .combine_us_per_vector = 1e-3,
};

const DirectProgramCost& CostFor(const DirectCostModel& model, KvFormat format, int32_t qk_width) {
  if (format == KvFormat::kFp8PerTensor) {
    return qk_width == 512 ? model.per_tensor_512 : model.per_tensor_576;
  }
  return model.fp8_dsv4;
}

}  // namespace

const DirectCostModel& DirectCostModelFor(std::string_view arch) {
  // "sm_90" and "sm_90a": the fit's device; sm_100 and later are other devices.
  if (arch == "sm_90" || arch == "sm_90a") return kH200Fit;
  return kDefaultModel;
}

DirectPlanInput DirectPlanInputFor(const DeviceInfo& device) {
  DirectPlanInput in;
  in.compute_units = device.compute_units;
  in.arch = device.arch;
  return in;
}

double EstimateDirectUs(const DirectPlanInput& in, int32_t head_block, int32_t splits) {
  const DirectCostModel& model = DirectCostModelFor(in.arch);
  const DirectProgramCost& cost = CostFor(model, in.format, in.qk_width);
  const int32_t blocks = head_block == 32 ? in.blocks32 : in.blocks16;
  const int64_t sms = std::max<int32_t>(1, in.compute_units);
  const int64_t k = CeilDiv<int64_t>(std::max<int32_t>(1, in.tiles), std::max<int32_t>(1, splits));
  const double program = head_block == 32 ? cost.p32 + k * cost.t32 : cost.p16 + k * cost.t16;
  const double slow = blocks >= 2 ? model.shared_unit_slowdown : 1.0;
  const int64_t programs = in.units * CeilDiv<int64_t>(in.heads, head_block) * splits;
  const int64_t per_round = std::max<int32_t>(1, blocks) * sms;
  const int64_t rounds = programs / per_round;
  const int64_t rest = programs % per_round;
  double us = rounds * slow * program;
  if (rest > 0) us += rest <= sms ? program : slow * program;
  if (splits > 1) {
    us += model.combine_us +
          model.combine_us_per_vector * static_cast<double>(in.units) * in.heads * splits;
  }
  return us;
}

DirectPlan PlanDirect(const DirectPlanInput& in) {
  DirectPlan best;
  best.estimate_us = -1;
  const int32_t tiles = std::max<int32_t>(1, in.tiles);
  for (int32_t hb : {16, 32}) {
    if ((hb == 16 ? in.blocks16 : in.blocks32) <= 0) continue;
    if (hb == 32 && in.heads % 32 != 0) continue;
    // Every split count that gives each program at least one tile: one per tiles-per-split k.
    for (int32_t splits = 1; splits <= std::min(tiles, kMaxSplits);) {
      const double us = EstimateDirectUs(in, hb, splits);
      if (best.estimate_us < 0 || us < best.estimate_us) best = {hb, splits, us};
      const int64_t k = CeilDiv<int64_t>(tiles, splits);
      if (k == 1) break;
      splits = static_cast<int32_t>(CeilDiv<int64_t>(tiles, k - 1));
    }
  }
  if (best.estimate_us < 0) best = {16, 1, 0};
  return best;
}

LaunchPlan MakePlan(const PlanInput& in) {
  LaunchPlan plan;
  plan.tiles = static_cast<int32_t>(CeilDiv<int64_t>(in.max_main_keys, kKeyTile) +
                                    CeilDiv<int64_t>(in.max_extra_keys, kKeyTile));
  plan.splits =
      PlanSplits(in.num_rows, in.num_heads, plan.tiles, in.compute_units, in.programs_per_unit);
  plan.head_block =
      PlanHeadBlock(in.num_rows, in.num_heads, plan.tiles, plan.splits, in.compute_units);
  plan.head_blocks = static_cast<int32_t>(CeilDiv<int64_t>(in.num_heads, plan.head_block));
  plan.programs = int64_t{in.num_rows} * plan.head_blocks * plan.splits;
  plan.order = WorkOrder::kRowMajor;
  return plan;
}

LaunchPlan OverridePlan(LaunchPlan plan, int32_t num_rows, int32_t num_heads,
                        int32_t force_head_block, int32_t force_splits) {
  if (force_head_block > 0) {
    plan.head_block = force_head_block;
    plan.head_blocks = static_cast<int32_t>(CeilDiv<int64_t>(num_heads, force_head_block));
  }
  if (force_splits > 0) {
    plan.splits = std::clamp(force_splits, 1, std::max(plan.tiles, 1));
  }
  plan.programs = int64_t{num_rows} * plan.head_blocks * plan.splits;
  return plan;
}

int64_t MaxSegmentLength(std::span<const int32_t> indptr) {
  int64_t best = 0;
  for (size_t t = 1; t < indptr.size(); ++t) {
    best = std::max<int64_t>(best, int64_t{indptr[t]} - indptr[t - 1]);
  }
  return best;
}

int64_t UnionLength(std::span<const std::span<const int32_t>> rows, int64_t num_slots) {
  if (rows.empty()) return 0;
  auto valid = [num_slots](int32_t id) { return id >= 0 && id < num_slots; };
  // Each held key and the last row whose first occurrence of it took its entry (or the row
  // that entered it).
  absl::flat_hash_map<int32_t, size_t> held;
  held.reserve(rows[0].size());
  for (int32_t id : rows[0]) {
    if (valid(id)) held.try_emplace(id, 0);
  }
  auto n = static_cast<int64_t>(rows[0].size());
  std::vector<int32_t> entered;
  for (size_t r = 1; r < rows.size(); ++r) {
    entered.clear();
    for (int32_t id : rows[r]) {
      if (!valid(id)) continue;
      auto it = held.find(id);
      if (it != held.end() && it->second < r) {
        it->second = r;  // the key's first entry takes this row's first occurrence
        continue;
      }
      ++n;
      if (it == held.end()) entered.push_back(id);
    }
    for (int32_t id : entered) held.try_emplace(id, r);
  }
  return n;
}

std::string LaunchPlan::ToString() const {
  return absl::StrFormat("head_block=%d head_blocks=%d splits=%d tiles=%d programs=%d", head_block,
                         head_blocks, splits, tiles, programs);
}

}  // namespace smla::kernels
