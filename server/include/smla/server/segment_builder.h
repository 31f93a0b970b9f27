// A batch's slot lists and attention segments (step_executor.h says what each row sees), built
// in bulk from the prepared page tables into caller-owned arrays (page-locked memory on GPU
// backends, so they are written once and copied to the device directly):
// - slots: the KV rows of every span in batch order, then the compressed entries of every span;
// - main segment: each row's SWA window (the span's window slots are computed once per span and
//   each row copies its slice) or, on chosen-position layers, its entries translated through
//   the main page table;
// - extra segment: chosen compressed entries translated through the compressed page table
//   (-1 stays a sentinel), or every visible entry on dense layers;
// - positions: each row's position (for inverse RoPE).
// The build is where chosen entries are checked: each id is read once (it may lie in a client's
// shared memory, which the client could rewrite at any time) and must lie in [-1, visible - 1]
// for its row. A span with any other id is reported back, and its slots are left unusable.
// A page table that does not cover the entries a row may see is an invariant failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "smla/server/kv_store.h"
#include "smla/server/model_profile.h"
#include "smla/server/step.h"

namespace smla::server {

// One span of the batch with the prepared step that holds its page tables.
struct SpanRef {
  const SpanInput* input = nullptr;
  const PreparedStep* prepared = nullptr;
  size_t index = 0;  // the span's index in `prepared`
};

struct SegmentShape {
  LayerSpec spec;
  int32_t window = 0;    // W of the window layers
  size_t row_bytes = 0;  // one bf16 KV row (2 * QkWidth), to count each span's compressed rows
};

// Array lengths of a batch, known before anything is built.
struct SegmentCounts {
  int64_t rows = 0;           // T: query rows
  int64_t compressed = 0;     // new compressed entries (after the T KV rows in `slots`)
  int64_t main_indices = 0;   // nnz of the main segment
  int64_t extra_indices = 0;  // nnz of the extra segment (0 without one)
  int64_t slots() const { return rows + compressed; }
};

// Caller-owned outputs, each exactly its count long (positions may be empty: not built).
struct SegmentArrays {
  std::span<int64_t> slots;          // [rows + compressed]
  std::span<int32_t> main_indptr;    // [rows + 1]
  std::span<int32_t> main_indices;   // [main_indices]
  std::span<int32_t> extra_indptr;   // [rows + 1], empty without an extra segment
  std::span<int32_t> extra_indices;  // [extra_indices]
  std::span<int32_t> positions;      // [rows] or empty
};

SegmentCounts CountSegments(const SegmentShape& shape, std::span<const SpanRef> spans);

// Returns the spans (indices into `spans`) with a chosen entry their row may not see, in order.
std::vector<size_t> BuildSegments(const SegmentShape& shape, std::span<const SpanRef> spans,
                                  const SegmentArrays& out);

// out[k] = -1 for ids[k] == -1, else the slot of entry ids[k] in a table of pages of
// 2^page_shift rows (entry e is row e % B of pages[e / B]). Reads each id once, vectorised;
// false (out then holds -1 or slots inside the table) when an id lies outside
// [-1, min(visible, table entries) - 1].
bool TranslateEntries(std::span<const int32_t> ids, std::span<const int32_t> pages, int page_shift,
                      int64_t visible, int32_t* out);

}  // namespace smla::server
