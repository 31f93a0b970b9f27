// The bulk segment builder (segment_builder.h) against the per-id path it replaced
// (PreparedStep::MainSlot / CompressedSlot for every key of every row), on real prepared page
// tables: windows near position 0 and windows that slid past dropped pages, -1 sentinels,
// several spans and requests, compressed entries, dense and chosen-position layers.
#include "smla/server/segment_builder.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "smla/kernels/cpu_backend.h"
#include "smla/server/host_ranges.h"

namespace smla::server {
namespace {

struct Built {
  std::vector<int64_t> slots;
  std::vector<int32_t> main_indptr, main_idx, extra_indptr, extra_idx, positions;
  std::vector<size_t> rejected;  // spans the bulk build refused (BuildSegments)
  SegmentCounts counts;          // the bulk build's
};

// The per-id construction, one MainSlot / CompressedSlot call per key (slots: KV rows of every
// span, then compressed entries of every span).
Built PerId(const SegmentShape& shape, std::span<const SpanRef> spans) {
  const LayerSpec& spec = shape.spec;
  const int32_t W = shape.window;
  Built b;
  b.main_indptr.push_back(0);
  if (spec.has_compressed()) b.extra_indptr.push_back(0);
  std::vector<int64_t> compressed;
  for (const SpanRef& ref : spans) {
    const SpanInput& s = *ref.input;
    const PreparedStep& p = *ref.prepared;
    const size_t si = ref.index;
    for (int32_t t = 0; t < s.num_rows; ++t)
      b.slots.push_back(p.MainSlot(si, s.first_position + t));
    if (spec.has_compressed()) {
      const int64_t e0 = s.first_position / spec.ratio;
      const int64_t n = static_cast<int64_t>(s.compressed_rows.size() / shape.row_bytes);
      for (int64_t e = e0; e < e0 + n; ++e) compressed.push_back(p.CompressedSlot(si, e));
    }
    for (int32_t t = 0; t < s.num_rows; ++t) {
      const int64_t pos = s.first_position + t;
      if (spec.has_window()) {
        for (int64_t k = std::max<int64_t>(0, pos - (W - 1)); k <= pos; ++k) {
          b.main_idx.push_back(static_cast<int32_t>(p.MainSlot(si, k)));
        }
      } else {
        for (int32_t k = 0; k < s.topk_width; ++k) {
          const int32_t e = s.topk[int64_t{t} * s.topk_width + k];
          b.main_idx.push_back(e < 0 ? -1 : static_cast<int32_t>(p.MainSlot(si, e)));
        }
      }
      b.main_indptr.push_back(static_cast<int32_t>(b.main_idx.size()));
      if (spec.kind == LayerKind::kSwaTopK) {
        for (int32_t k = 0; k < s.topk_width; ++k) {
          const int32_t e = s.topk[int64_t{t} * s.topk_width + k];
          b.extra_idx.push_back(e < 0 ? -1 : static_cast<int32_t>(p.CompressedSlot(si, e)));
        }
      } else if (spec.kind == LayerKind::kSwaDense) {
        for (int64_t e = 0; e < (pos + 1) / spec.ratio; ++e) {
          b.extra_idx.push_back(static_cast<int32_t>(p.CompressedSlot(si, e)));
        }
      }
      if (spec.has_compressed()) b.extra_indptr.push_back(static_cast<int32_t>(b.extra_idx.size()));
      b.positions.push_back(static_cast<int32_t>(pos));
    }
  }
  b.slots.insert(b.slots.end(), compressed.begin(), compressed.end());
  return b;
}

// The bulk build, its chosen entries translated and its windows written by `backend` (the
// executor's path; on the CPU backend its memory is host memory). Spans' groups are their indices.
Built Bulk(kernels::Backend& backend, const SegmentShape& shape, std::span<const SpanRef> spans) {
  const SegmentCounts c = CountSegments(shape, spans);
  Built b;
  b.slots.resize(c.slots());
  b.main_indptr.resize(c.rows + 1);
  b.main_idx.resize(c.main_indices);
  b.extra_indptr.resize(shape.spec.has_compressed() ? c.rows + 1 : 0);
  b.extra_idx.resize(c.extra_indices);
  b.positions.resize(c.rows);
  b.counts = c;
  std::vector<int32_t> groups(c.slots()), stale(c.stale_blocks * kTableBlock), ids;
  std::vector<const int32_t*> blocks(c.table_blocks);
  std::vector<kernels::TableBlockWrite> writes(c.stale_blocks);
  std::vector<kernels::TranslateRow> rows(c.chosen_rows);
  std::vector<kernels::PositionRun> runs(c.runs);
  std::vector<int32_t> run_pages(c.run_pages);
  for (const SpanRef& r : spans) ids.insert(ids.end(), r.input->topk.begin(), r.input->topk.end());
  SegmentArrays a{b.slots, groups, b.main_indptr, b.extra_indptr, b.extra_idx, b.positions,
                  blocks,  stale,  writes,        rows,           runs,        run_pages};
  if (shape.spec.kind == LayerKind::kSwaTopK) a.extra_indices = {};  // written on the device
  BuildSegments(shape, spans, c,
                DeviceTargets{.ids = ids.data(),
                              .span_ids = {},
                              .main = b.main_idx.data(),
                              .extra = b.extra_idx.data(),
                              .table_blocks = blocks.data(),
                              .stale_blocks = stale.data(),
                              .run_pages = run_pages.data()},
                a);
  for (size_t k = 0, at = 0; k < spans.size(); ++k) {  // each span's KV rows, in span order
    for (int32_t i = 0; i < spans[k].input->num_rows; ++i) EXPECT_EQ(groups[at++], spans[k].group);
  }
  std::vector<uint32_t> flags(spans.size(), 0);
  kernels::CheckInputsParams cp;
  cp.entries.rows = rows.data();
  cp.entries.num_rows = static_cast<int32_t>(rows.size());
  cp.entries.page_shift =
      std::countr_zero(static_cast<uint32_t>(spans[0].prepared->rows_per_page()));
  cp.entries.block_shift = kTableBlockShift;
  cp.entries.num_block_writes = static_cast<int32_t>(writes.size());
  cp.entries.block_writes = writes.data();
  cp.entries.runs = runs.data();
  cp.entries.num_runs = static_cast<int32_t>(runs.size());
  cp.flags = flags.data();
  std::unique_ptr<kernels::Stream> stream = *backend.CreateStream();
  EXPECT_TRUE(backend.CheckInputs(cp, *stream).ok());
  for (size_t k = 0; k < flags.size(); ++k) {
    if (flags[k] != 0) b.rejected.push_back(k);
  }
  return b;
}

// One span's inputs, owned.
struct SpanOwned {
  std::string sequence;
  int64_t first = 0;
  int32_t rows = 0;
  std::vector<uint8_t> compressed;  // only its size matters here
  std::vector<int32_t> topk;
  int32_t width = 0;
  SpanInput View() const {
    SpanInput s;
    s.sequence_id = sequence;
    s.first_position = first;
    s.num_rows = rows;
    s.compressed_rows = compressed;
    s.topk = topk;
    s.topk_width = width;
    return s;
  }
};

class SegmentBuilderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<kernels::Backend>> b =
        kernels::CreateCpuBackend({.cpu_threads = 1});
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = *std::move(b);
  }

