// The device's copies of the page tables that chosen entries are translated through (the
// compressed tables of top-k layers, the main tables of chosen-position layers), so that a launch
// uploads only the pages that changed since the last one rather than every table its rows reach
// (docs/architecture.md, "Page tables on the device").
//
// Each table lies in blocks of kTableBlock page ids in one backend buffer, the heap, so that it
// grows by a block without moving. A launch hands each row its table's list of blocks
// (kernels::TranslateRow::blocks): a block the device holds current by its place in the heap, a
// stale one by a copy in the launch's upload, which the launch's checks also write into the heap
// (kernels::TableBlockWrite).
//
// A table of n pages holds ceil(n / kTableBlock) blocks, and the tables' pages together are at
// most the pool's, so ceil(pool pages / kTableBlock) blocks plus one per table are enough: a
// table never waits for a block.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "smla/base/align.h"
#include "smla/kernels/backend.h"

namespace smla::server {

inline constexpr int32_t kTableBlockShift = 5;
inline constexpr int32_t kTableBlock = 1 << kTableBlockShift;

// The blocks that hold a table of `pages` pages.
inline constexpr int64_t TableBlocksOf(int64_t pages) { return CeilDiv(pages, kTableBlock); }

// One table's copy on the device.
struct TableMirror {
  std::vector<int32_t> blocks;  // heap block b holds pages [b, b + 1) * kTableBlock
  // Where each block lies (TableHeap::block), kept beside the ids so that a launch lists a
  // table's blocks with one copy rather than an address computed per block.
  std::vector<const int32_t*> where;
  int64_t synced = 0;  // pages [0, synced) on the device equal the host table's
};

// Blocks [first, end) of a table: those a launch uploads (TableHeap::Stale).
struct BlockRange {
  int64_t first = 0;
  int64_t end = 0;
  int64_t size() const { return end - first; }
};

// Not thread-safe: the KV store guards it with its own mutex, and a table's `synced` belongs to
// whoever runs the steps of its (sequence, layer).
class TableHeap {
 public:
  TableHeap() = default;
  // A heap of `blocks` blocks in backend memory (none when 0).
  static absl::StatusOr<TableHeap> Create(kernels::Backend& backend, int64_t blocks);

  // Gives the table the blocks of `pages` pages, no more, and forgets what the device holds from
  // `pages` on: a table changes only at its end, and a page index popped there may come back
  // holding another page. Call after every change of the table's length.
  void Fit(TableMirror& table, int64_t pages);
  // The blocks a launch whose rows reach the table's first `pages` pages must upload: none when
  // the device holds them all, else from the block of the first stale page.
  static BlockRange Stale(const TableMirror& table, int64_t pages);

  // Where block b lies in backend memory.
  int32_t* block(int32_t b) const { return heap_.as<int32_t>() + int64_t{b} * kTableBlock; }
  int64_t blocks_total() const { return total_; }
  int64_t blocks_free() const { return static_cast<int64_t>(free_.size()); }

 private:
  kernels::Buffer heap_;
  int64_t total_ = 0;
  std::vector<int32_t> free_;  // a stack, low ids on top
};

}  // namespace smla::server
