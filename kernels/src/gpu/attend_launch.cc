#include "gpu/attend_launch.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "smla/base/align.h"
#include "smla/base/strings.h"
#include "smla/kernels/epilogue.h"

namespace smla::kernels::gpu {
namespace {

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
  return a;
}

// 64-key tiles of the union the row-union kernel builds for the call's longest row pair (the
// most entries over both segments; rows past kUnionMaxRow are concatenated there): the plan's
// tiles per pair, from the call's own keys rather than an assumed overlap.
int64_t LongestPairUnionTiles(const AttendParams& params) {
  const int nseg = params.has_extra ? 2 : 1;
  auto segment = [&](int sg) -> const Segment& { return sg == 0 ? params.main : params.extra; };
  int64_t longest = -1;
  int32_t pair = 0;
  for (int32_t i = 0; 2 * i + 1 < params.num_rows; ++i) {
    int64_t n = 0;
    for (int sg = 0; sg < nseg; ++sg) {
      n += segment(sg).indptr[2 * i + 2] - segment(sg).indptr[2 * i];
    }
    if (n > longest) {
      longest = n;
      pair = i;
    }
  }
  int64_t tiles = 0;
  for (int sg = 0; sg < nseg; ++sg) {
    const Segment& s = segment(sg);
    const int32_t a0 = s.indptr[2 * pair];
    const int32_t a1 = s.indptr[2 * pair + 1];
    const int32_t b1 = s.indptr[2 * pair + 2];
    const int64_t n = a1 - a0 > kUnionMaxRow || b1 - a1 > kUnionMaxRow
                          ? b1 - a0
                          : PairUnionLength(s.indices.subspan(a0, a1 - a0),
                                            s.indices.subspan(a1, b1 - a1), s.cache.num_slots());
    tiles += (n + kKeyTile - 1) / kKeyTile;
  }
  return tiles;
}

}  // namespace

