#include "host_staging.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace smla::server::edge {
namespace {

constexpr size_t kMinBuffer = size_t{64} << 10;

size_t SizeClass(size_t bytes) { return std::bit_ceil(std::max(bytes, kMinBuffer)); }

}  // namespace

struct StagingPool::State {
  State(HostPinning p, Options o) : pinning(std::move(p)), options(o) {}

  ~State() {
    for (auto& [size, list] : free)
      for (uint8_t* b : list) Unmap(b, size);
  }

  // Maps a buffer and faults its pages in now (MAP_POPULATE), so its first use costs no page
  // faults either; pins it when the pinning allows.
  uint8_t* Map(size_t size) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    auto* b = static_cast<uint8_t*>(p);
    const bool pin_ok = pinning.pin && pinning.pin(b, size).ok();
    absl::MutexLock lock(&mu);
    if (pin_ok) pinned.insert(b);
    ++mapped;
    return b;
  }

  void Unmap(uint8_t* b, size_t size) {
    bool was_pinned = false;
    {
      absl::MutexLock lock(&mu);
      was_pinned = pinned.erase(b) > 0;
    }
    if (was_pinned && pinning.unpin) pinning.unpin(b);
    munmap(b, size);
  }

  void Return(uint8_t* b, size_t size, const std::string& tenant) {
    {
      absl::MutexLock lock(&mu);
      leased -= size;
      auto t = by_tenant.find(tenant);
      t->second -= size;
      if (t->second == 0) by_tenant.erase(t);
      if (b == nullptr) return;  // a lease whose mapping failed
      if (cached + size <= options.max_cached_bytes) {
        free[size].push_back(b);
        cached += size;
        return;
      }
    }
    Unmap(b, size);
  }

  const HostPinning pinning;
  const Options options;
  absl::Mutex mu;
  std::map<size_t, std::vector<uint8_t*>> free ABSL_GUARDED_BY(mu);  // by size class
  absl::flat_hash_set<uint8_t*> pinned ABSL_GUARDED_BY(mu);
  uint64_t leased ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<std::string, uint64_t> by_tenant ABSL_GUARDED_BY(mu);
  uint64_t cached ABSL_GUARDED_BY(mu) = 0;
  uint64_t mapped ABSL_GUARDED_BY(mu) = 0;
};

StagingPool::StagingPool(HostPinning pinning, Options options)
    : state_(std::make_shared<State>(std::move(pinning), options)) {}

StagingPool::~StagingPool() = default;

absl::StatusOr<std::shared_ptr<StagingBuffer>> StagingPool::Lease(size_t bytes,
                                                                  const std::string& tenant) {
  const size_t size = SizeClass(bytes);
  State& s = *state_;
  {
    absl::MutexLock lock(&s.mu);
    if (s.leased + size > s.options.max_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("inline tensors: ", size, " more bytes would pass the server's limit of ",
                       s.options.max_bytes, " bytes in flight (", s.leased, " in use)"));
    }
    uint64_t& mine = s.by_tenant[tenant];
    if (mine + size > s.options.max_tenant_bytes) {
      const uint64_t held = mine;
      if (held == 0) s.by_tenant.erase(tenant);
      return absl::ResourceExhaustedError(
          absl::StrCat("inline tensors: ", size, " more bytes would pass the tenant's limit of ",
                       s.options.max_tenant_bytes, " bytes in flight (", held, " in use)"));
    }
    mine += size;
    s.leased += size;
    auto it = s.free.find(size);
    if (it != s.free.end() && !it->second.empty()) {
      uint8_t* b = it->second.back();
      it->second.pop_back();
      s.cached -= size;
      return std::make_shared<StagingBuffer>(state_, b, size, tenant);
    }
  }
  uint8_t* b = s.Map(size);
  if (b == nullptr) {
    s.Return(nullptr, size, tenant);
    return absl::ResourceExhaustedError(
        absl::StrCat("inline tensors: cannot map ", size, " bytes"));
  }
  return std::make_shared<StagingBuffer>(state_, b, size, tenant);
}

uint64_t StagingPool::bytes_leased() const {
  absl::MutexLock lock(&state_->mu);
  return state_->leased;
}

uint64_t StagingPool::bytes_cached() const {
  absl::MutexLock lock(&state_->mu);
  return state_->cached;
}

uint64_t StagingPool::buffers_mapped() const {
  absl::MutexLock lock(&state_->mu);
  return state_->mapped;
}

uint64_t StagingPool::tenant_bytes_leased(const std::string& tenant) const {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->by_tenant.find(tenant);
  return it == state_->by_tenant.end() ? 0 : it->second;
}

StagingBuffer::~StagingBuffer() { pool_->Return(data_, size_, tenant_); }

}  // namespace smla::server::edge
