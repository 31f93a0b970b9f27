#include "smla/server/segment_builder.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace smla::server {
namespace {

int Log2(int32_t v) {
  int l = 0;
  while ((int32_t{1} << l) < v) ++l;
  return l;
}

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
    const int64_t base = int64_t{p.main[logical]} * rows_per_page;
    const int64_t stop = std::min(end, (page + 1) * rows_per_page);
    for (; pos < stop; ++pos) *out++ = static_cast<int32_t>(base + pos % rows_per_page);
  }
}

// Everything one span needs, computed once for all of its rows.
struct SpanTables {
  std::vector<int32_t> window;  // slots of positions window_first .. last row
  int64_t window_first = 0;
  std::vector<int32_t> main_pages;  // chosen-position layers: the main table, contiguous
  std::vector<int32_t> dense;       // dense layers: slots of every entry the span's rows see
};

// Builds the rows of a run of spans, starting at the given offsets of the arrays.
class Builder {
 public:
  Builder(const SegmentShape& shape, const SegmentArrays& out) : shape_(shape), out_(out) {}

  void Span(const SpanRef& ref, size_t index) {
    const SpanInput& s = *ref.input;
    const LayerPages& pages = ref.prepared->pages(ref.index);
    const int32_t B = ref.prepared->rows_per_page();
    Tables(s, pages, B);
    span_bad_ = false;
    for (int32_t t = 0; t < s.num_rows; ++t) Row(s, pages, B, t);
    if (span_bad_) rejected_.push_back(index);
  }

  std::vector<size_t> TakeRejected() { return std::move(rejected_); }

  // Checks that the rows built fill the arrays exactly (CountSegments counted them).
  void Finish(const SegmentCounts& end) {
    SMLA_CHECK(row_ == end.rows, "rows built");
    SMLA_CHECK(main_ == end.main_indices, "main indices built");
    SMLA_CHECK(extra_ == end.extra_indices, "extra indices built");
  }

 private:
  void Tables(const SpanInput& s, const LayerPages& pages, int32_t B) {
    const LayerSpec& spec = shape_.spec;
    const int64_t last = s.first_position + s.num_rows - 1;
    if (spec.has_window()) {
      tables_.window_first = std::max<int64_t>(0, s.first_position - (shape_.window - 1));
      tables_.window.resize(last + 1 - tables_.window_first);
      MainSlots(pages, B, tables_.window_first, last + 1 - tables_.window_first,
                tables_.window.data());
    } else {
      SMLA_CHECK(pages.main_first_page == 0, "a full cache that slid");
      tables_.main_pages.assign(pages.main.begin(), pages.main.end());
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
  }

  void Row(const SpanInput& s, const LayerPages& pages, int32_t B, int32_t t) {
    const LayerSpec& spec = shape_.spec;
    const int64_t pos = s.first_position + t;
    const int shift = Log2(B);
    const std::span<const int32_t> chosen =
        s.topk_width > 0 ? s.topk.subspan(int64_t{t} * s.topk_width, s.topk_width)
                         : std::span<const int32_t>();
    if (spec.has_window()) {
      const int64_t from = std::max<int64_t>(0, pos - (shape_.window - 1));
      Put(out_.main_indices, main_, tables_.window.data() + (from - tables_.window_first),
          pos + 1 - from);
    } else {
      Chosen(chosen, tables_.main_pages, shift, spec.visible(pos),
             Reserve(out_.main_indices, main_, chosen));
    }
    out_.main_indptr[row_ + 1] = static_cast<int32_t>(main_);
    if (spec.kind == LayerKind::kSwaTopK) {
      Chosen(chosen, pages.compressed, shift, spec.visible(pos),
             Reserve(out_.extra_indices, extra_, chosen));
    } else if (spec.kind == LayerKind::kSwaDense) {
      Put(out_.extra_indices, extra_, tables_.dense.data(), spec.visible(pos));
    }
    if (!out_.extra_indptr.empty()) out_.extra_indptr[row_ + 1] = static_cast<int32_t>(extra_);
    if (!out_.positions.empty()) out_.positions[row_] = static_cast<int32_t>(pos);
    ++row_;
  }

  // Translates one row's chosen entries; an entry the row may not see marks the span.
  void Chosen(std::span<const int32_t> chosen, std::span<const int32_t> table, int shift,
              int64_t visible, int32_t* out) {
    SMLA_CHECK(visible <= (static_cast<int64_t>(table.size()) << shift),
               "visible entries outside the prepared page table");
    if (!TranslateEntries(chosen, table, shift, visible, out)) span_bad_ = true;
  }

  static void Put(std::span<int32_t> dst, int64_t& at, const int32_t* src, int64_t n) {
    SMLA_CHECK(at + n <= static_cast<int64_t>(dst.size()), "segment larger than counted");
    if (n == 0) return;  // src may be null then (an empty table), which memcpy does not allow
    std::memcpy(dst.data() + at, src, static_cast<size_t>(n) * sizeof(int32_t));
    at += n;
  }
  // Room for `chosen.size()` translated ids at `at`, which then moves past them.
  static int32_t* Reserve(std::span<int32_t> dst, int64_t& at, std::span<const int32_t> chosen) {
    const int64_t n = static_cast<int64_t>(chosen.size());
    SMLA_CHECK(at + n <= static_cast<int64_t>(dst.size()), "segment larger than counted");
    int32_t* p = dst.data() + at;
    at += n;
    return p;
  }

  const SegmentShape& shape_;
  const SegmentArrays& out_;
  SpanTables tables_;
  int64_t row_ = 0, main_ = 0, extra_ = 0;
  bool span_bad_ = false;
  std::vector<size_t> rejected_;
};

}  // namespace

