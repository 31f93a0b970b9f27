#include "smla/kernels/plan.h"

#include <algorithm>
#include <initializer_list>
#include <span>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace smla::kernels {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kH200Sms = 132;

PlanInput Decode(int32_t rows, int32_t heads, int64_t main_keys, int64_t extra_keys) {
  return {.num_rows = rows,
          .num_heads = heads,
          .format = KvFormat::kFp8Dsv4,
          .max_main_keys = main_keys,
          .max_extra_keys = extra_keys,
          .compute_units = kH200Sms};
}

TEST(PlanSplits, ShortRowsNeverSplit) {
  EXPECT_EQ(PlanSplits(1, 16, 1, kH200Sms), 1);
  EXPECT_EQ(PlanSplits(1, 16, 2, kH200Sms), 1);
  EXPECT_EQ(PlanSplits(6, 64, 0, kH200Sms), 1);
}

TEST(PlanSplits, SmallGridsSplitToFillTheDevice) {
  // 6 rows x 1 block of 16 heads = 6 programs: 264 / 6 = 44, capped by the 10 tiles.
  EXPECT_EQ(PlanSplits(6, 16, 10, kH200Sms), 10);
  // 100 tiles: capped by 2N / programs = 44.
  EXPECT_EQ(PlanSplits(6, 16, 100, kH200Sms), 44);
  // One program and very long rows: capped at 64 splits.
  EXPECT_EQ(PlanSplits(1, 16, 1000, kH200Sms), kMaxSplits);
}

TEST(PlanSplits, FullGridsKeepFourTilesPerSplit) {
  // 192 programs >= 132: 2N / programs = 1.
  EXPECT_EQ(PlanSplits(192, 16, 40, kH200Sms), 1);
  // 132 programs: 2N / programs = 2, tiles / 4 = 10 -> 2.
  EXPECT_EQ(PlanSplits(132, 16, 40, kH200Sms), 2);
  // 5 tiles / 4 = 1.
  EXPECT_EQ(PlanSplits(132, 16, 5, kH200Sms), 1);
}

TEST(PlanSplits, TwoResidentProgramsPerUnit) {
  // GLM TP4 decode C=32: 192 programs, 32 tiles: 2 * 264 / 192 = 2, 32 / 8 = 4 -> 2.
  EXPECT_EQ(PlanSplits(192, 16, 32, kH200Sms, 2), 2);
  // dsv4 TP4 decode C=32: 10 tiles / 8 = 1 -> no split (one program per unit: 1 as well).
  EXPECT_EQ(PlanSplits(192, 16, 10, kH200Sms, 2), 1);
  EXPECT_EQ(PlanSplits(192, 16, 32, kH200Sms, 1), 1);
  // dsv4 TP4 decode C=64: 384 programs: 528 / 384 = 1.
  EXPECT_EQ(PlanSplits(384, 16, 10, kH200Sms, 2), 1);
  // Small grids are sized by units, not slots: 96 programs -> 264 / 96 = 2; 64 -> 4.
  EXPECT_EQ(PlanSplits(96, 16, 10, kH200Sms, 2), 2);
  EXPECT_EQ(PlanSplits(64, 16, 10, kH200Sms, 2), 4);
  // Zero or negative counts act as one.
  EXPECT_EQ(PlanSplits(192, 16, 32, kH200Sms, 0), 1);
}

TEST(PlanHeadBlock, SmallHeadCountsUseSixteen) {
  EXPECT_EQ(PlanHeadBlock(384, 8, 10, 1, kH200Sms), 16);
  EXPECT_EQ(PlanHeadBlock(384, 16, 10, 1, kH200Sms), 16);
}

