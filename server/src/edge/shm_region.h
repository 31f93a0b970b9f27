// Registered shared-memory regions (docs/architecture.md "Transport"): a client on the server's
// host hands the server a sealed memfd (smla/v1/shm_handover.h) and registers it, and then names
// (region, offset, size) for step inputs and outputs instead of inline bytes. The server maps
// each region once, read/write, and hands the core views of the mapping, so inputs are read in
// place and outputs are written straight into it.
//
// Rules (what a region and a reference obey, sealing, bounds and alignment, is the wire's
// contract, smla/v1/shm_region.h; CheckSealedObject and RegionRegistry::Slice apply it):
// - The server names each region ("/smla-" and 32 random hex characters): whoever hands the
//   memory over owns the region, and no tenant can claim, squat or guess another's.
// - A region belongs to the tenant that registered it (naming another tenant's region is
//   PERMISSION_DENIED) and to the session (the registering call) that keeps it alive; it is
//   unmapped when it is unregistered or its session ends, and not before the last step that
//   uses it has finished (steps hold a reference to the mapping).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "owned_fd.h"

namespace smla::server::edge {

// Page-locks host memory for the backend's copies (ServiceCore::RegisterHostMemory), so steps
// copy straight between a region and the GPU; empty functions leave mappings unpinned.
struct HostPinning {
  std::function<absl::Status(void*, size_t)> pin;
  std::function<void(void*)> unpin;
};

// `inner` limited to `max_bytes` page-locked at once (locked memory is the host's, and any
// tenant may register regions): past the limit `pin` answers RESOURCE_EXHAUSTED without
// calling `inner`, and the region is served unpinned (slower copies, same results).
HostPinning BudgetedPinning(const HostPinning& inner, uint64_t max_bytes);

// The size of `fd` when it is a region the server may map: a memfd on shmem (not hugetlbfs),
// sealed against shrinking, growing and further sealing, and not against writes.
// INVALID_ARGUMENT naming what is wrong otherwise.
absl::StatusOr<uint64_t> CheckSealedObject(int fd);

// `bytes` random bytes from the kernel, as lowercase hex (region names, handover tokens).
std::string RandomHex(size_t bytes);

// One mapped region: host memory (a memfd, unpinned and unmapped on destruction), or device
// memory of a GPU region (OnDevice), whose address the host must never dereference.
class ShmMapping {
 public:
  // A GPU region's `size` bytes at device address `data`, kept open by `memory`.
  static std::shared_ptr<ShmMapping> OnDevice(uint8_t* data, uint64_t size,
                                              std::shared_ptr<const void> memory);
  // Maps the first `size` bytes of `object` read/write as region `name`; the object must pass
  // CheckSealedObject and hold at least `size` bytes. The descriptor is closed once mapped.
  // Pins the mapping with `pinning` when given; a pin that fails only costs speed.
  static absl::StatusOr<std::shared_ptr<ShmMapping>> Open(const std::string& name, OwnedFd object,
                                                          uint64_t size,
                                                          const HostPinning& pinning = {});
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool on_device() const { return device_ != nullptr; }

 private:
  ShmMapping() = default;
  std::shared_ptr<const void> device_;  // a GPU region's memory; null for host memory
  std::function<void(void*)> unpin_;    // set while the mapping is pinned
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// A resolved reference: the bytes and the mapping that keeps them valid.
struct RegionBytes {
  std::span<uint8_t> bytes;
  std::shared_ptr<ShmMapping> keep_alive;
};

// How many regions may be registered at once (each holds a descriptor); 0 = no bound.
struct RegionCaps {
  int32_t max_regions = 0;         // all tenants together
  int32_t tenant_max_regions = 0;  // one tenant
};

// Registered regions of all tenants; thread-safe.
class RegionRegistry {
 public:
  // Ends a session from the registry's side (unregister, shutdown); runs without the lock.
  using EndSession = std::function<void()>;

  explicit RegionRegistry(HostPinning pinning = {}, RegionCaps caps = {})
      : pinning_(std::move(pinning)), caps_(caps) {}

  // Maps `object` (ShmMapping::Open) for `tenant` and records it under a new name, which it
  // returns; `end` is called once when the region is dropped by Unregister or CloseAll (not by
  // DropSession, which the session itself calls). Errors: INVALID_ARGUMENT (size 0, the
  // object's seals or size), RESOURCE_EXHAUSTED naming the cap (tenant_max_regions,
  // max_regions), INTERNAL (mmap).
  absl::StatusOr<std::string> Register(const std::string& tenant, uint64_t session, OwnedFd object,
                                       uint64_t size, EndSession end);
  // Records a GPU region (ShmMapping::OnDevice) under a new name, as Register does.
  absl::StatusOr<std::string> RegisterDevice(const std::string& tenant, uint64_t session,
                                             uint8_t* data, uint64_t size,
                                             std::shared_ptr<const void> memory, EndSession end);
  // Drops a region of `tenant`: NOT_FOUND if none, PERMISSION_DENIED if another tenant's.
  absl::Status Unregister(const std::string& tenant, const std::string& name);
  // Drops what `session` registered (the registering call ended).
  void DropSession(uint64_t session);
  // Drops every region and ends every session (server shutdown).
  void CloseAll();

  // Resolves (name, offset, size) for `tenant`. `field` names the reference in errors;
  // `align` is the element size its offset must be a multiple of (region::RefAligned).
  absl::StatusOr<RegionBytes> Resolve(const std::string& tenant, absl::string_view field,
                                      const std::string& name, uint64_t offset, uint64_t size,
                                      uint64_t align) const;
  // Resolve in two halves, so a request naming one region many times looks it up once: the
  // region of `tenant` (registered, owned), then a reference's bytes within it.
  absl::StatusOr<std::shared_ptr<ShmMapping>> Lookup(const std::string& tenant,
                                                     absl::string_view field,
                                                     std::string_view name) const;
  static absl::StatusOr<std::span<uint8_t>> Slice(const ShmMapping& mapping,
                                                  absl::string_view field, std::string_view name,
                                                  uint64_t offset, uint64_t size, uint64_t align);

  int64_t size() const;
  uint64_t NewSession() { return next_session_.fetch_add(1); }

 private:
  struct Entry {
    std::string tenant;
    uint64_t session = 0;
    std::shared_ptr<ShmMapping> mapping;
    EndSession end;
  };
  // Records the mapping `open` makes for a new name, within the caps.
  absl::StatusOr<std::string> Add(
      const std::string& tenant, uint64_t session,
      const std::function<absl::StatusOr<std::shared_ptr<ShmMapping>>(const std::string&)>& open,
      EndSession end);
  // RESOURCE_EXHAUSTED when `tenant` may register no more.
  absl::Status CheckCaps(const std::string& tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Erase(std::map<std::string, Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const HostPinning pinning_;
  const RegionCaps caps_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry, std::less<>> regions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int32_t> held_ ABSL_GUARDED_BY(mu_);  // regions by tenant
  std::atomic<uint64_t> next_session_{1};
};

}  // namespace smla::server::edge
