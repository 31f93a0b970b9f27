#include "smla/server/segment_builder.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "internal.h"

namespace smla::server {
namespace {

int64_t CompressedOf(const SpanInput& s, size_t row_bytes) {
  return static_cast<int64_t>(s.compressed_rows.size() / row_bytes);
}

// Slots of one span's main-cache positions [first, first + n), read page by page.
void MainSlots(const LayerPages& p, int32_t rows_per_page, int64_t first, int64_t n, int32_t* out) {
  const int64_t end = first + n;
  for (int64_t pos = first; pos < end;) {
    const int64_t page = pos / rows_per_page;
    const int64_t logical = page - p.main_first_page;
    SMLA_CHECK(logical >= 0 && logical < static_cast<int64_t>(p.main.size()),
               "main position outside the prepared page table");
    // One division a page, not one a position: this runs for every row's window.
    const int64_t page_first = page * rows_per_page;
    const int64_t stop = std::min(end, page_first + rows_per_page);
    const auto slot = static_cast<int32_t>(int64_t{p.main[logical]} * rows_per_page - page_first);
    for (; pos < stop; ++pos) *out++ = slot + static_cast<int32_t>(pos);
  }
}

// The pages that hold a span's windows: from the first position any of its rows sees to its
// last row's.
struct WindowPages {
  int64_t page = 0;  // the first of them
  int64_t count = 0;
};

WindowPages WindowPagesOf(const SpanInput& s, int32_t window, int32_t rows_per_page) {
  WindowPages w;
  w.page = std::max<int64_t>(0, s.first_position - (window - 1)) / rows_per_page;
  w.count = (s.first_position + s.num_rows - 1) / rows_per_page - w.page + 1;
  return w;
}

// Pages of its translated table the rows of a span may reach through chosen entries.
int64_t ChosenTablePages(const LayerSpec& spec, const SpanInput& s, int32_t rows_per_page) {
  if (!spec.client_chooses() || s.num_rows == 0) return 0;
  const int64_t visible = spec.visible(s.first_position + s.num_rows - 1);
  return (visible + rows_per_page - 1) / rows_per_page;
}

// Block b of a table (a deque or a vector of page ids) into `dst`, -1 past the table's end.
template <typename Table>
void CopyBlock(const Table& table, int64_t b, int32_t* dst) {
  const int64_t size = static_cast<int64_t>(table.size());
  const int64_t first = std::min(size, b * kTableBlock);
  const int64_t end = std::min(size, first + kTableBlock);
  auto it = std::copy(table.begin() + first, table.begin() + end, dst);
  std::fill(it, dst + kTableBlock, -1);
}

// Everything one span needs, computed once for all of its rows.
struct SpanTables {
  int64_t window_base = 0;     // window layers: the first position of the span's first window page
  int64_t window_pages = 0;    // and its offset in run_pages
  std::vector<int32_t> dense;  // dense layers: slots of every entry the span's rows see
  int64_t table_blocks = 0;    // chosen entries: blocks of the span's table in `table_blocks`
};

// Builds the rows of a run of spans, starting at the given offsets of the arrays.
class Builder {
 public:
  Builder(const SegmentShape& shape, const DeviceTargets& targets, const SegmentArrays& out)
      : shape_(shape), targets_(targets), out_(out) {}

  void Span(const SpanRef& ref) {
    const SpanInput& s = *ref.input;
    Tables(ref);
    for (int32_t t = 0; t < s.num_rows; ++t) Row(s, t, ref.group);
    ids_ += static_cast<int64_t>(s.topk.size());
    table_ += tables_.table_blocks;
    ++span_;
  }

  // Checks that the rows built fill the arrays exactly (CountSegments counted them).
  void Finish(const SegmentCounts& end) const {
    SMLA_CHECK(row_ == end.rows, "rows built");
    SMLA_CHECK(main_ == end.main_indices, "main indices built");
    SMLA_CHECK(extra_ == end.extra_indices, "extra indices built");
    SMLA_CHECK(chosen_ == end.chosen_rows && ids_ == end.chosen_ids, "chosen rows built");
    SMLA_CHECK(table_ == end.table_blocks && stale_ == end.stale_blocks, "table blocks listed");
    SMLA_CHECK(runs_ == end.runs && pages_ == end.run_pages, "window runs built");
  }

 private:
  void Tables(const SpanRef& ref) {
    const SpanInput& s = *ref.input;
    const LayerPages& pages = ref.prepared->pages(ref.index);
    const int32_t B = ref.prepared->rows_per_page();
    const LayerSpec& spec = shape_.spec;
    const int64_t last = s.first_position + s.num_rows - 1;
    if (spec.has_window()) {
      if (s.num_rows > 0) Window(s, pages, B);
    } else {
      SMLA_CHECK(pages.main_first_page == 0, "a full cache that slid");
    }
    if (spec.kind == LayerKind::kSwaDense) {
      tables_.dense.resize(spec.visible(last));
      for (int64_t e = 0; e < static_cast<int64_t>(tables_.dense.size()); ++e) {
        const int64_t logical = e / B;
        SMLA_CHECK(logical < static_cast<int64_t>(pages.compressed.size()),
                   "compressed entry outside the prepared page table");
        tables_.dense[e] = static_cast<int32_t>(int64_t{pages.compressed[logical]} * B + e % B);
      }
    }
    const int64_t n = ChosenTablePages(spec, s, B);
    tables_.table_blocks = TableBlocksOf(n);
    if (n > 0) ListBlocks(ref, n);
  }

