// Hands out the pages of one model's pool. Not thread-safe: the KV store that owns it guards
// it with its own mutex.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace smla::server {

class PageAllocator {
 public:
  explicit PageAllocator(int32_t num_pages);

  int32_t pages_total() const { return total_; }
  int32_t pages_used() const { return total_ - static_cast<int32_t>(free_.size()); }
  int32_t pages_free() const { return static_cast<int32_t>(free_.size()); }

  // All or nothing: appends n page ids to `out` and returns true, or changes nothing and
  // returns false when fewer than n pages are free.
  bool Allocate(int32_t n, std::vector<int32_t>& out);

  // Returns pages to the pool. Each id must be allocated (checked: a double free crashes, as
  // it would mean two sequences share a page).
  void Free(std::span<const int32_t> pages);
  void Free(int32_t page) { Free(std::span<const int32_t>(&page, 1)); }

  bool IsAllocated(int32_t page) const { return page >= 0 && page < total_ && used_[page]; }

 private:
  int32_t total_;
  std::vector<int32_t> free_;  // a stack: low ids first, so small pools are easy to reason about
  std::vector<bool> used_;
};

}  // namespace smla::server
