#include "smla/server/device_tables.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "internal.h"

namespace smla::server {

absl::StatusOr<TableHeap> TableHeap::Create(kernels::Backend& backend, int64_t blocks) {
  TableHeap heap;
  if (blocks == 0) return heap;
  SMLA_CHECK(blocks > 0 && blocks <= INT32_MAX, "table heap size");
  const auto bytes = static_cast<size_t>(blocks * kTableBlock) * sizeof(int32_t);
  absl::StatusOr<kernels::Buffer> buffer = backend.Allocate(bytes);
  if (!buffer.ok()) {
    return absl::ResourceExhaustedError(Cat("cannot allocate the page tables' device copy (", bytes,
                                            " bytes): ", buffer.status().message()));
  }
  heap.heap_ = *std::move(buffer);
  heap.total_ = blocks;
  heap.free_.reserve(static_cast<size_t>(blocks));
  for (int64_t b = blocks - 1; b >= 0; --b) heap.free_.push_back(static_cast<int32_t>(b));
  return heap;
}

void TableHeap::Fit(TableMirror& table, int64_t pages) {
  const auto need = static_cast<size_t>(TableBlocksOf(pages));
  while (table.blocks.size() > need) {
    free_.push_back(table.blocks.back());
    table.blocks.pop_back();
    table.where.pop_back();
  }
  while (table.blocks.size() < need) {
    SMLA_CHECK(!free_.empty(), "the table heap ran out of blocks");
    table.blocks.push_back(free_.back());
    table.where.push_back(block(free_.back()));
    free_.pop_back();
  }
  table.synced = std::min(table.synced, pages);
}

BlockRange TableHeap::Stale(const TableMirror& table, int64_t pages) {
  if (table.synced >= pages) return BlockRange{};
  return BlockRange{table.synced / kTableBlock, TableBlocksOf(pages)};
}

}  // namespace smla::server