  // The main-table pages of the span's windows, into run_pages.
  void Window(const SpanInput& s, const LayerPages& pages, int32_t B) {
    const WindowPages w = WindowPagesOf(s, shape_.window, B);
    const int64_t logical = w.page - pages.main_first_page;
    SMLA_CHECK(logical >= 0 && logical + w.count <= static_cast<int64_t>(pages.main.size()) &&
                   pages_ + w.count <= static_cast<int64_t>(out_.run_pages.size()),
               "window outside the prepared page table");
    std::copy_n(pages.main.begin() + logical, w.count, out_.run_pages.begin() + pages_);
    tables_.window_base = w.page * B;
    tables_.window_pages = pages_;
    pages_ += w.count;
  }

  // The blocks of the span's table its rows may reach (its first n pages), as the device reads
  // them: the heap's where the device copy is current, else a copy staged in the upload, which
  // the device also writes into the heap.
  void ListBlocks(const SpanRef& ref, int64_t n) {
    const bool main = shape_.spec.kind == LayerKind::kChosen;
    const LayerPages& pages = ref.prepared->pages(ref.index);
    SMLA_CHECK(n <= static_cast<int64_t>(main ? pages.main.size() : pages.compressed.size()),
               "visible entries outside the prepared page table");
    TableMirror& mirror = *ref.prepared->mirror(ref.index);
    const TableHeap& heap = ref.prepared->table_heap();
    const int64_t blocks = tables_.table_blocks;
    const BlockRange stale = TableHeap::Stale(mirror, n);
    SMLA_CHECK(blocks <= static_cast<int64_t>(mirror.blocks.size()) &&
                   table_ + blocks <= static_cast<int64_t>(out_.table_blocks.size()) &&
                   stale_ + stale.size() <= static_cast<int64_t>(out_.block_writes.size()),
               "table blocks counted");
    // Every block where the heap keeps it, then the stale ones where the upload has them.
    std::copy_n(mirror.where.begin(), blocks, out_.table_blocks.begin() + table_);
    for (int64_t b = stale.first; b < std::min(stale.end, blocks); ++b) {
      int32_t* const kept = heap.block(mirror.blocks[b]);
      int32_t* const staged = out_.stale_blocks.data() + stale_ * kTableBlock;
      if (main) {
        CopyBlock(pages.main, b, staged);
      } else {
        CopyBlock(pages.compressed, b, staged);
      }
      const int32_t* const uploaded = targets_.stale_blocks + stale_ * kTableBlock;
      out_.table_blocks[table_ + b] = uploaded;
      out_.block_writes[stale_] = kernels::TableBlockWrite{uploaded, kept};
      ++stale_;
    }
    mirror.synced = std::max(mirror.synced, n);
  }

  void Row(const SpanInput& s, int32_t t, int32_t group) {
    const LayerSpec& spec = shape_.spec;
    const int64_t pos = s.first_position + t;
    if (spec.has_window()) {
      const int64_t from = std::max<int64_t>(0, pos - (shape_.window - 1));
      SMLA_CHECK(runs_ < static_cast<int64_t>(out_.runs.size()), "window runs counted");
      out_.runs[runs_++] = kernels::PositionRun{
          targets_.run_pages + tables_.window_pages, targets_.main + main_,
          static_cast<int32_t>(from - tables_.window_base), static_cast<int32_t>(pos + 1 - from)};
      main_ += pos + 1 - from;
    } else {
      Chosen(s, t, group, targets_.main, main_);
    }
    out_.main_indptr[row_ + 1] = static_cast<int32_t>(main_);
    if (spec.kind == LayerKind::kSwaTopK) {
      Chosen(s, t, group, targets_.extra, extra_);
    } else if (spec.kind == LayerKind::kSwaDense) {
      Put(out_.extra_indices, extra_, tables_.dense.data(), spec.visible(pos));
    }
    if (!out_.extra_indptr.empty()) out_.extra_indptr[row_ + 1] = static_cast<int32_t>(extra_);
    if (!out_.positions.empty()) out_.positions[row_] = static_cast<int32_t>(pos);
    ++row_;
  }