namespace {

// The portable loop. Each id is loaded once (a client may be rewriting its region) and clamped
// into the table before the page is read, so a bad id reads nothing outside it; the result
// reports it.
bool TranslateScalar(const int32_t* in, int64_t n, const int32_t* table, int shift, int32_t limit,
                     int32_t* out) {
  const int32_t mask = (int32_t{1} << shift) - 1;
  int32_t bad = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int32_t e = __atomic_load_n(in + k, __ATOMIC_RELAXED);
    bad |= (e >= limit || e < -1) ? 1 : 0;
    const int32_t safe = std::min(std::max(e, 0), std::max(limit - 1, 0));
    const int32_t slot = limit > 0 ? (table[safe >> shift] << shift) | (safe & mask) : -1;
    out[k] = e < 0 ? -1 : slot;
  }
  return bad == 0;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
#define SMLA_TRANSLATE_AVX2 1
// Eight entries at a time with a gather of their pages (compilers do not emit gathers for
// this loop under their generic tuning).
__attribute__((target("avx2"))) bool TranslateAvx2(const int32_t* in, int64_t n,
                                                   const int32_t* table, int shift, int32_t limit,
                                                   int32_t* out) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i minus_one = _mm256_set1_epi32(-1);
  const __m256i last = _mm256_set1_epi32(limit - 1);
  const __m256i mask = _mm256_set1_epi32((int32_t{1} << shift) - 1);
  const __m128i count = _mm_cvtsi32_si128(shift);
  __m256i bad = zero;
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + k));
    bad = _mm256_or_si256(
        bad, _mm256_or_si256(_mm256_cmpgt_epi32(e, last), _mm256_cmpgt_epi32(minus_one, e)));
    const __m256i safe = _mm256_min_epi32(_mm256_max_epi32(e, zero), last);
    const __m256i page = _mm256_i32gather_epi32(table, _mm256_srl_epi32(safe, count), 4);
    const __m256i slot =
        _mm256_or_si256(_mm256_sll_epi32(page, count), _mm256_and_si256(safe, mask));
    // Negative entries become -1: all ones where e < 0.
    const __m256i result = _mm256_or_si256(slot, _mm256_cmpgt_epi32(zero, e));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), result);
  }
  const bool tail_ok = TranslateScalar(in + k, n - k, table, shift, limit, out + k);
  return tail_ok && _mm256_testz_si256(bad, bad);
}
#endif

}  // namespace

