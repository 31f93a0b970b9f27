// Host memory ranges registered with the backend (page-locked: Backend::RegisterHostMemory),
// so the executor copies inputs that lie inside one straight to the device instead of
// gathering them into its own page-locked buffer first. Thread-safe: the edge registers
// regions while the executor reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace smla::server {

class HostRanges {
 public:
  // Ranges do not overlap (each is a distinct mapping); adding a start again replaces it.
  void Add(const void* data, size_t bytes) {
    absl::MutexLock lock(&mu_);
    ranges_[Address(data)] = Address(data) + bytes;
  }
  void Remove(const void* data) {
    absl::MutexLock lock(&mu_);
    ranges_.erase(Address(data));
  }
  // Whether [data, data + bytes) lies inside one registered range.
  bool Contains(const void* data, size_t bytes) const {
    const uintptr_t begin = Address(data);
    absl::ReaderMutexLock lock(&mu_);
    auto it = ranges_.upper_bound(begin);
    if (it == ranges_.begin()) return false;
    --it;
    return begin + bytes <= it->second;
  }

 private:
  static uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

  mutable absl::Mutex mu_;
  std::map<uintptr_t, uintptr_t> ranges_ ABSL_GUARDED_BY(mu_);  // start -> end
};

}  // namespace smla::server