  void Open(const std::string& spec, int32_t max_sequences = 16) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(spec);
    ASSERT_TRUE(c.ok()) << c.status();
    absl::StatusOr<std::unique_ptr<KvStore>> s = KvStore::Create(*c, *backend_, max_sequences);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }

  // Stores `length` positions of a sequence on a layer (committed steps of up to 64 rows).
  void Grow(const std::string& seq, int32_t layer, int64_t length) {
    if (!store_->Length("t", seq, 0).ok()) {
      ASSERT_TRUE(store_->CreateSequence("t", seq).ok());
    }
    int64_t at = *store_->Length("t", seq, layer);
    while (at < length) {
      const int32_t n = static_cast<int32_t>(std::min<int64_t>(64, length - at));
      store_->BeginBatch();
      SpanWrite w{seq, at, n};
      absl::StatusOr<std::unique_ptr<PreparedStep>> p = store_->Prepare("t", layer, {&w, 1});
      ASSERT_TRUE(p.ok()) << p.status();
      store_->Commit(**p);
      store_->EndBatch();
      at += n;
    }
  }

  // A span of `rows` rows from `first` with admission-valid chosen entries (about a tenth -1).
  SpanOwned MakeSpan(int32_t layer, const std::string& seq, int64_t first, int32_t rows,
                     int32_t width) {
    const ModelProfile& profile = store_->profile();
    const LayerSpec& spec = profile.layers[layer];
    SpanOwned s{seq, first, rows, {}, {}, 0};
    if (spec.has_compressed()) {
      const int64_t n = (first + rows) / spec.ratio - first / spec.ratio;
      s.compressed.resize(n * RowBytes());
    }
    if (spec.client_chooses()) {
      s.width = width;
      for (int32_t t = 0; t < rows; ++t) {
        const int64_t p = first + t;
        const int64_t visible = spec.kind == LayerKind::kSwaTopK ? (p + 1) / spec.ratio : p + 1;
        std::uniform_int_distribution<int64_t> pick(0, std::max<int64_t>(0, visible - 1));
        for (int32_t k = 0; k < width; ++k) {
          s.topk.push_back(visible == 0 || rng_() % 10 == 0 ? -1
                                                            : static_cast<int32_t>(pick(rng_)));
        }
      }
    }
    return s;
  }

  size_t RowBytes() const { return size_t{2} * kernels::QkWidth(store_->profile().geometry); }

  SegmentShape Shape(int32_t layer) const {
    return SegmentShape{store_->profile().layers[layer], store_->profile().swa_window, RowBytes()};
  }

  // Prepares requests (each a list of spans), builds both ways and compares; aborts after.
  // Returns the bulk build's counts.
  SegmentCounts Compare(int32_t layer, const std::vector<std::vector<const SpanOwned*>>& requests) {
    std::vector<std::vector<SpanInput>> inputs(requests.size());
    std::vector<std::unique_ptr<PreparedStep>> prepared;
    std::vector<SpanRef> refs;
    store_->BeginBatch();
    for (size_t r = 0; r < requests.size(); ++r) {
      std::vector<SpanWrite> writes;
      for (const SpanOwned* s : requests[r]) {
        inputs[r].push_back(s->View());
        writes.push_back(SpanWrite{s->sequence, s->first, s->rows});
      }
      absl::StatusOr<std::unique_ptr<PreparedStep>> p = store_->Prepare("t", layer, writes);
      EXPECT_TRUE(p.ok()) << p.status();
      if (!p.ok()) {
        for (auto& q : prepared) store_->Abort(*q);
        store_->EndBatch();
        return {};
      }
      prepared.push_back(*std::move(p));
      for (size_t i = 0; i < inputs[r].size(); ++i) {
        refs.push_back(
            SpanRef{&inputs[r][i], prepared.back().get(), i, static_cast<int32_t>(refs.size())});
      }
    }
    const Built want = PerId(Shape(layer), refs);
    const Built got = Bulk(*backend_, Shape(layer), refs);
    EXPECT_EQ(got.slots, want.slots);
    EXPECT_EQ(got.main_indptr, want.main_indptr);
    EXPECT_EQ(got.main_idx, want.main_idx);
    EXPECT_EQ(got.extra_indptr, want.extra_indptr);
    EXPECT_EQ(got.extra_idx, want.extra_idx);
    EXPECT_EQ(got.positions, want.positions);
    EXPECT_TRUE(got.rejected.empty());
    for (auto& p : prepared) store_->Abort(*p);
    store_->EndBatch();
    return got.counts;
  }

  // Builds one batch of single-span requests; returns the spans the build refused.
  std::vector<size_t> Rejected(int32_t layer, const std::vector<const SpanOwned*>& spans) {
    std::vector<SpanInput> inputs;
    for (const SpanOwned* s : spans) inputs.push_back(s->View());
    std::vector<std::unique_ptr<PreparedStep>> prepared;
    std::vector<SpanRef> refs;
    store_->BeginBatch();
    for (size_t i = 0; i < spans.size(); ++i) {
      SpanWrite w{spans[i]->sequence, spans[i]->first, spans[i]->rows};
      absl::StatusOr<std::unique_ptr<PreparedStep>> p = store_->Prepare("t", layer, {&w, 1});
      EXPECT_TRUE(p.ok()) << p.status();
      if (!p.ok()) break;
      prepared.push_back(*std::move(p));
      refs.push_back(SpanRef{&inputs[i], prepared.back().get(), 0, static_cast<int32_t>(i)});
    }
    std::vector<size_t> rejected;
    if (refs.size() == spans.size()) rejected = Bulk(*backend_, Shape(layer), refs).rejected;
    for (auto& p : prepared) store_->Abort(*p);
    store_->EndBatch();
    return rejected;
  }

  std::mt19937 rng_{20261130};
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<KvStore> store_;
};

