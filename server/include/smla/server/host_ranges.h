// Memory the backend can copy from and to directly: host ranges registered with it
// (page-locked: Backend::RegisterHostMemory) and device memory it opened (a GPU region), so
// the executor copies inputs that lie inside one straight to the device instead of gathering
// them into its own page-locked buffer first, and knows which copies stay on the device.
// Thread-safe: the edge registers regions while the executor reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
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
    Memo none;
    return Find(data, bytes, none);
  }
  // What the last lookup found: a registered range, or the gap between two that holds no
  // registration, so that a caller's run of lookups takes the lock once rather than once each.
  // Good only while that range stays registered: a launch's steps hold the regions they name,
  // so a launch may keep one, never longer. (A range registered into a remembered gap meanwhile
  // is missed, which costs a staged copy, never a wrong one.)
  struct Memo {
    uintptr_t begin = 0;
    uintptr_t end = 0;  // empty: nothing remembered
    Kind kind = Kind::kNone;
  };
  Kind Find(const void* data, size_t bytes, Memo& memo) const {
    const uintptr_t begin = Address(data);
    if (begin >= memo.begin && begin + bytes <= memo.end) return memo.kind;
    absl::ReaderMutexLock lock(&mu_);
    auto next = ranges_.upper_bound(begin);
    const uintptr_t gap_end = next == ranges_.end() ? UINTPTR_MAX : next->first;
    uintptr_t gap_begin = 0;
    if (next != ranges_.begin()) {
      auto it = std::prev(next);
      if (begin < it->second.end) {  // inside a registration
        if (begin + bytes > it->second.end) return Kind::kNone;
        memo = Memo{it->first, it->second.end, it->second.kind};
        return it->second.kind;
      }
      gap_begin = it->second.end;
    }
    if (begin + bytes <= gap_end) memo = Memo{gap_begin, gap_end, Kind::kNone};
    return Kind::kNone;
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
