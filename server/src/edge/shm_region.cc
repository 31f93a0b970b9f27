#include "shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace smla::server::edge {
namespace {

constexpr char kPrefix[] = "/smla-";
constexpr size_t kMaxNameChars = 200;

std::string ErrnoText(int err) { return std::strerror(err); }

}  // namespace

absl::Status CheckRegionName(const std::string& name) {
  const size_t prefix = sizeof(kPrefix) - 1;
  if (name.size() <= prefix || name.compare(0, prefix, kPrefix) != 0 ||
      name.size() - prefix > kMaxNameChars) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region name '", name, "': must be \"/smla-\" followed by 1..200 of [A-Za-z0-9._-]"));
  }
  for (size_t i = prefix; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("region name '", name, "': character ", i, " is not [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

HostPinning BudgetedPinning(HostPinning inner, uint64_t max_bytes) {
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

absl::StatusOr<std::shared_ptr<ShmMapping>> ShmMapping::Open(const std::string& name, uint64_t size,
                                                             const HostPinning& pinning) {
  if (absl::Status st = CheckRegionName(name); !st.ok()) return st;
  if (size == 0) return absl::InvalidArgumentError(absl::StrCat("region ", name, ": size 0"));
  std::shared_ptr<ShmMapping> m(new ShmMapping());
  m->name_ = name;
  m->fd_ = shm_open(name.c_str(), O_RDWR, 0);
  if (m->fd_ < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat("region ", name, ": shm_open: ", ErrnoText(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  struct stat st {};
  if (fstat(m->fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("region ", name, ": not a shared-memory file"));
  }
  if (static_cast<uint64_t>(st.st_size) < size) {
    return absl::InvalidArgumentError(absl::StrCat("region ", name, ": size ", size,
                                                   " but the object holds ", st.st_size, " bytes"));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd_, 0);
  if (p == MAP_FAILED) {
    return absl::InvalidArgumentError(
        absl::StrCat("region ", name, ": mmap of ", size, " bytes: ", ErrnoText(errno)));
  }
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

ShmMapping::~ShmMapping() {
  if (unpin_) unpin_(data_);
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

absl::Status ShmMapping::CheckStillBacked() const {
  struct stat st {};
  if (fstat(fd_, &st) != 0 || static_cast<uint64_t>(st.st_size) < size_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "region ", name_, ": the object was shrunk below its registered size ", size_));
  }
  return absl::OkStatus();
}

absl::Status RegionRegistry::CheckCaps(const std::string& tenant) const {
  if (caps_.max_regions > 0 && regions_.size() >= static_cast<size_t>(caps_.max_regions)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_regions: the server holds ", regions_.size(), " regions, its limit"));
  }
  const auto held = held_.find(tenant);
  if (caps_.tenant_max_regions > 0 && held != held_.end() &&
      held->second >= caps_.tenant_max_regions) {
    return absl::ResourceExhaustedError(absl::StrCat("tenant_max_regions: the tenant holds ",
                                                     held->second, " regions, its quota"));
  }
  return absl::OkStatus();
}

void RegionRegistry::Erase(std::map<std::string, Entry>::iterator it) {
  const auto held = held_.find(it->second.tenant);
  if (held != held_.end() && --held->second == 0) held_.erase(held);
  regions_.erase(it);
}

absl::Status RegionRegistry::Register(const std::string& tenant, uint64_t session,
                                      const std::string& name, uint64_t size, EndSession end) {
  if (absl::Status st = CheckRegionName(name); !st.ok()) return st;
  {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(name);
    if (it != regions_.end()) {
      if (it->second.tenant != tenant) {
        return absl::PermissionDeniedError(
            absl::StrCat("region ", name, ": registered by another tenant"));
      }
      return absl::AlreadyExistsError(absl::StrCat("region ", name, ": already registered"));
    }
    if (absl::Status st = CheckCaps(tenant); !st.ok()) return st;
  }
  // Mapping happens outside the lock; a racing registration of the same name, or one that
  // took the last place, is caught below.
  auto mapping = ShmMapping::Open(name, size, pinning_);
  if (!mapping.ok()) return mapping.status();
  absl::MutexLock lock(&mu_);
  if (regions_.count(name) == 0) {
    if (absl::Status st = CheckCaps(tenant); !st.ok()) return st;
  }
  auto [it, inserted] = regions_.try_emplace(name);
  if (!inserted) {
    return it->second.tenant != tenant
               ? absl::PermissionDeniedError(
                     absl::StrCat("region ", name, ": registered by another tenant"))
               : absl::AlreadyExistsError(absl::StrCat("region ", name, ": already registered"));
  }
  it->second = Entry{tenant, session, *std::move(mapping), std::move(end)};
  ++held_[tenant];
  return absl::OkStatus();
}

absl::Status RegionRegistry::Unregister(const std::string& tenant, const std::string& name) {
  EndSession end;
  {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(name);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("region ", name, ": not registered"));
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
                                                    const std::string& field,
                                                    const std::string& name, uint64_t offset,
                                                    uint64_t size, uint64_t align) const {
  absl::StatusOr<std::shared_ptr<ShmMapping>> mapping = Lookup(tenant, field, name);
  if (!mapping.ok()) return mapping.status();
  absl::StatusOr<std::span<uint8_t>> bytes = Slice(**mapping, field, name, offset, size, align);
  if (!bytes.ok()) return bytes.status();
  return RegionBytes{*bytes, *std::move(mapping)};
}

absl::StatusOr<std::shared_ptr<ShmMapping>> RegionRegistry::Lookup(const std::string& tenant,
                                                                   const std::string& field,
                                                                   const std::string& name) const {
  std::shared_ptr<ShmMapping> mapping;
  {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(name);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat(field, ": region '", name, "' is not registered"));
    }
    if (it->second.tenant != tenant) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": region '", name, "' belongs to another tenant"));
    }
    mapping = it->second.mapping;
  }
  if (absl::Status st = mapping->CheckStillBacked(); !st.ok()) return st;
  return mapping;
}

absl::StatusOr<std::span<uint8_t>> RegionRegistry::Slice(const ShmMapping& mapping,
                                                         const std::string& field,
                                                         const std::string& name, uint64_t offset,
                                                         uint64_t size, uint64_t align) {
  // offset + size <= region size, written so that it cannot overflow.
  if (offset > mapping.size() || size > mapping.size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": offset ", offset, " + size ", size,
                                                   " is outside region '", name, "' of ",
                                                   mapping.size(), " bytes"));
  }
  if (align > 1 && offset % align != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": offset ", offset, " is not a multiple of ", align, " (the element size)"));
  }
  return std::span<uint8_t>(mapping.data() + offset, size);
}

int64_t RegionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(regions_.size());
}

}  // namespace smla::server::edge