TEST_F(SegmentBuilderTest, WindowsNearPositionZeroAndAfterSliding) {
  // page_rows 8: a window of 128 spans 17 pages, and pages before it are dropped at commit.
  Open("dsv4.1-flash:tp=8:page_rows=8:pool_pages=2048");
  for (int32_t layer : {0, 2, 20}) {  // SWA only, top-k of 1/2, top-k of 1/1
    SCOPED_TRACE(layer);
    Grow("long", layer, 700);
    Grow("mid", layer, 130);
    ASSERT_GT(store_->Pages("t", "long", layer)->main_first_page, 0) << "the window slid";
    const SpanOwned zero = MakeSpan(layer, absl::StrCat("fresh", layer), 0, 6, 512);
    ASSERT_TRUE(store_->CreateSequence("t", zero.sequence).ok());
    const SpanOwned slid = MakeSpan(layer, "long", 700, 6, 512);
    const SpanOwned back = MakeSpan(layer, "mid", 125, 9, 37);  // rolls back 5 positions
    Compare(layer, {{&zero}, {&slid, &back}});
    Compare(layer, {{&slid}});
  }
}

// Page tables after an aborted step, a truncation, and a released sequence whose pages another
// sequence reuses: both builds follow the tables as they are now.
TEST_F(SegmentBuilderTest, AbortTruncateAndReusedPages) {
  Open("dsv4.1-flash:tp=8:page_rows=8:pool_pages=2048");
  const int32_t layer = 20;
  Grow("a", layer, 300);
  Grow("gone", layer, 400);
  {
    // A step that reserves pages and is aborted leaves the table as it was.
    store_->BeginBatch();
    SpanWrite w{"a", 300, 40};
    absl::StatusOr<std::unique_ptr<PreparedStep>> p = store_->Prepare("t", layer, {&w, 1});
    ASSERT_TRUE(p.ok()) << p.status();
    store_->Abort(**p);
    store_->EndBatch();
  }
  ASSERT_EQ(*store_->Length("t", "a", layer), 300);
  ASSERT_TRUE(store_->Truncate("t", "a", 295).ok());
  ASSERT_EQ(*store_->Length("t", "a", layer), 295);
  ASSERT_TRUE(store_->ReleaseSequence("t", "gone").ok());
  Grow("reuse", layer, 420);  // takes the released pages
  const SpanOwned a = MakeSpan(layer, "a", 295, 6, 512);
  const SpanOwned r = MakeSpan(layer, "reuse", 420, 6, 512);
  const SpanOwned r2 = MakeSpan(layer, "reuse", 415, 3, 100);  // rolls back over reused pages
  Compare(layer, {{&a, &r}});
  Compare(layer, {{&r2}, {&a}});
}