absl::StatusOr<AttendLaunch> PlanAttend(const AttendParams& params, const DeviceInfo& device) {
  const int32_t T = params.num_rows;
  const int32_t H = params.num_heads;
  AttendLaunch l;
  l.qk_width = QkWidth(params.geometry);

  PlanInput in;
  in.num_rows = T;
  in.num_heads = H;
  in.format = params.main.cache.format;
  in.max_main_keys = MaxSegmentLength(params.main.indptr);
  in.max_extra_keys = params.has_extra ? MaxSegmentLength(params.extra.indptr) : 0;
  in.compute_units = device.compute_units;
  // fp8_dsv4 / fp8_per_tensor segments run on the direct kernel in 16-head programs (two per
  // SM) or 32-head programs (one per SM), head block and splits by its cost model (PlanDirect)
  // unless forced. Where the plan asks for 64 heads, fp8_dsv4 keeps the tile kernel's 64-head
  // programs and fp8_per_tensor takes the direct kernel (H200, 2026-12-01, TP1 decode C=64/128
  // and prefill: the direct kernel 1.07x the tile kernel's time on fp8_dsv4, 0.92-1.00x on
  // fp8_per_tensor). force_tile_kernel keeps the tile kernel everywhere (for A/B measurements).
  const bool tile_only = params.force_tile_kernel;
  l.plan = OverridePlan(MakePlan(in), T, H, params.force_head_block, params.force_splits);
  auto per_tensor = [](KvFormat f) { return f == KvFormat::kFp8PerTensor; };
  const bool direct_for_64 = per_tensor(params.main.cache.format) &&
                             (!params.has_extra || per_tensor(params.extra.cache.format));
  const bool direct_formats =
      !tile_only && DirectFormat(params.main.cache.format) &&
      (!params.has_extra || DirectFormat(params.extra.cache.format)) &&
      (params.force_head_block == 16 || params.force_head_block == 32 ||
       (params.force_head_block == 0 && (l.plan.head_block <= 32 || direct_for_64)));
  if (direct_formats) {
    in.programs_per_unit = 2;
    l.plan = OverridePlan(MakePlan(in), T, H, params.force_head_block, params.force_splits);
  }

  const bool mixed = params.has_extra;
  bool use_tile = params.main.cache.format != KvFormat::kBf16;
  if (mixed) use_tile = use_tile || params.extra.cache.format != KvFormat::kBf16;
  auto stage_for = [&](int keys) {
    int32_t b = StageBytes(params.main.cache.format, l.qk_width, keys);
    if (mixed) b = std::max(b, StageBytes(params.extra.cache.format, l.qk_width, keys));
    return b;
  };
  // Gather stages that fit a head block in shared memory: as many as possible up to 3, else 0.
  auto stages_for = [&](int hb) {
    const int keys = AttendVariantKeys(l.qk_width, hb);
    if (keys == 0) return 0;
    for (int n : {3, 2, 1}) {
      if (AttendSharedBytes(l.qk_width, hb, stage_for(keys), n, use_tile, keys) <=
          device.shared_memory_per_block) {
        return n;
      }
    }
    return 0;
  };
  auto fits = [&](int hb) { return stages_for(hb) > 0; };
  if (!fits(l.plan.head_block)) {
    if (params.force_head_block > 0) {
      return absl::UnimplementedError(absl::StrCat(
          "no ", l.plan.head_block, "-head attention program for geometry ",
          Sv(GeometryName(params.geometry)), " with main format ",
          Sv(KvFormatName(params.main.cache.format)),
          params.has_extra
              ? absl::StrCat(" and extra format ", Sv(KvFormatName(params.extra.cache.format)))
              : std::string(),
          " (shared memory)"));
    }
    // The plan is advice: step down to the largest head block that exists and fits.
    while (l.plan.head_block > 16 && !fits(l.plan.head_block)) l.plan.head_block /= 2;
    l.plan.head_blocks = (H + l.plan.head_block - 1) / l.plan.head_block;
    l.plan.programs = int64_t{T} * l.plan.head_blocks * l.plan.splits;
  }
  int num_stages = stages_for(l.plan.head_block);
  const int keys = AttendVariantKeys(l.qk_width, l.plan.head_block);
  int32_t stage = stage_for(keys);
  l.shared_bytes =
      AttendSharedBytes(l.qk_width, l.plan.head_block, stage, num_stages, use_tile, keys);

  const int direct_hb = params.force_head_block > 0              ? params.force_head_block
                        : l.plan.head_block >= 32 && H % 32 == 0 ? 32
                                                                 : 16;
  int32_t dstage = DirectStageBytes(params.main.cache.format, l.qk_width);
  if (mixed) dstage = std::max(dstage, DirectStageBytes(params.extra.cache.format, l.qk_width));
  // Gather stages of a direct program of hb head slots when as many run per SM as its variant
  // is compiled for: as many as fit up to kDirectMaxStages, or 0 below two or without such a
  // variant. The per-SM shared memory is the per-block limit plus one 1 KB reservation; each
  // resident program reserves 1 KB.
  auto direct_stages = [&](int hb) {
    const int blocks = DirectVariantBlocks(l.qk_width, hb);
    if (blocks == 0) return 0;
    const int64_t cap = (device.shared_memory_per_block + 1024) / blocks - 1024;
    for (int k = kDirectMaxStages; k >= 2; --k) {
      if (DirectSharedBytes(l.qk_width, hb, dstage, k) <= cap) return k;
    }
    return 0;
  };
  // The direct cost model's input for `units` programs' worth of `heads` heads over `tiles`
  // tiles, offering the head blocks in `hbs` that have a variant with gather stages.
  auto direct_input = [&](int64_t units, int32_t heads, int32_t tiles,
                          std::initializer_list<int> hbs) {
    DirectPlanInput d = DirectPlanInputFor(device);  // its architecture picks the cost model
    d.units = units;
    d.heads = heads;
    d.tiles = tiles;
    d.format = params.main.cache.format;
    d.qk_width = l.qk_width;
    for (int hb : hbs) {
      (hb == 32 ? d.blocks32 : d.blocks16) =
          direct_stages(hb) > 0 ? DirectVariantBlocks(l.qk_width, hb) : 0;
    }
    return d;
  };
  if (direct_formats) {
    int hb = direct_hb;
    int splits = l.plan.splits;
    if (params.force_head_block == 0 && params.force_splits == 0) {
      const DirectPlan d = PlanDirect(direct_input(T, H, l.plan.tiles, {16, 32}));
      hb = d.head_block;
      splits = d.splits;
    }
    const int n = direct_stages(hb);
    if (n > 0) {
      l.direct = true;
      l.plan.head_block = hb;
      l.plan.head_blocks = (H + hb - 1) / hb;
      l.plan.splits = splits;
      l.plan.programs = int64_t{T} * l.plan.head_blocks * l.plan.splits;
      num_stages = n;
      stage = dstage;
      l.shared_bytes = DirectSharedBytes(l.qk_width, hb, dstage, n);
    }
  }

  // Paired rows (AttendParams::row_pairs): a request's consecutive rows share most keys, so rows
  // 2i and 2i+1 run as one direct program over the union of their keys (built on the device by
  // the row-union kernel), gathering and converting each shared key once. Only where the caller
  // says rows come in even groups of one sequence (AttendParams::rows_per_group) and no head
  // block is forced.
  // - H = 8 (half pairs, RowPairs::kAuto): the two rows' 8 heads fill one 16-head program,
  //   which unpaired masks half of its heads. By default only with at least a quarter as many
  //   pairs as SMs: the row-union kernel's 6-20 us would not pay for fewer (on the H200, TP8
  //   on the fp8 pools: 0.74-1.01x the time from decode C=16 up and 0.69-0.71x for prefill 8K,
  //   1.3-1.5x at decode C=1; docs/results/kbench-h200.md).
  // - H a multiple of 16 (RowPairs::kAlways only, decode calls): the two 16-head groups of a
  //   32-head program.
  //   On the H200 (TP4/TP2 C=32/64 bar cells) 1.2-1.7x slower: the 32-head program, one per SM,
  //   issues only ~14 % fewer instructions than two 16-head programs (two per SM) do for the
  //   same rows, at a fifth lower issue rate, and the DRAM bytes were already the unique ones
  //   (docs/results/kbench-h200.md).
  const bool half_pairs = H <= 8;
  const int pair_hb = half_pairs ? 16 : 32;  // the program's head slots
  int union_bits = 6;                        // the row-union table (paired launches)
  const bool want_pairs =
      params.row_pairs == RowPairs::kAlways || (params.row_pairs == RowPairs::kAuto && half_pairs &&
                                                int64_t{T} / 2 * 4 >= device.compute_units);
  if (l.direct && RowPairsSupported() && want_pairs && params.rows_per_group >= 2 &&
      params.rows_per_group % 2 == 0 && T % 2 == 0 && (half_pairs || T < kPrefillRows) &&
      (half_pairs || H % 16 == 0) && params.force_head_block == 0) {
    const int n = direct_stages(pair_hb);
    // The row-union table: kUnionSlotsPerKey entries per key of the longest first row where
    // shared memory allows (rows past kUnionMaxRow are concatenated, not hashed).
    const int64_t longest =
        std::min<int64_t>(kUnionMaxRow, std::max(in.max_main_keys, in.max_extra_keys));
    while (union_bits < kMaxUnionBits && (int64_t{1} << union_bits) < kUnionSlotsPerKey * longest &&
           RowUnionSharedBytes(union_bits + 1) <= device.shared_memory_per_block - 1024) {
      ++union_bits;
    }
    if (n > 0 && (int64_t{1} << union_bits) >= 2 * longest) {
      // The kernel splits each pair's own union tiles; the split count is planned for those of
      // the longest pair.
      const int64_t est = std::max<int64_t>(1, LongestPairUnionTiles(params));
      const int64_t pairs = T / 2;
      const int32_t hbs = half_pairs ? 1 : H / 16;
      // Splits by the direct cost model (plan.h), a pair counting as a unit of pair_hb heads
      // (a 32-head program per pair and head block of 16 for kGroups).
      int splits = std::clamp(params.force_splits, 1, kMaxSplits);
      if (params.force_splits == 0) {
        splits =
            PlanDirect(direct_input(pairs * hbs, pair_hb, static_cast<int32_t>(est), {pair_hb}))
                .splits;
      }
      l.paired = half_pairs ? PairMode::kHalves : PairMode::kGroups;
      l.plan.head_block = 16;
      l.plan.head_blocks = static_cast<int32_t>(hbs);
      l.plan.splits = splits;
      l.plan.tiles = static_cast<int32_t>(est);
      l.plan.programs = pairs * hbs * splits;
      num_stages = n;
      stage = dstage;
      l.shared_bytes = DirectSharedBytes(l.qk_width, pair_hb, dstage, n);
    }
  }
  l.program_head_block = l.paired == PairMode::kGroups ? 32 : l.plan.head_block;

  // Workspace layout.
  int64_t off = 0;
  auto add = [&](int64_t bytes) {
    const int64_t at = off;
    off = AlignUp(off + bytes, 16);
    return at;
  };
  l.off_indptr[0] = add(4 * (int64_t{T} + 1));
  l.off_indices[0] = add(4 * static_cast<int64_t>(params.main.indices.size()));
  if (params.has_extra) {
    l.off_indptr[1] = add(4 * (int64_t{T} + 1));
    l.off_indices[1] = add(4 * static_cast<int64_t>(params.extra.indices.size()));
  }
  if (!params.epilogue.positions.empty()) l.off_positions = add(4 * int64_t{T});
  if (!params.sink.empty()) l.off_sink = add(4 * int64_t{H});
  l.staged_bytes = off;
  if (l.paired != PairMode::kNone) {
    const int nseg = params.has_extra ? 2 : 1;
    for (int sg = 0; sg < nseg; ++sg) {
      const int64_t nnz =
          static_cast<int64_t>((sg == 0 ? params.main.indices : params.extra.indices).size());
      l.off_union_indices[sg] = add(4 * nnz);
      l.off_union_mask[sg] = add(nnz);
      l.off_union_count[sg] = add(4 * (int64_t{T} / 2));
    }
  }
  const int64_t part_rows = l.plan.splits > 1 ? int64_t{T} * H * l.plan.splits : 0;
  l.off_part_acc = AlignUp(off, 256);
  l.off_part_ml = l.off_part_acc + part_rows * kValueWidth * 4;
  l.workspace_bytes = l.off_part_ml + part_rows * 2 * 4;

  AttendKernelParams& k = l.kernel;
  const float qs = params.q_type == QType::kFp8 ? params.q_scale : 1.0f;
  k.q = params.q;
  k.q_fp8 = params.q_type == QType::kFp8 ? 1 : 0;
  k.num_rows = T;
  k.num_heads = H;
  k.num_segments = params.has_extra ? 2 : 1;
  k.seg[0] = SegmentFor(params.main, params.softmax_scale, qs);
  if (params.has_extra) k.seg[1] = SegmentFor(params.extra, params.softmax_scale, qs);
  k.head_blocks = l.plan.head_blocks;
  k.splits = l.plan.splits;
  k.tiles_per_split = std::max(1, (l.plan.tiles + l.plan.splits - 1) / l.plan.splits);
  k.stage_bytes = stage;
  k.num_stages = num_stages;
  k.use_tile = use_tile ? 1 : 0;
  // no_scale_fold turns the folded fp8_dsv4 conversion off (for A/B measurements).
  k.fold_scales = params.no_scale_fold ? 0 : 1;
  k.paired = static_cast<int32_t>(l.paired);
  k.union_bits = union_bits;
  k.cos_sin = params.epilogue.cos_sin;
  k.out_mxfp8 = params.out.format == OutputFormat::kMxfp8 ? 1 : 0;
  k.out_bf16 = static_cast<uint16_t*>(params.out.bf16);
  k.mx_data = params.out.mx_data;
  k.mx_scales = params.out.mx_scales;
  k.lse = params.out.lse;

  CombineKernelParams& c = l.combine;
  c.num_rows = T;
  c.num_heads = H;
  c.splits = l.plan.splits;
  c.cos_sin = k.cos_sin;
  c.out_mxfp8 = k.out_mxfp8;
  c.out_bf16 = k.out_bf16;
  c.mx_data = k.mx_data;
  c.mx_scales = k.mx_scales;
  c.lse = k.lse;
  return l;
}