bool TranslateEntries(std::span<const int32_t> ids, std::span<const int32_t> pages, int page_shift,
                      int64_t visible, int32_t* out) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int32_t limit = static_cast<int32_t>(
      std::min<int64_t>({visible, static_cast<int64_t>(pages.size()) << page_shift, INT32_MAX}));
#if defined(SMLA_TRANSLATE_AVX2)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2 && limit > 0) return TranslateAvx2(ids.data(), n, pages.data(), page_shift, limit, out);
#endif
  return TranslateScalar(ids.data(), n, pages.data(), page_shift, limit, out);
}

SegmentCounts CountSegments(const SegmentShape& shape, std::span<const SpanRef> spans) {
  const LayerSpec& spec = shape.spec;
  SegmentCounts c;
  for (const SpanRef& ref : spans) {
    const SpanInput& s = *ref.input;
    c.rows += s.num_rows;
    if (spec.has_compressed()) c.compressed += CompressedOf(s, shape.row_bytes);
    for (int32_t t = 0; t < s.num_rows; ++t) {
      const int64_t pos = s.first_position + t;
      c.main_indices += spec.has_window() ? std::min<int64_t>(pos + 1, shape.window) : s.topk_width;
      if (spec.kind == LayerKind::kSwaTopK) c.extra_indices += s.topk_width;
      if (spec.kind == LayerKind::kSwaDense) c.extra_indices += spec.visible(pos);
    }
  }
  return c;
}

std::vector<size_t> BuildSegments(const SegmentShape& shape, std::span<const SpanRef> spans,
                                  const SegmentArrays& out) {
  // Slots: every span's KV rows in batch order, then every span's compressed entries.
  int64_t at = 0;
  std::vector<int32_t> tmp;
  for (const SpanRef& ref : spans) {
    const SpanInput& s = *ref.input;
    tmp.resize(s.num_rows);
    MainSlots(ref.prepared->pages(ref.index), ref.prepared->rows_per_page(), s.first_position,
              s.num_rows, tmp.data());
    SMLA_CHECK(at + s.num_rows <= static_cast<int64_t>(out.slots.size()), "slots counted");
    for (int32_t v : tmp) out.slots[at++] = v;
  }
  if (shape.spec.has_compressed()) {
    for (const SpanRef& ref : spans) {
      const SpanInput& s = *ref.input;
      const LayerPages& pages = ref.prepared->pages(ref.index);
      const int64_t B = ref.prepared->rows_per_page();
      const int64_t e0 = s.first_position / shape.spec.ratio;
      const int64_t n = CompressedOf(s, shape.row_bytes);
      SMLA_CHECK(at + n <= static_cast<int64_t>(out.slots.size()), "slots counted");
      for (int64_t e = e0; e < e0 + n; ++e) {
        SMLA_CHECK(e / B < static_cast<int64_t>(pages.compressed.size()),
                   "compressed entry outside the prepared page table");
        out.slots[at++] = int64_t{pages.compressed[e / B]} * B + e % B;
      }
    }
  }
  SMLA_CHECK(at == static_cast<int64_t>(out.slots.size()), "slots counted");
  out.main_indptr[0] = 0;
  if (!out.extra_indptr.empty()) out.extra_indptr[0] = 0;
  const int64_t rows = static_cast<int64_t>(out.main_indptr.size()) - 1;
  const SegmentCounts all{rows, 0, static_cast<int64_t>(out.main_indices.size()),
                          static_cast<int64_t>(out.extra_indices.size())};
  Builder b(shape, out);
  for (size_t i = 0; i < spans.size(); ++i) b.Span(spans[i], i);
  b.Finish(all);
  return b.TakeRejected();
}

}  // namespace smla::server