TEST(PlanHeadBlock, BigBlocksWhenTheGridStaysBusy) {
  // 384 rows x 1 block of 64 = 384 programs, last round 120/132 full, no split.
  EXPECT_EQ(PlanHeadBlock(384, 64, 10, 1, kH200Sms), 64);
  // With split-K a 64-head program is not allowed; 32 heads: 384 * 2 * 2 = 1536 programs,
  // past four rounds, 5 tiles each.
  EXPECT_EQ(PlanHeadBlock(384, 64, 10, 2, kH200Sms), 32);
  // 6 rows, 64 heads: 6 programs of 64 is less than a round; 32 heads with 10 splits = 120
  // programs, one round 120/132 full.
  EXPECT_EQ(PlanHeadBlock(6, 64, 20, 10, kH200Sms), 32);
  // One tile per program: the bigger block cannot amortise anything.
  EXPECT_EQ(PlanHeadBlock(384, 64, 1, 1, kH200Sms), 16);
}

TEST(PlanHeadBlock, RaggedLastRoundFallsBack) {
  // 140 rows x 1 block of 32 = 140 programs: last round 8/132 -> not worth it.
  EXPECT_EQ(PlanHeadBlock(140, 32, 3, 1, kH200Sms), 16);
}

TEST(MakePlan, DecodeAndPrefillCells) {
  // dsv4.1-flash TP4 decode C=1: 6 rows, 16 heads, 128 SWA + 512 top-k.
  LaunchPlan p = MakePlan(Decode(6, 16, 128, 512));
  EXPECT_EQ(p.tiles, 10);
  EXPECT_EQ(p.head_block, 16);
  EXPECT_EQ(p.splits, 10);
  EXPECT_EQ(p.programs, 60);
  // TP8: 8 heads run as one masked 16-head block.
  p = MakePlan(Decode(6, 8, 128, 512));
  EXPECT_EQ(p.head_block, 16);
  EXPECT_EQ(p.head_blocks, 1);
  // Prefill 8K at TP1: no split, 64-head programs.
  p = MakePlan(Decode(8192, 64, 128, 512));
  EXPECT_EQ(p.splits, 1);
  EXPECT_EQ(p.head_block, 64);
  EXPECT_EQ(p.programs, 8192);
  EXPECT_FALSE(p.ToString().empty());
}

TEST(MakePlan, IsAPureFunction) {
  const PlanInput in = Decode(192, 32, 128, 512);
  const LaunchPlan a = MakePlan(in), b = MakePlan(in);
  EXPECT_EQ(a.ToString(), b.ToString());
}

TEST(OverridePlan, ForcesAndClamps) {
  LaunchPlan p = MakePlan(Decode(6, 64, 128, 512));
  LaunchPlan q = OverridePlan(p, 6, 64, 64, 3);
  EXPECT_EQ(q.head_block, 64);
  EXPECT_EQ(q.head_blocks, 1);
  EXPECT_EQ(q.splits, 3);
  EXPECT_EQ(q.programs, 18);
  q = OverridePlan(p, 6, 64, 0, 1000);
  EXPECT_EQ(q.splits, p.tiles);
  q = OverridePlan(p, 6, 64, 0, 0);
  EXPECT_EQ(q.ToString(), p.ToString());
}

// The direct kernel's cost model against the H200 sweep it was fitted to
// (docs/results/kbench-h200.md, "Split planning by a cost model"): each choice below was the
// fastest measured one for that cell.
DirectPlanInput Direct(int64_t units, int32_t heads, int32_t tiles, KvFormat format,
                       int32_t qk_width) {
  DirectPlanInput in;
  in.units = units;
  in.heads = heads;
  in.tiles = tiles;
  in.compute_units = kH200Sms;
  in.arch = "sm_90a";
  in.format = format;
  in.qk_width = qk_width;
  in.blocks16 = 2;
  in.blocks32 = heads % 32 == 0 ? 1 : 0;
  return in;
}

