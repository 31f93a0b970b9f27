#include "gpu/attend_launch.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "smla/base/align.h"
#include "smla/base/strings.h"
#include "smla/kernels/epilogue.h"

namespace smla::kernels::gpu {
namespace {

// The warpgroup program pays from one (row, 64-head) program per this many SMs: on 132 SMs
// from 12 programs (decode C=2 of 6 rows), where split direct programs were faster with 6
// (docs/results/kbench-h200.md, "The warpgroup program at 64 heads").
constexpr int kWgmmaSmsPerProgram = 11;
// Row pairs on the warpgroup program pay from one pair per this many SMs (decode C=12 of 6 rows
// on 132 SMs, split three ways), where the direct kernel was faster with fewer
// (docs/results/kbench-h200.md, "Row pairs on the warpgroup program").
constexpr int kWgmmaSmsPerPair = 4;

// Between one and one and a half waves of warpgroup programs (one per SM), the first wave's
// units run whole and only the rest split in two, which the SMs the first wave leaves free then
// take: about 1.5 waves' time instead of 2, with partials for those units alone
// (docs/results/kbench-h200.md, "Whole units first").
bool WholeUnitsFirst(int64_t units, int compute_units) {
  return units > compute_units && 2 * units <= 3 * int64_t{compute_units};
}

int Log2(int32_t v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

SegmentArgs SegmentFor(const Segment& sg, float softmax_scale, float q_scale) {
  SegmentArgs a;
  a.base = static_cast<const uint8_t*>(sg.cache.base);
  a.pitch = sg.cache.pitch_bytes;
  a.num_slots = sg.cache.num_slots();
  a.rows_per_page = sg.cache.rows_per_page;
  a.rows_per_page_log2 = Log2(sg.cache.rows_per_page);
  a.format = static_cast<int>(sg.cache.format);
  // fp8_per_tensor stages raw codes: its scale multiplies the score and P, not the denominator.
  const float sigma = sg.cache.format == KvFormat::kFp8PerTensor ? sg.cache.scale : 1.0f;
  a.score_scale2 = softmax_scale * q_scale * sigma * kLog2e;
  a.p_scale = sigma;
  // Weights up to 2^8 keep p * sigma finite for any sigma below 2^100 (docs/gpu.md, "Lazy
  // rescaling").
  a.rescale_slack = sigma <= 0x1p100f ? 8.0f : 0.0f;
  return a;
}

// Keys of the union the row-union kernel builds for a segment's rows [row, row + g).
int64_t UnitKeys(const Segment& s, int32_t row, int g) {
  std::vector<std::span<const int32_t>> rows;
  int64_t total = 0, longest = 0;
  for (int r = 0; r < g; ++r) {
    const int32_t a = s.indptr[row + r], b = s.indptr[row + r + 1];
    rows.push_back(s.indices_on_device ? std::span<const int32_t>() : s.indices.subspan(a, b - a));
    total += b - a;
    longest = std::max<int64_t>(longest, b - a);
  }
  if (longest > kUnionMaxRow) return total;  // the kernel concatenates them
  // Windows ending at consecutive positions p .. p + g - 1 cover [p - W + 1, p + g - 1] once
  // full and [0, p + g - 1] before: the first window and g - 1 keys.
  if (s.sliding_window) {
    const int64_t first = s.indptr[row + 1] - s.indptr[row];
    return std::min(total, std::max(longest, first + g - 1));
  }
  // Other indices in backend memory cannot be read here: their concatenation bounds the union.
  if (s.indices_on_device) return total;
  return UnionLength(rows, s.cache.num_slots());
}

// 64-key tiles of the union the row-union kernel builds for the call's longest unit of g rows
// (the most entries over both segments; rows past kUnionMaxRow are concatenated there): the
// plan's tiles per unit, from the call's own keys rather than an assumed overlap.
int64_t LongestUnitUnionTiles(const AttendParams& params, int g) {
  const int nseg = params.has_extra ? 2 : 1;
  auto segment = [&](int sg) -> const Segment& { return sg == 0 ? params.main : params.extra; };
  int64_t longest = -1;
  int32_t unit = 0;
  for (int32_t i = 0; g * (i + 1) <= params.num_rows; ++i) {
    int64_t n = 0;
    for (int sg = 0; sg < nseg; ++sg) {
      n += segment(sg).indptr[g * (i + 1)] - segment(sg).indptr[g * i];
    }
    if (n > longest) {
      longest = n;
      unit = i;
    }
  }
  int64_t tiles = 0;
  for (int sg = 0; sg < nseg; ++sg) {
    tiles += (UnitKeys(segment(sg), g * unit, g) + kKeyTile - 1) / kKeyTile;
  }
  return tiles;
}

// PlanAttend's phases, in order, each deciding one part of the launch in `l_`:
//   PlanHeads            the launch plan (plan.h) and whether the formats take the direct kernel
//   FitTileProgram       the tile kernel's head block, stages and shared memory
//   ChooseDirectProgram  the direct kernel's head block and splits, where the formats take it
//   ChooseWgmmaProgram   the 64-head warpgroup program, where asked and it fits
//   ChooseWgmmaGroups    the warpgroup program over row groups (H <= 32), where that pays
//   ChooseRowPairs       paired direct programs over their keys' union, where that pays
//   LayOutWorkspace      the workspace offsets of the staged arrays and split-K partials
//   FillKernelParams     the kernels' parameters (device pointers come from BindAttend)
class AttendPlanner {
 public:
  AttendPlanner(const AttendParams& params, const DeviceInfo& device)
      : params_(params), device_(device), T_(params.num_rows), H_(params.num_heads) {
    l_.qk_width = QkWidth(params.geometry);
    use_tile_ = params.main.cache.format != KvFormat::kBf16;
    if (mixed()) use_tile_ = use_tile_ || params.extra.cache.format != KvFormat::kBf16;
    dstage_ = DirectStageBytes(params.main.cache.format, l_.qk_width);
    if (mixed()) {
      dstage_ = std::max(dstage_, DirectStageBytes(params.extra.cache.format, l_.qk_width));
    }
  }

  absl::StatusOr<AttendLaunch> Plan() {
    PlanHeads();
    if (absl::Status st = FitTileProgram(); !st.ok()) return st;
    ChooseDirectProgram();
    ChooseWgmmaProgram();
    ChooseWgmmaGroups();
    ChooseRowPairs();
    LayOutWorkspace();
    FillKernelParams();
    return l_;
  }

 private:
  bool mixed() const { return params_.has_extra; }

  void PlanHeads() {
    in_.num_rows = T_;
    in_.num_heads = H_;
    in_.format = params_.main.cache.format;
    in_.max_main_keys = MaxSegmentLength(params_.main.indptr);
    in_.max_extra_keys = params_.has_extra ? MaxSegmentLength(params_.extra.indptr) : 0;
    in_.compute_units = device_.compute_units;
    // fp8_dsv4 / fp8_per_tensor segments run on the direct kernel in 16-head programs (two per
    // SM) or 32-head programs (one per SM), head block and splits by its cost model
    // (PlanDirect) unless forced. Where the plan asks for 64 heads, fp8_dsv4 keeps the tile
    // kernel's 64-head programs and fp8_per_tensor takes the direct kernel, where each was the
    // faster on the H200 (docs/results/kbench-h200.md, "Split planning by a cost model").
    // On sm_90a the warpgroup program replaces both on fp8_dsv4 calls with at least one (row,
    // 64-head) program per kWgmmaSmsPerProgram SMs (WgmmaUse::kAuto; docs/results/kbench-h200.md,
    // "The warpgroup program at 64 heads"), its splits planned as the tile kernel's.
    // force_tile_kernel keeps the tile kernel everywhere (for A/B measurements).
    const bool tile_only = params_.force_tile_kernel;
    auto per_tensor = [](KvFormat f) { return f == KvFormat::kFp8PerTensor; };
    auto dsv4 = [](KvFormat f) { return f == KvFormat::kFp8Dsv4; };
    const bool direct_for_64 = per_tensor(params_.main.cache.format) &&
                               (!params_.has_extra || per_tensor(params_.extra.cache.format));
    const bool wgmma_auto =
        params_.wgmma == WgmmaUse::kAuto && !tile_only && H_ % 64 == 0 &&
        (params_.force_head_block == 0 || params_.force_head_block == 64) &&
        params_.row_pairs != RowPairs::kAlways && dsv4(params_.main.cache.format) &&
        (!params_.has_extra || dsv4(params_.extra.cache.format)) && WgmmaFits() &&
        int64_t{T_} * (H_ / 64) * kWgmmaSmsPerProgram >= device_.compute_units;
    l_.plan = OverridePlan(MakePlan(in_), T_, H_, wgmma_auto ? 64 : params_.force_head_block,
                           params_.force_splits);
    want_wgmma_ = wgmma_auto || params_.wgmma == WgmmaUse::kAlways;
    const bool wgmma_64 = want_wgmma_ && l_.plan.head_block == 64;
    direct_formats_ =
        !tile_only && !wgmma_64 && DirectFormat(params_.main.cache.format) &&
        (!params_.has_extra || DirectFormat(params_.extra.cache.format)) &&
        (params_.force_head_block == 16 || params_.force_head_block == 32 ||
         (params_.force_head_block == 0 && (l_.plan.head_block <= 32 || direct_for_64)));
    if (direct_formats_) {
      in_.programs_per_unit = 2;
      l_.plan = OverridePlan(MakePlan(in_), T_, H_, params_.force_head_block, params_.force_splits);
    }
  }

  int32_t StageFor(int keys) const {
    int32_t b = StageBytes(params_.main.cache.format, l_.qk_width, keys);
    if (mixed()) b = std::max(b, StageBytes(params_.extra.cache.format, l_.qk_width, keys));
    return b;
  }

  // Gather stages that fit a tile program of head block hb in shared memory: as many as
  // possible up to 3, else 0.
  int StagesFor(int hb) const {
    const int keys = AttendVariantKeys(l_.qk_width, hb);
    if (keys == 0) return 0;
    for (int n : {3, 2, 1}) {
      if (AttendSharedBytes(l_.qk_width, hb, StageFor(keys), n, use_tile_, keys) <=
          device_.shared_memory_per_block) {
        return n;
      }
    }
    return 0;
  }

  absl::Status FitTileProgram() {
    auto fits = [&](int hb) { return StagesFor(hb) > 0; };
    if (!fits(l_.plan.head_block)) {
      if (params_.force_head_block > 0) {
        return absl::UnimplementedError(absl::StrCat(
            "no ", l_.plan.head_block, "-head attention program for geometry ",
            Sv(GeometryName(params_.geometry)), " with main format ",
            Sv(KvFormatName(params_.main.cache.format)),
            params_.has_extra
                ? absl::StrCat(" and extra format ", Sv(KvFormatName(params_.extra.cache.format)))
                : std::string(),
            " (shared memory)"));
      }
      // The plan is advice: step down to the largest head block that exists and fits.
      while (l_.plan.head_block > 16 && !fits(l_.plan.head_block)) l_.plan.head_block /= 2;
      l_.plan.head_blocks = (H_ + l_.plan.head_block - 1) / l_.plan.head_block;
      l_.plan.programs = int64_t{T_} * l_.plan.head_blocks * l_.plan.splits;
    }
    num_stages_ = StagesFor(l_.plan.head_block);
    const int keys = AttendVariantKeys(l_.qk_width, l_.plan.head_block);
    stage_ = StageFor(keys);
    l_.shared_bytes =
        AttendSharedBytes(l_.qk_width, l_.plan.head_block, stage_, num_stages_, use_tile_, keys);
    return absl::OkStatus();
  }

  // The warpgroup program exists in this build for the call's formats and QK width, and its
  // shared memory fits.
  bool WgmmaFits() const {
    return l_.qk_width == 512 && WgmmaProgramSupported() &&
           DirectFormat(params_.main.cache.format) &&
           (!mixed() || DirectFormat(params_.extra.cache.format)) &&
           WgmmaSharedBytes() <= device_.shared_memory_per_block;
  }

  // AttendParams::wgmma: a 64-head tile plan on fp8_dsv4 / fp8_per_tensor segments of width 512
  // runs the warpgroup program where PlanHeads wants it and it fits.
  void ChooseWgmmaProgram() {
    if (!want_wgmma_ || l_.direct || l_.plan.head_block != 64 || !WgmmaFits()) return;
    l_.wgmma = true;
    l_.shared_bytes = WgmmaSharedBytes();
    // Decode calls of one 64-head block between one and 1.5 waves: whole units first.
    if (params_.force_splits == 0 && T_ < kPrefillRows && l_.plan.head_blocks == 1 &&
        WholeUnitsFirst(T_, device_.compute_units)) {
      SplitPastFirstWave(T_);
    }
  }

  // WholeUnitsFirst: the first compute_units of `units` programs run whole, the rest in two
  // splits each.
  void SplitPastFirstWave(int64_t units) {
    whole_units_ = device_.compute_units;
    l_.plan.splits = 2;
    l_.plan.programs = whole_units_ + (units - whole_units_) * 2;
    l_.combine_first_row = static_cast<int32_t>(
        l_.paired != PairMode::kNone ? union_rows_ * whole_units_ : whole_units_);
  }

  // Row groups on the warpgroup program (PairMode::kRowGroups): with H <= 32 heads a row, the g
  // rows of a unit (GroupRows) fill the program's 64 product rows over the union of their keys,
  // so each shared key is read and dequantised once for all of them, and the products run on
  // g H rows where an H-head program would leave most of an m64 product empty. By default
  // (RowPairs::kAuto, WgmmaUse::kAuto) on fp8_dsv4 with at least one unit per kWgmmaSmsPerPair
  // SMs whose units fill at least half of the product rows: at 32 heads (pairs) in decode and
  // prefill calls, at 8 and 16 heads (units of up to 8 and 4 rows) in prefill calls only, where
  // the direct kernel was faster at decode. A decode call splits each unit's keys as often as
  // one wave of programs allows (fewer units than SMs), or runs whole units first
  // (WholeUnitsFirst), prefill neither. WgmmaUse::kAlways with pairs allowed takes it for
  // fp8_per_tensor, fewer units and other calls too (docs/results/kbench-h200.md, "Row groups
  // on the warpgroup program").
  void ChooseWgmmaGroups() {
    auto dsv4 = [](KvFormat f) { return f == KvFormat::kFp8Dsv4; };
    const int g = GroupRows();
    if (g == 0 || params_.force_tile_kernel || !WgmmaFits()) return;
    const int64_t units = T_ / g;
    const bool forced = params_.wgmma == WgmmaUse::kAlways && params_.row_pairs != RowPairs::kNever;
    const bool automatic =
        params_.wgmma == WgmmaUse::kAuto && params_.row_pairs == RowPairs::kAuto &&
        dsv4(params_.main.cache.format) && (!mixed() || dsv4(params_.extra.cache.format)) &&
        (H_ == 32 || T_ >= kPrefillRows) && 2 * g * H_ >= 64 &&
        units * kWgmmaSmsPerPair >= device_.compute_units;
    if (!(forced || automatic) || !FitUnionTable(g)) return;
    const int64_t tiles = std::max<int64_t>(1, LongestUnitUnionTiles(params_, g));
    union_rows_ = g;
    l_.direct = false;
    l_.wgmma = true;
    l_.paired = PairMode::kRowGroups;
    l_.plan.head_block = H_;
    l_.plan.head_blocks = 1;
    l_.plan.tiles = static_cast<int32_t>(tiles);
    l_.shared_bytes = WgmmaSharedBytes();
    if (params_.force_splits == 0 && T_ < kPrefillRows &&
        WholeUnitsFirst(units, device_.compute_units)) {
      SplitPastFirstWave(units);
      return;
    }
    int64_t splits = params_.force_splits;
    if (splits == 0) {
      splits = T_ >= kPrefillRows ? 1 : std::max<int64_t>(1, device_.compute_units / units);
    }
    l_.plan.splits =
        static_cast<int32_t>(std::clamp<int64_t>(splits, 1, std::min<int64_t>(tiles, kMaxSplits)));
    l_.plan.programs = units * l_.plan.splits;
  }

  // Rows per unit of the warpgroup program over row groups: the most rows (up to
  // kMaxUnionRows) whose heads fit its 64 product rows and that divide the caller's groups
  // (AttendParams::rows_per_group) and the call's rows; 0 where fewer than two, or where H is
  // not a power of two of at most 32, the build does not pair rows or a head block is forced.
  int GroupRows() const {
    if (!RowPairsSupported() || params_.rows_per_group < 2 || params_.force_head_block != 0 ||
        H_ > 32 || 64 % H_ != 0) {
      return 0;
    }
    for (int g = std::min(64 / H_, kMaxUnionRows); g >= 2; --g) {
      if (params_.rows_per_group % g == 0 && T_ % g == 0) return g;
    }
    return 0;
  }

  // Gather stages of a direct program of hb head slots when as many run per SM as its variant
  // is compiled for: as many as fit up to kDirectMaxStages, or 0 below two or without such a
  // variant. The per-SM shared memory is the per-block limit plus one 1 KB reservation; each
  // resident program reserves 1 KB.
  int DirectStages(int hb) const {
    const int blocks = DirectVariantBlocks(l_.qk_width, hb);
    if (blocks == 0) return 0;
    const int64_t cap = (device_.shared_memory_per_block + 1024) / blocks - 1024;
    for (int k = kDirectMaxStages; k >= 2; --k) {
      if (DirectSharedBytes(l_.qk_width, hb, dstage_, k) <= cap) return k;
    }
    return 0;
  }

  // The direct cost model's input for `units` programs' worth of `heads` heads over `tiles`
  // tiles, offering the head blocks in `hbs` that have a variant with gather stages.
  DirectPlanInput DirectInput(int64_t units, int32_t heads, int32_t tiles,
                              std::initializer_list<int> hbs) const {
    DirectPlanInput d = DirectPlanInputFor(device_);  // its architecture picks the cost model
    d.units = units;
    d.heads = heads;
    d.tiles = tiles;
    d.format = params_.main.cache.format;
    d.qk_width = l_.qk_width;
    for (int hb : hbs) {
      (hb == 32 ? d.blocks32 : d.blocks16) =
          DirectStages(hb) > 0 ? DirectVariantBlocks(l_.qk_width, hb) : 0;
    }
    return d;
  }

  void ChooseDirectProgram() {
    if (!direct_formats_) return;
    int hb = params_.force_head_block > 0               ? params_.force_head_block
             : l_.plan.head_block >= 32 && H_ % 32 == 0 ? 32
                                                        : 16;
    int splits = l_.plan.splits;
    if (params_.force_head_block == 0 && params_.force_splits == 0) {
      const DirectPlan d = PlanDirect(DirectInput(T_, H_, l_.plan.tiles, {16, 32}));
      hb = d.head_block;
      splits = d.splits;
    }
    const int n = DirectStages(hb);
    if (n == 0) return;
    l_.direct = true;
    l_.plan.head_block = hb;
    l_.plan.head_blocks = (H_ + hb - 1) / hb;
    l_.plan.splits = splits;
    l_.plan.programs = int64_t{T_} * l_.plan.head_blocks * l_.plan.splits;
    num_stages_ = n;
    stage_ = dstage_;
    l_.shared_bytes = DirectSharedBytes(l_.qk_width, hb, dstage_, n);
  }

  // Paired rows (AttendParams::row_pairs): a request's consecutive rows share most keys, so
  // rows 2i and 2i+1 run as one direct program over the union of their keys (built on the
  // device by the row-union kernel), gathering and converting each shared key once. Only where
  // the caller says rows come in even groups of one sequence (AttendParams::rows_per_group)
  // and no head block is forced.
  // - H = 8 (half pairs, RowPairs::kAuto): the two rows' 8 heads fill one 16-head program,
  //   which unpaired masks half of its heads. By default only with at least a quarter as many
  //   pairs as SMs: the row-union kernel's fixed cost does not pay for fewer
  //   (docs/results/kbench-h200.md, "Half pairs for H = 8").
  // - H a multiple of 16 (RowPairs::kAlways only, decode calls): the two 16-head groups of a
  //   32-head program. Slower on the H200 than two 16-head programs, whose DRAM bytes were
  //   already the unique ones (the same section says why).
  void ChooseRowPairs() {
    const bool half_pairs = H_ <= 8;
    const int pair_hb = half_pairs ? 16 : 32;  // the program's head slots
    const bool want_pairs = params_.row_pairs == RowPairs::kAlways ||
                            (params_.row_pairs == RowPairs::kAuto && half_pairs &&
                             int64_t{T_} / 2 * 4 >= device_.compute_units);
    if (l_.direct && PairableRows() && want_pairs && (half_pairs || T_ < kPrefillRows) &&
        (half_pairs || H_ % 16 == 0)) {
      const int n = DirectStages(pair_hb);
      if (n > 0 && FitUnionTable(2)) {
        // The kernel splits each pair's own union tiles; the split count is planned for those
        // of the longest pair.
        const int64_t est = std::max<int64_t>(1, LongestUnitUnionTiles(params_, 2));
        const int64_t pairs = T_ / 2;
        const int32_t hbs = half_pairs ? 1 : H_ / 16;
        // Splits by the direct cost model (plan.h), a pair counting as a unit of pair_hb heads
        // (a 32-head program per pair and head block of 16 for kGroups).
        int splits = std::clamp(params_.force_splits, 1, kMaxSplits);
        if (params_.force_splits == 0) {
          splits =
              PlanDirect(DirectInput(pairs * hbs, pair_hb, static_cast<int32_t>(est), {pair_hb}))
                  .splits;
        }
        l_.paired = half_pairs ? PairMode::kHalves : PairMode::kGroups;
        union_rows_ = 2;
        l_.plan.head_block = 16;
        l_.plan.head_blocks = static_cast<int32_t>(hbs);
        l_.plan.splits = splits;
        l_.plan.tiles = static_cast<int32_t>(est);
        l_.plan.programs = pairs * hbs * splits;
        num_stages_ = n;
        stage_ = dstage_;
        l_.shared_bytes = DirectSharedBytes(l_.qk_width, pair_hb, dstage_, n);
      }
    }
    if (l_.paired == PairMode::kRowGroups) return;  // ChooseWgmmaGroups
    l_.program_head_block = l_.paired == PairMode::kGroups ? 32 : l_.plan.head_block;
  }

  // The caller's rows come in even groups of one sequence, the build pairs rows, and no head
  // block is forced.
  bool PairableRows() const {
    return RowPairsSupported() && params_.rows_per_group >= 2 && params_.rows_per_group % 2 == 0 &&
           T_ % 2 == 0 && params_.force_head_block == 0;
  }

  // Sizes the row-union table (union_bits_) for units of g rows: kUnionSlotsPerKey entries per
  // key of the longest row, and at least two per key of a unit's rows but its last, where shared
  // memory allows (rows past kUnionMaxRow are concatenated, not hashed). False where it cannot
  // hold two entries per key of those rows (the kernel would concatenate the longest units).
  bool FitUnionTable(int g) {
    const int64_t longest =
        std::min<int64_t>(kUnionMaxRow, std::max(in_.max_main_keys, in_.max_extra_keys));
    const int64_t held = 2 * (g - 1) * longest;
    while (union_bits_ < kMaxUnionBits &&
           (int64_t{1} << union_bits_) < std::max(kUnionSlotsPerKey * longest, held) &&
           RowUnionSharedBytes(union_bits_ + 1) <= device_.shared_memory_per_block - 1024) {
      ++union_bits_;
    }
    return (int64_t{1} << union_bits_) >= held;
  }

  void LayOutWorkspace() {
    int64_t off = 0;
    auto add = [&](int64_t bytes) {
      const int64_t at = off;
      off = AlignUp(off + bytes, 16);
      return at;
    };
    // Arrays already in backend memory are read where they lie, not staged: indices the device
    // wrote, and host arrays in the caller's mirror.
    auto place = [&](const auto& array) {
      AttendLaunch::ArrayPlace at;
      at.device = params_.arrays.Find(array);
      if (at.device == nullptr && !array.empty()) {
        at.off = add(static_cast<int64_t>(array.size_bytes()));
      }
      return at;
    };
    auto indices = [&](const Segment& sg) {
      if (!sg.indices_on_device) return place(sg.indices);
      return AttendLaunch::ArrayPlace{-1, sg.indices.data()};
    };
    l_.indptr[0] = place(params_.main.indptr);
    l_.indices[0] = indices(params_.main);
    if (params_.has_extra) {
      l_.indptr[1] = place(params_.extra.indptr);
      l_.indices[1] = indices(params_.extra);
    }
    l_.positions = place(params_.epilogue.positions);
    l_.sink = place(params_.sink);
    l_.staged_bytes = off;
    if (l_.paired != PairMode::kNone) {
      const int nseg = params_.has_extra ? 2 : 1;
      for (int sg = 0; sg < nseg; ++sg) {
        const int64_t nnz =
            static_cast<int64_t>((sg == 0 ? params_.main.indices : params_.extra.indices).size());
        l_.off_union_indices[sg] = add(4 * nnz);
        l_.off_union_mask[sg] = add(nnz);
        l_.off_union_count[sg] = add(4 * (int64_t{T_} / union_rows_));
      }
    }
    const int64_t part_rows = l_.plan.splits > 1 ? int64_t{T_} * H_ * l_.plan.splits : 0;
    l_.off_part_acc = AlignUp(off, 256);
    l_.off_part_ml = l_.off_part_acc + part_rows * kValueWidth * 4;
    l_.workspace_bytes = l_.off_part_ml + part_rows * 2 * 4;
  }

  void FillKernelParams() {
    const AttendParams& params = params_;
    AttendKernelParams& k = l_.kernel;
    const float qs = params.q_type == QType::kFp8 ? params.q_scale : 1.0f;
    k.q = params.q;
    k.q_fp8 = params.q_type == QType::kFp8 ? 1 : 0;
    k.q_before_launch = params.q_before_launch ? 1 : 0;
    k.num_rows = T_;
    k.num_heads = H_;
    k.num_segments = params.has_extra ? 2 : 1;
    k.seg[0] = SegmentFor(params.main, params.softmax_scale, qs);
    if (params.has_extra) k.seg[1] = SegmentFor(params.extra, params.softmax_scale, qs);
    k.head_blocks = l_.plan.head_blocks;
    k.splits = l_.plan.splits;
    k.tiles_per_split = std::max(1, (l_.plan.tiles + l_.plan.splits - 1) / l_.plan.splits);
    k.whole_units = static_cast<int32_t>(whole_units_);
    k.stage_bytes = stage_;
    k.num_stages = num_stages_;
    k.use_tile = use_tile_ ? 1 : 0;
    // no_scale_fold turns the folded fp8_dsv4 conversion off (for A/B measurements).
    k.fold_scales = params.no_scale_fold ? 0 : 1;
    k.q_tensor_map = params.wgmma_q_tensor_map ? 1 : 0;
    // Staged rows pay in prefill calls of one row or a pair a program; at decode they only add
    // latency, and units of 3-8 rows measured slower with them on some layers
    // (docs/results/kbench-h200.md, "Final rows through shared memory").
    const WgmmaStagedRows staged = params.wgmma_staged_rows;
    const bool few_rows = l_.paired != PairMode::kRowGroups || union_rows_ <= 2;
    k.staged_rows = staged == WgmmaStagedRows::kAlways ||
                            (staged == WgmmaStagedRows::kAuto && T_ >= kPrefillRows && few_rows)
                        ? 1
                        : 0;
    k.paired = static_cast<int32_t>(l_.paired);
    k.union_bits = union_bits_;
    k.union_rows = union_rows_;
    k.row_heads_log2 = Log2(H_);
    k.cos_sin = params.epilogue.cos_sin;
    k.out_mxfp8 = params.out.format == OutputFormat::kMxfp8 ? 1 : 0;
    k.out_bf16 = static_cast<uint16_t*>(params.out.bf16);
    k.mx_data = params.out.mx_data;
    k.mx_scales = params.out.mx_scales;
    k.lse = params.out.lse;

    // The combine's rows start at combine_first_row (BindAttend offsets its workspace arrays).
    CombineKernelParams& c = l_.combine;
    const int64_t first = int64_t{l_.combine_first_row} * H_;  // (row, head) pairs before it
    auto at = [&](auto* ptr, int64_t per) { return ptr == nullptr ? ptr : ptr + first * per; };
    c.num_rows = T_ - l_.combine_first_row;
    c.num_heads = H_;
    c.splits = l_.plan.splits;
    c.cos_sin = k.cos_sin;
    c.out_mxfp8 = k.out_mxfp8;
    c.out_bf16 = at(k.out_bf16, kValueWidth);
    c.mx_data = at(k.mx_data, kValueWidth);
    c.mx_scales = at(k.mx_scales, kMxGroupsPerHead);
    c.lse = at(k.lse, 1);
  }

  const AttendParams& params_;
  const DeviceInfo& device_;
  const int32_t T_;
  const int32_t H_;
  AttendLaunch l_;
  PlanInput in_;
  bool direct_formats_ = false;  // the formats take the direct kernel (PlanHeads)
  bool want_wgmma_ = false;      // the warpgroup program where the plan runs 64 heads (PlanHeads)
  bool use_tile_ = false;        // the tile kernel stages converted keys (non-bf16 formats)
  int32_t dstage_ = 0;           // a direct program's gather stage bytes
  int32_t stage_ = 0;            // the chosen program's gather stage bytes
  int num_stages_ = 0;
  int union_bits_ = 6;       // the row-union table (paired launches)
  int union_rows_ = 2;       // rows per unit of paired launches
  int64_t whole_units_ = 0;  // AttendKernelParams::whole_units
};

}  // namespace

absl::StatusOr<AttendLaunch> PlanAttend(const AttendParams& params, const DeviceInfo& device) {
  return AttendPlanner(params, device).Plan();
}

namespace {

// The call's staged host arrays (CSR, positions, sink) with their workspace offsets.
void ForEachStagedArray(const AttendParams& params, const AttendLaunch& l,
                        absl::FunctionRef<void(int64_t off, const void* src, size_t bytes)> fn) {
  auto put = [&](const AttendLaunch::ArrayPlace& at, const auto& array) {
    if (at.off >= 0) fn(at.off, array.data(), array.size_bytes());
  };
  put(l.indptr[0], params.main.indptr);
  put(l.indices[0], params.main.indices);
  if (params.has_extra) {
    put(l.indptr[1], params.extra.indptr);
    put(l.indices[1], params.extra.indices);
  }
  put(l.positions, params.epilogue.positions);
  put(l.sink, params.sink);
}

}  // namespace

void StageAttend(const AttendParams& params, const AttendLaunch& l, uint8_t* host) {
  ForEachStagedArray(params, l, [host](int64_t off, const void* src, size_t bytes) {
    std::memcpy(host + off, src, bytes);
  });
}

void BindAttend(AttendLaunch& l, uint8_t* ws) {
  AttendKernelParams& k = l.kernel;
  auto at = [ws](const AttendLaunch::ArrayPlace& a) {
    return a.off >= 0 ? static_cast<const void*>(ws + a.off) : a.device;
  };
  for (int s = 0; s < k.num_segments; ++s) {
    k.seg[s].indptr = static_cast<const int32_t*>(at(l.indptr[s]));
    k.seg[s].indices = static_cast<const int32_t*>(at(l.indices[s]));
    if (l.paired != PairMode::kNone) {
      k.seg[s].union_indices = reinterpret_cast<int32_t*>(ws + l.off_union_indices[s]);
      k.seg[s].union_mask = ws + l.off_union_mask[s];
      k.seg[s].union_count = reinterpret_cast<int32_t*>(ws + l.off_union_count[s]);
    }
  }
  k.positions = static_cast<const int32_t*>(at(l.positions));
  k.sink = static_cast<const float*>(at(l.sink));
  k.part_acc = reinterpret_cast<float*>(ws + l.off_part_acc);
  k.part_ml = reinterpret_cast<float*>(ws + l.off_part_ml);
  // The combine's rows from combine_first_row on (FillKernelParams).
  const int64_t first = int64_t{l.combine_first_row} * k.num_heads * k.splits;
  l.combine.part_acc = k.part_acc + first * kValueWidth;
  l.combine.part_ml = k.part_ml + first * 2;
  l.combine.positions = k.positions == nullptr ? nullptr : k.positions + l.combine_first_row;
  l.combine.sink = k.sink;
}

absl::Status RunAttend(const AttendLaunch& l, StreamHandle stream) {
  if (l.kernel.num_rows == 0) return absl::OkStatus();
  if (l.paired != PairMode::kNone) {
    if (absl::Status st = LaunchRowUnion(l.kernel, stream); !st.ok()) return st;
  }
  if (absl::Status st = l.wgmma    ? LaunchAttendWgmma(l.kernel, l.shared_bytes, stream)
                        : l.direct ? LaunchAttendDirect(l.kernel, l.qk_width, l.program_head_block,
                                                        l.shared_bytes, stream)
                                   : LaunchAttend(l.kernel, l.qk_width, l.plan.head_block,
                                                  l.shared_bytes, stream);
      !st.ok()) {
    return st;
  }
  if (l.plan.splits == 1) return absl::OkStatus();
  return LaunchCombine(l.combine, stream);
}

}  // namespace smla::kernels::gpu
