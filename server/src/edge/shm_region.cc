#include "shm_region.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "smla/base/strings.h"
#include "smla/server/log_field.h"
#include "smla/v1/shm_region.h"
#include "spdlog/spdlog.h"

namespace smla::server::edge {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

namespace region = v1::region;

}  // namespace

absl::StatusOr<uint64_t> CheckSealedObject(int fd) {
  const int seals = fcntl(fd, F_GET_SEALS);
  struct statfs fs {};
  struct stat st {};
  if (seals < 0 || fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC || fstat(fd, &st) != 0 ||
      !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        "region memory: not a memfd (regions are memfds sealed with F_SEAL_SHRINK, "
        "F_SEAL_GROW and F_SEAL_SEAL; hugetlb memfds are not taken)");
  }
  if ((seals & region::kRegionSeals) != region::kRegionSeals) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "region memory: seals 0x%x lack F_SEAL_SHRINK, F_SEAL_GROW or F_SEAL_SEAL (a region's "
        "size must be fixed for good: the server maps it; POSIX shm objects cannot be sealed, "
        "use memfd_create with MFD_ALLOW_SEALING)",
        seals));
  }
  if ((seals & region::kRegionWriteSeals) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "region memory: memfd seals 0x%x forbid writes (the server writes outputs into regions)",
        seals));
  }
  return static_cast<uint64_t>(st.st_size);
}

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (errno != EINTR) {
      // getrandom cannot fail for a few bytes once the kernel's pool is ready (at boot).
      spdlog::critical("getrandom: {}", ErrnoText(errno));
      std::abort();
    }
  }
  return absl::BytesToHexString(raw);
}

HostPinning BudgetedPinning(const HostPinning& inner, uint64_t max_bytes) {
  struct Budget {
    absl::Mutex mu;
    uint64_t used ABSL_GUARDED_BY(mu) = 0;
    absl::flat_hash_map<void*, uint64_t> sizes ABSL_GUARDED_BY(mu);
  };
  auto budget = std::make_shared<Budget>();
  auto pin = [inner, budget, max_bytes](void* p, size_t n) -> absl::Status {
    {
      absl::MutexLock lock(&budget->mu);
      if (n > max_bytes - budget->used) {
        return absl::ResourceExhaustedError(
            absl::StrCat("page-locking ", n, " more bytes would pass --max_pinned_bytes (",
                         max_bytes, ", ", budget->used, " in use)"));
      }
      budget->used += n;
      budget->sizes[p] = n;
    }
    absl::Status st = inner.pin(p, n);
    if (!st.ok()) {
      absl::MutexLock lock(&budget->mu);
      budget->used -= n;
      budget->sizes.erase(p);
    }
    return st;
  };
  auto unpin = [inner, budget](void* p) {
    inner.unpin(p);
    absl::MutexLock lock(&budget->mu);
    auto it = budget->sizes.find(p);
    if (it == budget->sizes.end()) return;
    budget->used -= it->second;
    budget->sizes.erase(it);
  };
  return HostPinning{std::move(pin), std::move(unpin)};
}

absl::StatusOr<std::shared_ptr<ShmMapping>> ShmMapping::Open(const std::string& name,
                                                             OwnedFd object, uint64_t size,
                                                             const HostPinning& pinning) {
  if (size == 0) return absl::InvalidArgumentError(absl::StrCat("region ", name, ": size 0"));
  absl::StatusOr<uint64_t> holds = CheckSealedObject(object.get());
  if (!holds.ok()) return holds.status();
  if (*holds < size) {
    return absl::InvalidArgumentError(
        absl::StrCat("region ", name, ": size ", size, " but the memfd holds ", *holds, " bytes"));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, object.get(), 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("region ", name, ": mmap of ", size, " bytes: ", ErrnoText(errno)));
  }
  std::shared_ptr<ShmMapping> m(new ShmMapping());
  m->data_ = static_cast<uint8_t*>(p);
  m->size_ = size;
  if (pinning.pin && pinning.unpin) {
    if (absl::Status st = pinning.pin(m->data_, size); st.ok()) {
      m->unpin_ = pinning.unpin;
    } else {
      spdlog::warn("region {}: not page-locked, copies to and from it will be slower: {}", name,
                   st.ToString());
    }
  }
  return m;
}

std::shared_ptr<ShmMapping> ShmMapping::OnDevice(uint8_t* data, uint64_t size,
                                                 std::shared_ptr<const void> memory) {
  std::shared_ptr<ShmMapping> m(new ShmMapping());
  m->data_ = data;
  m->size_ = size;
  m->device_ = std::move(memory);
  return m;
}

ShmMapping::~ShmMapping() {
  if (on_device()) return;  // device_ closes the memory
  if (unpin_) unpin_(data_);
  if (data_ != nullptr) munmap(data_, size_);
}

absl::Status RegionRegistry::CheckCaps(const std::string& tenant) const {
  if (caps_.max_regions > 0 && regions_.size() >= static_cast<size_t>(caps_.max_regions)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_regions: the server holds ", regions_.size(), " regions, its limit"));
  }
  const auto held = held_.find(tenant);
  if (caps_.tenant_max_regions > 0 && held != held_.end() &&
      held->second >= caps_.tenant_max_regions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant_max_regions: the tenant holds ", held->second, " regions, its quota"));
  }
  return absl::OkStatus();
}