TEST(PlanDirect, MatchesTheFastestMeasuredChoices) {
  auto choice = [](const DirectPlanInput& in) {
    const DirectPlan d = PlanDirect(in);
    return std::pair<int, int>(d.head_block, d.splits);
  };
  constexpr auto kDsv4 = KvFormat::kFp8Dsv4;
  constexpr auto kTensor = KvFormat::kFp8PerTensor;
  // dsv4.1-flash (128 + 512 keys: 10 tiles). decode1 C=16 at TP4: 5 splits of 2 tiles (19.6 us;
  // the rule of PlanSplits gave 10 splits of one tile, 22.4 us).
  EXPECT_EQ(choice(Direct(16, 16, 10, kDsv4, 576)), std::make_pair(16, 5));
  EXPECT_EQ(choice(Direct(64, 16, 10, kDsv4, 576)), std::make_pair(16, 2));  // decode1 C=64
  EXPECT_EQ(choice(Direct(96, 16, 10, kDsv4, 576)), std::make_pair(16, 1));  // decode C=16
  EXPECT_EQ(choice(Direct(6, 16, 10, kDsv4, 576)), std::make_pair(16, 10));  // decode C=1
  // TP2 decode1 C=64: 16-head programs, unsplit (36.3 us; 32-head with 2 splits 41.5).
  EXPECT_EQ(choice(Direct(64, 32, 10, kDsv4, 576)), std::make_pair(16, 1));
  // glm (2,048 keys: 32 tiles). TP4 decode C=1: 16 splits (19.1 us; 32 splits 23.9).
  EXPECT_EQ(choice(Direct(6, 16, 32, kTensor, 512)), std::make_pair(16, 16));
  EXPECT_EQ(choice(Direct(96, 16, 32, kTensor, 576)), std::make_pair(16, 4));  // decode C=16
  // TP1 decode1 C=64: 32-head programs, unsplit (120.2 us; 2 splits 142.0).
  EXPECT_EQ(choice(Direct(64, 64, 32, kTensor, 576)), std::make_pair(32, 1));
  // Full grids never split.
  EXPECT_EQ(choice(Direct(8192, 16, 10, kDsv4, 576)), std::make_pair(16, 1));
  EXPECT_EQ(choice(Direct(768, 32, 32, kTensor, 512)).second, 1);
}

TEST(PlanDirect, NoProgramWithoutTilesAndNothingCheaper) {
  for (int32_t tiles : {1, 2, 3, 7, 10, 32, 43, 100, 300}) {
    for (int64_t units : {1, 6, 16, 96, 133, 384, 2048}) {
      for (int32_t heads : {16, 32, 64}) {
        const DirectPlanInput in = Direct(units, heads, tiles, KvFormat::kFp8Dsv4, 576);
        const DirectPlan d = PlanDirect(in);
        const int32_t per_split = (tiles + d.splits - 1) / d.splits;
        EXPECT_EQ((tiles + per_split - 1) / per_split, d.splits) << tiles << " " << units;
        EXPECT_LE(d.splits, kMaxSplits);
        for (int32_t hb : {16, 32}) {
          if (hb == 32 && heads % 32 != 0) continue;
          for (int32_t s = 1; s <= std::min(tiles, kMaxSplits); ++s) {
            EXPECT_LE(d.estimate_us, EstimateDirectUs(in, hb, s) + 1e-9)
                << tiles << " " << units << " " << heads << " " << hb << " " << s;
          }
        }
      }
    }
  }
}

TEST(PlanDirect, OnlyVariantsThatExist) {
  DirectPlanInput in = Direct(64, 64, 32, KvFormat::kFp8PerTensor, 576);
  in.blocks32 = 0;
  EXPECT_EQ(PlanDirect(in).head_block, 16);
  in.blocks32 = 1;
  in.blocks16 = 0;
  EXPECT_EQ(PlanDirect(in).head_block, 32);
}