// The device's copy of each translated table (device_tables.h) follows every change of the
// host's: a launch uploads only the blocks the device does not hold current, and after a
// truncation, an aborted step and pages handed to other sequences, the translation reads each
// table as it is now (a stale block would translate entries into another sequence's pages).
TEST_F(SegmentBuilderTest, DeviceTablesFollowEveryChange) {
  // A long rollback allowance, so that a window layer may be truncated far back.
  Open("dsv4.1-flash:tp=8:page_rows=8:pool_pages=4096:swa_rollback=2048");
  const int32_t layer = 20;
  const LayerSpec& spec = store_->profile().layers[layer];
  ASSERT_EQ(spec.kind, LayerKind::kSwaTopK);
  auto blocks_to = [&](int64_t position) {  // blocks of the pages rows up to `position` reach
    const int64_t pages = (spec.visible(position) + 7) / 8;
    return (pages + kTableBlock - 1) / kTableBlock;
  };
  // Steps that take no new page (they restart 4 positions back), so that aborting them after
  // the build changes no table.
  Grow("a", layer, 3004);
  const SpanOwned d = MakeSpan(layer, "a", 3000, 4, 512);
  ASSERT_GT(blocks_to(3003), 2);
  EXPECT_EQ(Compare(layer, {{&d}}).stale_blocks, blocks_to(3003));  // the whole table at first
  EXPECT_EQ(Compare(layer, {{&d}}).stale_blocks, 0);                // then nothing
  EXPECT_EQ(Compare(layer, {{&d}}).table_blocks, blocks_to(3003));

  // Truncated, its pages taken by another sequence, grown back over other pages: the blocks
  // from the one holding the truncation point on go up again.
  ASSERT_TRUE(store_->Truncate("t", "a", 1000).ok());
  Grow("x", layer, 2000);
  Grow("a", layer, 3004);
  const int64_t kept = (spec.visible(999) + 7) / 8 / kTableBlock;  // the pages Truncate keeps
  EXPECT_EQ(Compare(layer, {{&d}}).stale_blocks, blocks_to(3003) - kept);
  EXPECT_EQ(Compare(layer, {{&d}}).stale_blocks, 0);

  // An aborted step whose new pages went up with its launch; another sequence takes them.
  const SpanOwned big = MakeSpan(layer, "a", 3004, 400, 64);
  EXPECT_GT(Compare(layer, {{&big}}).stale_blocks, 0);
  Grow("y", layer, 800);
  Grow("a", layer, 3400);
  const SpanOwned after = MakeSpan(layer, "a", 3396, 4, 512);
  EXPECT_GT(Compare(layer, {{&after}}).stale_blocks, 0);
  EXPECT_EQ(Compare(layer, {{&after}}).stale_blocks, 0);

  // A released sequence gives its blocks back; one created under the same id starts afresh.
  ASSERT_TRUE(store_->ReleaseSequence("t", "a").ok());
  Grow("a", layer, 500);
  const SpanOwned fresh = MakeSpan(layer, "a", 496, 4, 512);
  EXPECT_EQ(Compare(layer, {{&fresh}}).stale_blocks, blocks_to(499));
}