  // Row t's chosen entries: one TranslateRow, whose slots land at `at` of `segment`.
  void Chosen(const SpanInput& s, int32_t t, int32_t group, int32_t* segment, int64_t& at) {
    SMLA_CHECK(chosen_ < static_cast<int64_t>(out_.chosen.size()), "chosen rows counted");
    kernels::TranslateRow& r = out_.chosen[chosen_++];
    r.ids = targets_.ids + ids_ + int64_t{t} * s.topk_width;
    r.seen = nullptr;
    if (span_ < targets_.span_ids.size() && targets_.span_ids[span_] != nullptr) {
      r.seen = targets_.ids + ids_ + int64_t{t} * s.topk_width;
      r.ids = targets_.span_ids[span_] + int64_t{t} * s.topk_width;
    }
    r.out = segment + at;
    r.blocks = targets_.table_blocks + table_;
    r.width = s.topk_width;
    r.limit = static_cast<int32_t>(shape_.spec.visible(s.first_position + t));
    r.group = group;
    at += s.topk_width;
  }

  static void Put(std::span<int32_t> dst, int64_t& at, const int32_t* src, int64_t n) {
    SMLA_CHECK(at + n <= static_cast<int64_t>(dst.size()), "segment larger than counted");
    if (n == 0) return;  // src may be null then (an empty table), which memcpy does not allow
    std::memcpy(dst.data() + at, src, static_cast<size_t>(n) * sizeof(int32_t));
    at += n;
  }

  const SegmentShape& shape_;
  const DeviceTargets& targets_;
  const SegmentArrays& out_;
  SpanTables tables_;
  int64_t row_ = 0, main_ = 0, extra_ = 0, chosen_ = 0, ids_ = 0, table_ = 0, stale_ = 0;
  int64_t runs_ = 0, pages_ = 0;
  size_t span_ = 0;
};

}  // namespace

SegmentCounts CountSegments(const SegmentShape& shape, std::span<const SpanRef> spans) {
  const LayerSpec& spec = shape.spec;
  SegmentCounts c;
  for (const SpanRef& ref : spans) {
    const SpanInput& s = *ref.input;
    c.rows += s.num_rows;
    if (spec.has_compressed()) c.compressed += CompressedOf(s, shape.row_bytes);
    if (spec.has_window() && s.num_rows > 0) {
      c.runs += s.num_rows;
      c.run_pages += WindowPagesOf(s, shape.window, ref.prepared->rows_per_page()).count;
    }
    if (spec.client_chooses()) {
      c.chosen_rows += s.num_rows;
      c.chosen_ids += static_cast<int64_t>(s.topk.size());
      const int64_t n = ChosenTablePages(spec, s, ref.prepared->rows_per_page());
      c.table_blocks += TableBlocksOf(n);
      if (n > 0) c.stale_blocks += TableHeap::Stale(*ref.prepared->mirror(ref.index), n).size();
    }
    for (int32_t t = 0; t < s.num_rows; ++t) {
      const int64_t pos = s.first_position + t;
      c.main_indices += spec.has_window() ? std::min<int64_t>(pos + 1, shape.window) : s.topk_width;
      if (spec.kind == LayerKind::kSwaTopK) c.extra_indices += s.topk_width;
      if (spec.kind == LayerKind::kSwaDense) c.extra_indices += spec.visible(pos);
    }
  }
  return c;
}

void BuildSegments(const SegmentShape& shape, std::span<const SpanRef> spans,
                   const SegmentCounts& counts, const DeviceTargets& targets,
                   const SegmentArrays& out) {
  // Slots: every span's KV rows in batch order, then every span's compressed entries.
  int64_t at = 0;
  auto put_slot = [&](int64_t slot, int32_t group) {
    SMLA_CHECK(at < static_cast<int64_t>(out.slots.size()), "slots counted");
    out.slots[at] = slot;
    out.slot_groups[at] = group;
    ++at;
  };
  std::vector<int32_t> tmp;
  for (const SpanRef& ref : spans) {
    const SpanInput& s = *ref.input;
    tmp.resize(s.num_rows);
    MainSlots(ref.prepared->pages(ref.index), ref.prepared->rows_per_page(), s.first_position,
              s.num_rows, tmp.data());
    for (int32_t v : tmp) put_slot(v, ref.group);
  }
  if (shape.spec.has_compressed()) {
    for (const SpanRef& ref : spans) {
      const SpanInput& s = *ref.input;
      const LayerPages& pages = ref.prepared->pages(ref.index);
      const int64_t B = ref.prepared->rows_per_page();
      const int64_t e0 = s.first_position / shape.spec.ratio;
      const int64_t n = CompressedOf(s, shape.row_bytes);
      for (int64_t e = e0; e < e0 + n; ++e) {
        SMLA_CHECK(e / B < static_cast<int64_t>(pages.compressed.size()),
                   "compressed entry outside the prepared page table");
        put_slot(int64_t{pages.compressed[e / B]} * B + e % B, ref.group);
      }
    }
  }
  SMLA_CHECK(at == static_cast<int64_t>(out.slots.size()), "slots counted");
  out.main_indptr[0] = 0;
  if (!out.extra_indptr.empty()) out.extra_indptr[0] = 0;
  Builder b(shape, targets, out);
  for (const SpanRef& ref : spans) b.Span(ref);
  b.Finish(counts);
}

}  // namespace smla::server