namespace {

// The call's small host arrays (CSR, positions, sink) with their workspace offsets; empty ones
// are skipped.
void ForEachHostArray(const AttendParams& params, const AttendLaunch& l,
                      absl::FunctionRef<void(int64_t off, const void* src, size_t bytes)> fn) {
  auto put = [&](int64_t off, const void* src, size_t bytes) {
    if (bytes > 0) fn(off, src, bytes);
  };
  put(l.off_indptr[0], params.main.indptr.data(), params.main.indptr.size_bytes());
  put(l.off_indices[0], params.main.indices.data(), params.main.indices.size_bytes());
  if (params.has_extra) {
    put(l.off_indptr[1], params.extra.indptr.data(), params.extra.indptr.size_bytes());
    put(l.off_indices[1], params.extra.indices.data(), params.extra.indices.size_bytes());
  }
  if (l.off_positions >= 0) {
    put(l.off_positions, params.epilogue.positions.data(), params.epilogue.positions.size_bytes());
  }
  if (l.off_sink >= 0) put(l.off_sink, params.sink.data(), params.sink.size_bytes());
}

}  // namespace

void StageAttend(const AttendParams& params, const AttendLaunch& l, uint8_t* host) {
  ForEachHostArray(params, l, [host](int64_t off, const void* src, size_t bytes) {
    std::memcpy(host + off, src, bytes);
  });
}