void RegionRegistry::Erase(std::map<std::string, Entry>::iterator it) {
  const auto held = held_.find(it->second.tenant);
  if (held != held_.end() && --held->second == 0) held_.erase(held);
  regions_.erase(it);
}

absl::StatusOr<std::string> RegionRegistry::Register(const std::string& tenant, uint64_t session,
                                                     OwnedFd object, uint64_t size,
                                                     EndSession end) {
  return Add(
      tenant, session,
      [&](const std::string& name) {
        return ShmMapping::Open(name, std::move(object), size, pinning_);
      },
      std::move(end));
}

absl::StatusOr<std::string> RegionRegistry::RegisterDevice(const std::string& tenant,
                                                           uint64_t session, uint8_t* data,
                                                           uint64_t size,
                                                           std::shared_ptr<const void> memory,
                                                           EndSession end) {
  return Add(
      tenant, session,
      [&](const std::string&) -> absl::StatusOr<std::shared_ptr<ShmMapping>> {
        return ShmMapping::OnDevice(data, size, std::move(memory));
      },
      std::move(end));
}

absl::StatusOr<std::string> RegionRegistry::Add(
    const std::string& tenant, uint64_t session,
    const std::function<absl::StatusOr<std::shared_ptr<ShmMapping>>(const std::string&)>& open,
    EndSession end) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status st = CheckCaps(tenant); !st.ok()) return st;
  }
  // 128 random bits: a name is never reused, so a stale reference cannot reach a new region.
  std::string name = "/smla-" + RandomHex(16);
  auto mapping = open(name);
  if (!mapping.ok()) return mapping.status();
  absl::MutexLock lock(&mu_);
  // Mapping ran outside the lock: a registration that took the last place meanwhile wins.
  if (absl::Status st = CheckCaps(tenant); !st.ok()) return st;
  while (regions_.contains(name)) name = "/smla-" + RandomHex(16);
  regions_[name] = Entry{tenant, session, *std::move(mapping), std::move(end)};
  ++held_[tenant];
  return name;
}

absl::Status RegionRegistry::Unregister(const std::string& tenant, const std::string& name) {
  EndSession end;
  {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(name);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("region ", LogField(name), ": not registered"));
    }
    if (it->second.tenant != tenant) {
      return absl::PermissionDeniedError(
          absl::StrCat("region ", name, ": registered by another tenant"));
    }
    end = std::move(it->second.end);
    Erase(it);
  }
  if (end) end();
  return absl::OkStatus();
}

void RegionRegistry::DropSession(uint64_t session) {
  absl::MutexLock lock(&mu_);
  for (auto it = regions_.begin(); it != regions_.end();) {
    auto next = std::next(it);
    if (it->second.session == session) Erase(it);
    it = next;
  }
}

void RegionRegistry::CloseAll() {
  std::vector<EndSession> ends;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, e] : regions_) {
      if (e.end) ends.push_back(std::move(e.end));
    }
    regions_.clear();
    held_.clear();
  }
  for (auto& end : ends) end();
}

absl::StatusOr<RegionBytes> RegionRegistry::Resolve(const std::string& tenant,
                                                    absl::string_view field,
                                                    const std::string& name, uint64_t offset,
                                                    uint64_t size, uint64_t align) const {
  absl::StatusOr<std::shared_ptr<ShmMapping>> mapping = Lookup(tenant, field, name);
  if (!mapping.ok()) return mapping.status();
  absl::StatusOr<std::span<uint8_t>> bytes = Slice(**mapping, field, name, offset, size, align);
  if (!bytes.ok()) return bytes.status();
  return RegionBytes{*bytes, *std::move(mapping)};
}

absl::StatusOr<std::shared_ptr<ShmMapping>> RegionRegistry::Lookup(const std::string& tenant,
                                                                   absl::string_view field,
                                                                   std::string_view name) const {
  std::shared_ptr<ShmMapping> mapping;
  {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(name);
    if (it == regions_.end()) {
      return absl::NotFoundError(
          absl::StrCat(field, ": region '", LogField(name), "' is not registered"));
    }
    if (it->second.tenant != tenant) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": region '", Sv(name), "' belongs to another tenant"));
    }
    mapping = it->second.mapping;
  }
  return mapping;
}

absl::StatusOr<std::span<uint8_t>> RegionRegistry::Slice(const ShmMapping& mapping,
                                                         absl::string_view field,
                                                         std::string_view name, uint64_t offset,
                                                         uint64_t size, uint64_t align) {
  if (!region::RefInBounds(offset, size, mapping.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", region::OutsideText(offset, size, name, mapping.size())));
  }
  if (!region::RefAligned(offset, align)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", region::MisalignedText(offset, align)));
  }
  return std::span<uint8_t>(mapping.data() + offset, size);
}

int64_t RegionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(regions_.size());
}

}  // namespace smla::server::edge
