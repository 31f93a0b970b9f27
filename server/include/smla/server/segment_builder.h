// A batch's slot lists and attention segments (step_executor.h says what each row sees), built
// in bulk from the prepared page tables into caller-owned arrays (page-locked memory on GPU
// backends, so they are written once and copied to the device directly):
// - slots: the KV rows of every span in batch order, then the compressed entries of every span,
//   with the group (the span's step in the launch) of each, so that a step that fails a check on
//   the device writes none of its rows;
// - main segment on window layers: each row's SWA window, written on the device
//   (Backend::CheckInputs) from one PositionRun per row over the span's window pages (listed
//   once per span in `run_pages`): a row's 4-byte run stands for its W slots in the upload;
// - extra segment: every visible entry on dense layers;
// - the chosen segment (the main one on chosen-position layers, the extra one on top-k layers):
//   its offsets here, and its indices translated on the device (Backend::CheckInputs), one
//   TranslateRow per row over the span's page table as the device holds it (device_tables.h):
//   one list of blocks per span in `table_blocks`, naming the heap's block where the device copy
//   is current and a copy in `stale_blocks` where it is not, with a TableBlockWrite that brings
//   the heap up to date (and the span's TableMirror::synced advanced). The device reads each id
//   once and checks it against what its row may see ([-1, visible - 1]); a step with any other
//   id is flagged there and fails alone;
// - positions: each row's position (for inverse RoPE).
// A page table that does not cover the entries a row may see is an invariant failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "smla/kernels/params.h"
#include "smla/server/kv_store.h"
#include "smla/server/model_profile.h"
#include "smla/server/step.h"

namespace smla::server {

// One span of the batch with the prepared step that holds its page tables.
struct SpanRef {
  const SpanInput* input = nullptr;
  const PreparedStep* prepared = nullptr;
  size_t index = 0;   // the span's index in `prepared`
  int32_t group = 0;  // the span's step in the launch: its flag and its rows' group
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
  int64_t chosen_rows = 0;    // rows with chosen entries (each a TranslateRow)
  int64_t chosen_ids = 0;     // their entries, every span's top-k in span order
  int64_t table_blocks = 0;   // blocks of the tables their spans' rows may reach
  int64_t stale_blocks = 0;   // those the device does not hold current (TableHeap::Stale)
  int64_t runs = 0;           // rows with a window (each a PositionRun)
  int64_t run_pages = 0;      // pages of every span's windows, listed per span
  int64_t slots() const { return rows + compressed; }
};

// Caller-owned outputs, each exactly its count long (positions may be empty: not built). The
// main segment's indices, and the extra segment's on top-k layers, are written on the device:
// none of them is here.
struct SegmentArrays {
  std::span<int64_t> slots;                          // [rows + compressed]
  std::span<int32_t> slot_groups;                    // [rows + compressed]
  std::span<int32_t> main_indptr;                    // [rows + 1]
  std::span<int32_t> extra_indptr;                   // [rows + 1], empty without an extra segment
  std::span<int32_t> extra_indices;                  // [extra_indices] on dense layers, else empty
  std::span<int32_t> positions;                      // [rows] or empty
  std::span<const int32_t*> table_blocks;            // [table_blocks] backend addresses
  std::span<int32_t> stale_blocks;                   // [stale_blocks * kTableBlock]
  std::span<kernels::TableBlockWrite> block_writes;  // [stale_blocks]
  std::span<kernels::TranslateRow> chosen;           // [chosen_rows]
  std::span<kernels::PositionRun> runs;              // [runs]
  std::span<int32_t> run_pages;                      // [run_pages]
};

// Where the device's translation and window runs read and write: backend-memory addresses the
// TranslateRows and PositionRuns point at.
struct DeviceTargets {
  int32_t* ids = nullptr;  // every span's top-k ids in span order, as copied in
  // Per span (or empty: none): where the span's ids are read instead, when not null (a GPU
  // region); the translation then writes the ids it read to their place in `ids`.
  std::span<const int32_t* const> span_ids;
  int32_t* main = nullptr;   // the main segment's indices
  int32_t* extra = nullptr;  // the extra segment's indices on top-k layers
  // The backend's copies of SegmentArrays::table_blocks, stale_blocks and run_pages.
  const int32_t* const* table_blocks = nullptr;
  const int32_t* stale_blocks = nullptr;
  const int32_t* run_pages = nullptr;
};

SegmentCounts CountSegments(const SegmentShape& shape, std::span<const SpanRef> spans);

// `counts` is CountSegments of the same spans, taken before: building advances the tables'
// TableMirror::synced, which the stale blocks are counted from.
void BuildSegments(const SegmentShape& shape, std::span<const SpanRef> spans,
                   const SegmentCounts& counts, const DeviceTargets& targets,
                   const SegmentArrays& out);

}  // namespace smla::server
