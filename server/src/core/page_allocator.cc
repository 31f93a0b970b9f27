#include "smla/server/page_allocator.h"

#include "internal.h"

namespace smla::server {

PageAllocator::PageAllocator(int32_t num_pages) : total_(num_pages), used_(num_pages, false) {
  free_.reserve(num_pages);
  for (int32_t p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

bool PageAllocator::Allocate(int32_t n, std::vector<int32_t>& out) {
  if (n < 0 || n > static_cast<int32_t>(free_.size())) return false;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t p = free_.back();
    free_.pop_back();
    used_[p] = true;
    out.push_back(p);
  }
  return true;
}

void PageAllocator::Free(std::span<const int32_t> pages) {
  for (int32_t p : pages) {
    SMLA_CHECK(IsAllocated(p), "page freed but not allocated");
    used_[p] = false;
    free_.push_back(p);
  }
}

}  // namespace smla::server