// The translation is where chosen entries are checked: an entry past what its row may see
// (though inside the prepared table), or a negative other than -1, flags its span and only it.
TEST_F(SegmentBuilderTest, RefusesSpansWithEntriesTheirRowsMayNotSee) {
  Open("dsv4.1-flash:tp=8:page_rows=8:pool_pages=2048");
  for (int32_t layer : {2, 20}) {  // top-k of 1/2, top-k of 1/1
    SCOPED_TRACE(layer);
    const int32_t ratio = store_->profile().layers[layer].ratio;
    Grow("a", layer, 300);
    Grow("b", layer, 200);
    Grow("c", layer, 100);
    const SpanOwned a = MakeSpan(layer, "a", 300, 6, 512);
    const SpanOwned c = MakeSpan(layer, "c", 100, 6, 512);
    // b rolls back 10 positions: its table still holds entries its rows may not see.
    SpanOwned b = MakeSpan(layer, "b", 190, 6, 64);
    EXPECT_TRUE(Rejected(layer, {&a, &b, &c}).empty());
    const int32_t visible_row2 = static_cast<int32_t>((190 + 2 + 1) / ratio);
    for (const int32_t bad : {visible_row2, -2, INT32_MIN, 199 / ratio}) {
      SCOPED_TRACE(bad);
      SpanOwned b_bad = b;
      b_bad.topk[2 * 64 + 9] = bad;
      EXPECT_EQ(Rejected(layer, {&a, &b_bad, &c}), (std::vector<size_t>{1}));
    }
    SpanOwned c_bad = c;
    c_bad.topk.back() = 1 << 20;
    SpanOwned a_bad = a;
    a_bad.topk[0] = -5;
    EXPECT_EQ(Rejected(layer, {&a_bad, &b, &c_bad}), (std::vector<size_t>{0, 2}));
  }
}

TEST_F(SegmentBuilderTest, PrefillSpanCrossingPages) {
  Open("dsv4.1-flash:tp=4:page_rows=16:pool_pages=1024");
  for (int32_t layer : {1, 3, 39}) {
    SCOPED_TRACE(layer);
    Grow("a", layer, 33);
    const SpanOwned a = MakeSpan(layer, "a", 33, 300, 64);
    ASSERT_TRUE(store_->CreateSequence("t", absl::StrCat("b", layer)).ok());
    const SpanOwned b = MakeSpan(layer, absl::StrCat("b", layer), 0, 1, 1);
    Compare(layer, {{&a, &b}});
  }
}