void AttendUploads(const AttendParams& params, const AttendLaunch& l, uint8_t* ws,
                   std::vector<CopyOp>& copies) {
  ForEachHostArray(params, l, [ws, &copies](int64_t off, const void* src, size_t bytes) {
    copies.push_back(CopyOp{ws + off, src, bytes});
  });
}

void BindAttend(AttendLaunch& l, uint8_t* ws) {
  AttendKernelParams& k = l.kernel;
  for (int s = 0; s < k.num_segments; ++s) {
    k.seg[s].indptr = reinterpret_cast<const int32_t*>(ws + l.off_indptr[s]);
    k.seg[s].indices = reinterpret_cast<const int32_t*>(ws + l.off_indices[s]);
    if (l.paired != PairMode::kNone) {
      k.seg[s].union_indices = reinterpret_cast<int32_t*>(ws + l.off_union_indices[s]);
      k.seg[s].union_mask = ws + l.off_union_mask[s];
      k.seg[s].union_count = reinterpret_cast<int32_t*>(ws + l.off_union_count[s]);
    }
  }
  k.positions =
      l.off_positions >= 0 ? reinterpret_cast<const int32_t*>(ws + l.off_positions) : nullptr;
  k.sink = l.off_sink >= 0 ? reinterpret_cast<const float*>(ws + l.off_sink) : nullptr;
  k.part_acc = reinterpret_cast<float*>(ws + l.off_part_acc);
  k.part_ml = reinterpret_cast<float*>(ws + l.off_part_ml);
  l.combine.part_acc = k.part_acc;
  l.combine.part_ml = k.part_ml;
  l.combine.positions = k.positions;
  l.combine.sink = k.sink;
}

absl::Status RunAttend(const AttendLaunch& l, StreamHandle stream) {
  if (l.kernel.num_rows == 0) return absl::OkStatus();
  if (l.paired != PairMode::kNone) {
    if (absl::Status st = LaunchRowUnion(l.kernel, stream); !st.ok()) return st;
  }
  if (absl::Status st =
          l.direct ? LaunchAttendDirect(l.kernel, l.qk_width, l.program_head_block, l.shared_bytes,
                                        stream)
                   : LaunchAttend(l.kernel, l.qk_width, l.plan.head_block, l.shared_bytes, stream);
      !st.ok()) {
    return st;
  }
  if (l.plan.splits == 1) return absl::OkStatus();
  return LaunchCombine(l.combine, stream);
}

}  // namespace smla::kernels::gpu
