// Memory the backend can copy from and to directly: host ranges registered with it
// (page-locked: Backend::RegisterHostMemory) and device memory it opened (a GPU region), so
// the executor copies inputs that lie inside one straight to the device instead of gathering
// them into its own page-locked buffer first, and knows which copies stay on the device.
// Thread-safe: the edge registers regions while the executor reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace smla::server {

class HostRanges {
 public:
  enum class Kind : uint8_t { kNone, kHost, kDevice };

  // Ranges do not overlap (each is a distinct mapping); adding a start again replaces it.
  void Add(const void* data, size_t bytes, Kind kind = Kind::kHost) {
    absl::MutexLock lock(&mu_);
    ranges_[Address(data)] = Range{Address(data) + bytes, kind};
  }
  void Remove(const void* data) {
    absl::MutexLock lock(&mu_);
    ranges_.erase(Address(data));
  }
  // The kind of the registered range [data, data + bytes) lies wholly inside, kNone if none.
  Kind Find(const void* data, size_t bytes) const {
    const uintptr_t begin = Address(data);
    absl::ReaderMutexLock lock(&mu_);
    auto it = ranges_.upper_bound(begin);
    if (it == ranges_.begin()) return Kind::kNone;
    --it;
    return begin + bytes <= it->second.end ? it->second.kind : Kind::kNone;
  }
  bool Contains(const void* data, size_t bytes) const { return Find(data, bytes) != Kind::kNone; }

 private:
  struct Range {
    uintptr_t end = 0;
    Kind kind = Kind::kHost;
  };
  static uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

  mutable absl::Mutex mu_;
  std::map<uintptr_t, Range> ranges_ ABSL_GUARDED_BY(mu_);  // by start
};

}  // namespace smla::server