TEST_F(SegmentBuilderTest, DenseCompressedLayer) {
  Open("dsv4-flash:tp=8:page_rows=32:pool_pages=512:swa_rollback=64");
  const int32_t layer = 3;  // SWA + every entry of the 1/128 cache
  ASSERT_EQ(store_->profile().layers[layer].kind, LayerKind::kSwaDense);
  Grow("a", layer, 1000);
  const SpanOwned d = MakeSpan(layer, "a", 1000, 6, 0);
  const SpanOwned r = MakeSpan(layer, "a", 950, 140, 0);  // crosses entry boundaries
  // Before the first entry the dense table is empty (a null array under the sanitizers).
  ASSERT_TRUE(store_->CreateSequence("t", "fresh").ok());
  const SpanOwned f = MakeSpan(layer, "fresh", 0, 6, 0);
  Compare(layer, {{&d}});
  Compare(layer, {{&r}});
  Compare(layer, {{&f}, {&d}});
}

TEST_F(SegmentBuilderTest, ChosenPositions) {
  Open("glm-5.3-flash:tp=4:kv=bf16:page_rows=8:pool_pages=512");
  Grow("g", 0, 500);
  const SpanOwned d = MakeSpan(0, "g", 500, 6, 2048);
  const SpanOwned r = MakeSpan(0, "g", 300, 3, 17);
  Compare(0, {{&d}});
  Compare(0, {{&r}});
  Grow("h", 0, 400);
  SpanOwned h_bad = MakeSpan(0, "h", 300, 3, 17);
  EXPECT_TRUE(Rejected(0, {&d, &h_bad}).empty());
  h_bad.topk[17 + 4] = 302;  // row 1 sits at position 301
  EXPECT_EQ(Rejected(0, {&d, &h_bad}), (std::vector<size_t>{1}));
}