// The cost model is chosen by the device's architecture: the H200 fit on sm_90 only, and on
// gfx950 (as on any other architecture) the default, whose constants differ from the fit.
TEST(DirectCostModel, KeyedByTheDevicesArchitecture) {
  DeviceInfo h200;
  h200.kind = BackendKind::kCuda;
  h200.arch = "sm_90a";
  h200.compute_units = kH200Sms;
  DeviceInfo mi355;
  mi355.kind = BackendKind::kHip;
  mi355.arch = "gfx950";
  mi355.compute_units = 256;

  const DirectCostModel& fit = DirectCostModelFor(h200.arch);
  const DirectCostModel& gfx950 = DirectCostModelFor(mi355.arch);
  EXPECT_NE(&fit, &gfx950);
  EXPECT_EQ(&DirectCostModelFor("sm_90"), &fit);
  EXPECT_EQ(&DirectCostModelFor("sm_100a"), &gfx950);  // not the device the fit was made on
  EXPECT_EQ(&DirectCostModelFor("x86_64"), &gfx950);
  EXPECT_THAT(fit.source, HasSubstr("H200"));
  EXPECT_THAT(gfx950.source, HasSubstr("not measured"));
  EXPECT_DOUBLE_EQ(fit.fp8_dsv4.t16, 2.40);
  EXPECT_DOUBLE_EQ(fit.shared_unit_slowdown, 1.66);
  EXPECT_NE(gfx950.fp8_dsv4.t16, fit.fp8_dsv4.t16);
  EXPECT_NE(gfx950.shared_unit_slowdown, fit.shared_unit_slowdown);

  // The planner's input takes the architecture from the device, and the estimate uses that
  // architecture's constants: one unsplit 16-head program of 10 tiles costs p16 + 10 t16.
  for (const DeviceInfo* device : {&h200, &mi355}) {
    DirectPlanInput in = DirectPlanInputFor(*device);
    EXPECT_EQ(in.arch, device->arch);
    EXPECT_EQ(in.compute_units, device->compute_units);
    in.units = 1;
    in.heads = 16;
    in.tiles = 10;
    in.blocks16 = 1;
    const DirectProgramCost& c = DirectCostModelFor(device->arch).fp8_dsv4;
    EXPECT_DOUBLE_EQ(EstimateDirectUs(in, 16, 1), c.p16 + 10 * c.t16) << device->arch;
  }
  DirectPlanInput on_h200 = DirectPlanInputFor(h200);
  on_h200.units = 1;
  on_h200.heads = 16;
  on_h200.tiles = 10;
  on_h200.blocks16 = 1;
  EXPECT_DOUBLE_EQ(EstimateDirectUs(on_h200, 16, 1), 2.16 + 10 * 2.40);
}

TEST(MaxSegmentLength, LongestRow) {
  const std::vector<int32_t> indptr = {0, 3, 3, 10, 12};
  EXPECT_EQ(MaxSegmentLength(indptr), 7);
  EXPECT_EQ(MaxSegmentLength(std::vector<int32_t>{0}), 0);
}

// The row-union kernel keeps every entry of the first row, drops later rows' invalid ids and
// matches each key an earlier row holds with its first entry in each later row.
int64_t Union(std::initializer_list<std::vector<int32_t>> rows) {
  std::vector<std::span<const int32_t>> spans(rows.begin(), rows.end());
  return UnionLength(spans, 100);
}

TEST(UnionLength, CountsWhatTheRowUnionKernelWritesForPairs) {
  EXPECT_EQ(Union({{1, 2, 3}, {4, 5}}), 5);
  EXPECT_EQ(Union({{1, 2, 3}, {3, 2, 1}}), 3);
  EXPECT_EQ(Union({{1, 2}, {2, 2, 6}}), 4);  // the second 2 is its own
  EXPECT_EQ(Union({{1, 1}, {1}}), 2);        // so is the first row's
  EXPECT_EQ(Union({{-1, 7, 100}, {-1, 7, 100, 8}}), 4);
  EXPECT_EQ(Union({{}, {5, -3}}), 1);
  EXPECT_EQ(Union({{5}, {}}), 1);
  EXPECT_EQ(Union({}), 0);
}

TEST(UnionLength, CountsWhatTheRowUnionKernelWritesForLongerUnits) {
  EXPECT_EQ(Union({{1, 2}, {2, 3}, {3, 4}, {1, 4}}), 4);
  // A key a later row enters is matched by the rows after it, once per row.
  EXPECT_EQ(Union({{1}, {2, 2}, {2, 2}, {2}}), 4);
  // A row's first occurrence takes the entry even where an earlier row matched it.
  EXPECT_EQ(Union({{1}, {1}, {1}, {1, 1}}), 2);
  EXPECT_EQ(Union({{-1, 1}, {-1}, {1, 5, 5}, {5}}), 4);
  EXPECT_EQ(Union({{1}}), 1);
}

}  // namespace
}  // namespace smla::kernels
