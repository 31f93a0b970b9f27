#include "cpu/attend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/attend_tile.h"
#include "cpu/key_decode.h"
#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/e4m3.h"
#include "smla/kernels/epilogue.h"
#include "smla/kernels/plan.h"

namespace smla::kernels::cpu {
namespace {

struct KeyRef {
  const uint8_t* data;
  const uint8_t* scales;
  uint8_t segment;  // 0 main, 1 extra
};

// Per-thread buffers, grown on demand and kept between calls.
struct Scratch {
  std::vector<KeyRef> keys;
  std::vector<float> q;     // [head_block, width]
  std::vector<float> tile;  // [kKeyTile, width]
  std::vector<float> score_scale, sigma;
  std::vector<float> m, l;  // [head_block]
  std::vector<float> acc;   // [head_block, 512]
  std::vector<float> out;   // [512]
  std::vector<SoftmaxPartial> parts;
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// Saved state of one split of one (row, head) when a row is split.
struct PartialRecord {
  float m;
  float l;
  float acc[kValueWidth];
};

struct Call {
  const AttendParams* p = nullptr;
  SegmentLayout seg[2];
  int num_segments = 1;
  int width = 0;
  float score_c = 0.0f;  // softmax_scale * q_scale * log2(e)
  int32_t head_block = 16;
  int32_t head_blocks = 1;
  std::vector<int32_t> splits;         // [T]
  std::vector<int64_t> record_offset;  // [T] first PartialRecord of a split row, else -1
  std::vector<PartialRecord> records;
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

void CollectKeys(const Call& c, int32_t t, std::vector<KeyRef>& keys) {
  keys.clear();
  const Segment* segs[2] = {&c.p->main, &c.p->extra};
  for (int s = 0; s < c.num_segments; ++s) {
    const SegmentLayout& layout = c.seg[s];
    const Segment& seg = *segs[s];
    for (int32_t j = seg.indptr[t]; j < seg.indptr[t + 1]; ++j) {
      const int32_t id = seg.indices[j];
      // Sentinels, and (defensively) ids past the pool, are never read.
      if (id < 0 || id >= layout.num_slots) continue;
      keys.push_back({layout.Data(id), layout.Scales(id), static_cast<uint8_t>(s)});
    }
  }
}

void StageQ(const Call& c, int32_t t, int32_t h0, int32_t heads, float* q) {
  const AttendParams& p = *c.p;
  const int64_t first = (int64_t{t} * p.num_heads + h0) * c.width;
  const int64_t count = int64_t{heads} * c.width;
  if (p.q_type == QType::kBf16) {
    const uint16_t* src = static_cast<const uint16_t*>(p.q) + first;
    for (int64_t i = 0; i < count; ++i) q[i] = Bf16BitsToF32(src[i]);
  } else {
    const uint8_t* src = static_cast<const uint8_t*>(p.q) + first;
    for (int64_t i = 0; i < count; ++i) q[i] = DecodeE4m3(src[i]);
  }
}

// Combine, epilogue and store of one (row, head).
void Finish(const Call& c, int32_t t, int32_t h, const SoftmaxPartial* parts, int num_parts,
            float* x) {
  const AttendParams& p = *c.p;
  const bool has_sink = !p.sink.empty();
  float lse;
  CombinePartials(parts, num_parts, has_sink, has_sink ? p.sink[h] : 0.0f, x, &lse);
  const float* cos_sin = nullptr;
  if (!p.epilogue.positions.empty()) {
    cos_sin = p.epilogue.cos_sin + int64_t{p.epilogue.positions[t]} * 64;
  }
  EpilogueRoundAndRotate(x, cos_sin);
  const int64_t th = int64_t{t} * p.num_heads + h;
  if (p.out.format == OutputFormat::kBf16) {
    StoreBf16(x, static_cast<uint16_t*>(p.out.bf16) + th * kValueWidth);
  } else {
    StoreMxfp8(x, p.out.mx_data + th * kValueWidth, p.out.mx_scales + th * kMxGroupsPerHead);
  }
  if (p.out.lse != nullptr) p.out.lse[th] = lse;
}

void RunItem(Call& c, int32_t t, int32_t hb, int32_t split) {
  const AttendParams& p = *c.p;
  Scratch& sc = ThreadScratch();
  const int32_t h0 = hb * c.head_block;
  const int32_t heads = std::min(c.head_block, p.num_heads - h0);
  const int w = c.width;
  sc.q.resize(size_t{static_cast<size_t>(heads)} * w);
  sc.tile.resize(size_t{kKeyTile} * w);
  sc.score_scale.resize(kKeyTile);
  sc.sigma.resize(kKeyTile);
  sc.m.assign(heads, -INFINITY);
  sc.l.assign(heads, 0.0f);
  sc.acc.assign(size_t{static_cast<size_t>(heads)} * kValueWidth, 0.0f);
  sc.out.resize(kValueWidth);

  CollectKeys(c, t, sc.keys);
  const int64_t n = static_cast<int64_t>(sc.keys.size());
  const int32_t splits = c.splits[t];
  const int64_t begin = n * split / splits;
  const int64_t end = n * (split + 1) / splits;
  if (end > begin) StageQ(c, t, h0, heads, sc.q.data());

  for (int64_t b = begin; b < end; b += kKeyTile) {
    const int cnt = static_cast<int>(std::min<int64_t>(kKeyTile, end - b));
    for (int j = 0; j < cnt; ++j) {
      const KeyRef& k = sc.keys[b + j];
      const SegmentLayout& layout = c.seg[k.segment];
      StageRow(layout.format, layout.geometry, k.data, k.scales, sc.tile.data() + j * w);
      sc.sigma[j] = layout.sigma;
      sc.score_scale[j] = layout.sigma * c.score_c;
    }
    TileArgs args;
    args.q = sc.q.data();
    args.heads = heads;
    args.width = w;
    args.keys = sc.tile.data();
    args.score_scale = sc.score_scale.data();
    args.sigma = sc.sigma.data();
    args.n = cnt;
    args.m = sc.m.data();
    args.l = sc.l.data();
    args.acc = sc.acc.data();
    AccumulateTile(args);
  }

  if (splits == 1) {
    for (int32_t i = 0; i < heads; ++i) {
      const SoftmaxPartial part{sc.m[i], sc.l[i],
                                sc.acc.data() + size_t{static_cast<size_t>(i)} * kValueWidth};
      Finish(c, t, h0 + i, &part, 1, sc.out.data());
    }
    return;
  }
  PartialRecord* records =
      c.records.data() + c.record_offset[t] + int64_t{split} * p.num_heads + h0;
  for (int32_t i = 0; i < heads; ++i) {
    records[i].m = sc.m[i];
    records[i].l = sc.l[i];
    memcpy(records[i].acc, sc.acc.data() + size_t{static_cast<size_t>(i)} * kValueWidth,
           sizeof(records[i].acc));
  }
}

void CombineItem(const Call& c, int32_t t, int32_t hb) {
  const AttendParams& p = *c.p;
  Scratch& sc = ThreadScratch();
  sc.out.resize(kValueWidth);
  const int32_t splits = c.splits[t];
  sc.parts.resize(splits);
  const int32_t h0 = hb * c.head_block;
  const int32_t heads = std::min(c.head_block, p.num_heads - h0);
  for (int32_t h = h0; h < h0 + heads; ++h) {
    for (int32_t s = 0; s < splits; ++s) {
      const PartialRecord& r = c.records[c.record_offset[t] + int64_t{s} * p.num_heads + h];
      sc.parts[s] = SoftmaxPartial{r.m, r.l, r.acc};
    }
    Finish(c, t, h, sc.parts.data(), splits, sc.out.data());
  }
}

}  // namespace

int32_t RowSplits(int32_t planned_splits, bool forced, int64_t main_len, int64_t extra_len) {
  if (!forced) return 1;
  const int64_t tiles = CeilDiv(main_len, kKeyTile) + CeilDiv(extra_len, kKeyTile);
  return static_cast<int32_t>(std::clamp<int64_t>(planned_splits, 1, std::max<int64_t>(tiles, 1)));
}

void RunAttend(const AttendParams& p, ThreadPool& pool, int64_t max_records) {
  const int32_t T = p.num_rows;
  if (T == 0) return;
  Call c;
  c.p = &p;
  c.seg[0] = SegmentLayout::Of(p.main.cache);
  if (p.has_extra) {
    c.seg[1] = SegmentLayout::Of(p.extra.cache);
    c.num_segments = 2;
  }
  c.width = QkWidth(p.geometry);
  c.score_c = p.softmax_scale * p.q_scale * kLog2e;

  PlanInput in;
  in.num_rows = T;
  in.num_heads = p.num_heads;
  in.format = p.main.cache.format;
  in.max_main_keys = MaxSegmentLength(p.main.indptr);
  in.max_extra_keys = p.has_extra ? MaxSegmentLength(p.extra.indptr) : 0;
  in.compute_units = pool.size();
  const LaunchPlan plan =
      OverridePlan(MakePlan(in), T, p.num_heads, p.force_head_block, p.force_splits);
  c.head_block = plan.head_block;
  c.head_blocks = plan.head_blocks;

  c.splits.resize(T);
  for (int32_t t = 0; t < T; ++t) {
    const int64_t main_len = p.main.indptr[t + 1] - p.main.indptr[t];
    const int64_t extra_len = p.has_extra ? p.extra.indptr[t + 1] - p.extra.indptr[t] : 0;
    c.splits[t] = RowSplits(plan.splits, p.force_splits > 0, main_len, extra_len);
  }
  c.record_offset.assign(T, -1);

  // Rows run in chunks whose split partials fit max_records (a chunk holds at least one row);
  // without splits the whole call is one chunk.
  std::vector<int32_t> split_rows;
  std::vector<int64_t> row_first;
  for (int32_t first = 0; first < T;) {
    int64_t records = 0;
    int32_t last = first;
    split_rows.clear();
    for (; last < T; ++last) {
      const int64_t need = c.splits[last] > 1 ? int64_t{c.splits[last]} * p.num_heads : 0;
      if (last > first && records + need > max_records) break;
      if (need > 0) {
        c.record_offset[last] = records;
        records += need;
        split_rows.push_back(last);
      }
    }
    c.records.resize(records);

    // Item i -> (row, split, head block), head block fastest so a row's items run together.
    row_first.assign(1, 0);
    for (int32_t t = first; t < last; ++t) {
      row_first.push_back(row_first.back() + int64_t{c.head_blocks} * c.splits[t]);
    }
    pool.ParallelFor(row_first.back(), [&](int64_t i, int) {
      const int32_t k = static_cast<int32_t>(
          std::upper_bound(row_first.begin(), row_first.end(), i) - row_first.begin() - 1);
      const int64_t r = i - row_first[k];
      RunItem(c, first + k, static_cast<int32_t>(r % c.head_blocks),
              static_cast<int32_t>(r / c.head_blocks));
    });
    pool.ParallelFor(static_cast<int64_t>(split_rows.size()) * c.head_blocks, [&](int64_t i, int) {
      CombineItem(c, split_rows[i / c.head_blocks], static_cast<int32_t>(i % c.head_blocks));
    });
    first = last;
  }
}

}  // namespace smla::kernels::cpu