// The decode C=32 cell of the H200 benchmark (32 requests x 6 rows at 128K, layer 20): how long
// the bulk build and the per-id path take on this machine (printed; the pools are never
// written, so their memory is not touched).
TEST_F(SegmentBuilderTest, BuildTimeOfTheDecodeCell) {
  Open("dsv4.1-flash:tp=4:page_rows=64:pool_pages=70000", 32);
  const int32_t layer = 20;
  const int64_t context = 128 * 1024;
  std::vector<SpanOwned> spans;
  for (int i = 0; i < 32; ++i) {
    const std::string seq = absl::StrCat("s", i);
    ASSERT_TRUE(store_->CreateSequence("t", seq).ok());
    for (int64_t at = 0; at < context; at += 16384) {
      store_->BeginBatch();
      SpanWrite w{seq, at, 16384};
      absl::StatusOr<std::unique_ptr<PreparedStep>> p = store_->Prepare("t", layer, {&w, 1});
      ASSERT_TRUE(p.ok()) << p.status();
      store_->Commit(**p);
      store_->EndBatch();
    }
    spans.push_back(MakeSpan(layer, seq, context, 6, 512));
  }
  std::vector<SpanInput> inputs;
  for (const SpanOwned& s : spans) inputs.push_back(s.View());
  std::vector<std::unique_ptr<PreparedStep>> prepared;
  std::vector<SpanRef> refs;
  store_->BeginBatch();
  for (size_t i = 0; i < inputs.size(); ++i) {
    SpanWrite w{spans[i].sequence, spans[i].first, spans[i].rows};
    absl::StatusOr<std::unique_ptr<PreparedStep>> p = store_->Prepare("t", layer, {&w, 1});
    ASSERT_TRUE(p.ok()) << p.status();
    prepared.push_back(*std::move(p));
    refs.push_back(SpanRef{&inputs[i], prepared.back().get(), 0, static_cast<int32_t>(i)});
  }
  auto median_us = [](auto&& fn) {
    std::vector<double> t;
    for (int k = 0; k < 15; ++k) {
      const auto a = std::chrono::steady_clock::now();
      fn();
      t.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  Built bulk, per_id;
  const double bulk_us = median_us([&] { bulk = Bulk(*backend_, Shape(layer), refs); });
  const double per_id_us = median_us([&] { per_id = PerId(Shape(layer), refs); });
  EXPECT_EQ(bulk.extra_idx, per_id.extra_idx);
  std::printf(
      "decode C=32 segments (%zu main + %zu extra ids): bulk build with the CPU backend's "
      "translation %.1f us, per id %.1f us\n",
      bulk.main_idx.size(), bulk.extra_idx.size(), bulk_us, per_id_us);
  for (auto& p : prepared) store_->Abort(*p);
  store_->EndBatch();
}

// A memo answers lookups inside the range or the gap it holds and defers to the registrations
// for any other, which then replace it.
TEST(HostRangesTest, MemoAnswersOnlyInsideItsRange) {
  std::vector<uint8_t> buffer(400);
  uint8_t* const a = buffer.data() + 100;  // registered [100, 200) and [300, 400)
  uint8_t* const b = buffer.data() + 300;
  HostRanges r;
  r.Add(a, 100);
  r.Add(b, 100, HostRanges::Kind::kDevice);
  HostRanges::Memo memo;
  EXPECT_EQ(r.Find(a + 10, 20, memo), HostRanges::Kind::kHost);
  EXPECT_EQ(memo.kind, HostRanges::Kind::kHost);
  EXPECT_EQ(r.Find(a + 50, 50, memo), HostRanges::Kind::kHost);
  EXPECT_EQ(r.Find(a + 50, 51, memo), HostRanges::Kind::kNone);  // past its end
  EXPECT_EQ(r.Find(b, 100, memo), HostRanges::Kind::kDevice);
  EXPECT_EQ(memo.kind, HostRanges::Kind::kDevice);
  EXPECT_EQ(r.Find(a, 1, memo), HostRanges::Kind::kHost);
  // The gap between them: nothing registered, remembered as such, but not past its end.
  EXPECT_EQ(r.Find(buffer.data() + 200, 100, memo), HostRanges::Kind::kNone);
  EXPECT_EQ(r.Find(buffer.data() + 250, 50, memo), HostRanges::Kind::kNone);
  EXPECT_EQ(r.Find(b, 1, memo), HostRanges::Kind::kDevice);
  EXPECT_EQ(r.Find(buffer.data(), 100, memo), HostRanges::Kind::kNone);  // before the first
  // A memo is trusted while it is kept: the registrations are not read inside its range.
  EXPECT_EQ(r.Find(a, 1, memo), HostRanges::Kind::kHost);
  r.Remove(a);
  EXPECT_EQ(r.Find(a, 1, memo), HostRanges::Kind::kHost);
  EXPECT_EQ(r.Find(a, 1), HostRanges::Kind::kNone);
}

TEST(HostRangesTest, ContainsOnlyWholeRangesInsideOneRegistration) {
  std::vector<uint8_t> a(100), b(100);
  HostRanges r;
  EXPECT_FALSE(r.Contains(a.data(), 1));
  r.Add(a.data(), a.size());
  EXPECT_TRUE(r.Contains(a.data(), 100));
  EXPECT_TRUE(r.Contains(a.data() + 40, 60));
  EXPECT_FALSE(r.Contains(a.data() + 40, 61));
  EXPECT_FALSE(r.Contains(b.data(), 1));
  r.Add(b.data(), 50);
  EXPECT_TRUE(r.Contains(b.data() + 49, 1));
  EXPECT_FALSE(r.Contains(b.data() + 49, 2));
  r.Remove(a.data());
  EXPECT_FALSE(r.Contains(a.data(), 1));
  EXPECT_TRUE(r.Contains(b.data(), 50));
  // A range's kind: host memory unless it was added as a device one (a GPU region).
  EXPECT_EQ(r.Find(b.data(), 50), HostRanges::Kind::kHost);
  r.Add(a.data(), a.size(), HostRanges::Kind::kDevice);
  EXPECT_EQ(r.Find(a.data() + 10, 90), HostRanges::Kind::kDevice);
  EXPECT_EQ(r.Find(a.data() + 10, 91), HostRanges::Kind::kNone);
  EXPECT_EQ(r.Find(b.data(), 50), HostRanges::Kind::kHost);
}

}  // namespace
}  // namespace smla::server
