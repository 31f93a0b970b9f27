// libFuzzer target over region descriptors: (region, offset, size, alignment) references
// resolved by the registry, ring_attach requests (fields and the ring header the client wrote),
// and the handover box (offers, claims with guessed or real tokens, registrations, expiry).
// Every answer that says OK is checked against the mapping it names: a resolved range or an
// attached ring must lie wholly inside its region and a ring's header must match the attach.
// Run by scripts/fuzz.sh.
#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "edge/ring_attach.h"
#include "edge/shm_handover.h"
#include "edge/shm_region.h"
#include "smla/client/shm.h"
#include "smla/v1/step_ring.h"

namespace smla::fuzz {
namespace {

namespace edge = server::edge;
namespace ring = v1::ring;

constexpr uint64_t kRegionBytes = 64 << 10;
constexpr uint64_t kForeignBytes = 4 << 10;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "region fuzzer: %s\n", what);
  std::abort();
}

edge::OwnedFd Sealed(uint64_t bytes) {
  absl::StatusOr<int> fd = client::SealedMemfd("region-fuzz", bytes);
  if (!fd.ok()) Fail("cannot create a sealed memfd");
  return edge::OwnedFd(*fd);
}

// A memfd the box must refuse: unsealed, or sealed without F_SEAL_GROW.
edge::OwnedFd Unsealed(uint64_t bytes, int seals) {
  edge::OwnedFd fd(memfd_create("region-fuzz-bad", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid() || ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) Fail("memfd");
  if (seals != 0) fcntl(fd.get(), F_ADD_SEALS, seals);
  return fd;
}

struct World {
  edge::RegionRegistry registry;
  std::string mine, foreign;  // regions of tenant "t" and of tenant "u"
  uint8_t* data = nullptr;    // this process's mapping of `mine` (ring headers go here)
  edge::HandoverBox box;

  World() {
    edge::OwnedFd fd = Sealed(kRegionBytes);
    void* p = mmap(nullptr, kRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) Fail("mmap");
    data = static_cast<uint8_t*>(p);
    auto a = registry.Register("t", registry.NewSession(), std::move(fd), kRegionBytes, nullptr);
    auto b = registry.Register("u", registry.NewSession(), Sealed(kForeignBytes), kForeignBytes,
                               nullptr);
    if (!a.ok() || !b.ok()) Fail("register");
    mine = *a;
    foreign = *b;
  }
};

World& TheWorld() {
  static World* w = new World();
  return *w;
}

std::string PickTenant(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      return "t";
    case 1:
      return "u";
    default:
      return in.ConsumeRandomLengthString(16);
  }
}

std::string PickName(FuzzedDataProvider& in, const std::vector<std::string>& names) {
  const size_t i = in.ConsumeIntegralInRange<size_t>(0, names.size());
  return i < names.size() ? names[i] : in.ConsumeRandomLengthString(48);
}

// Mostly small or edge values, sometimes anything.
uint64_t PickU64(FuzzedDataProvider& in, uint64_t around) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      return in.ConsumeIntegralInRange<uint64_t>(0, around);
    case 1:
      return around - in.ConsumeIntegralInRange<uint64_t>(0, 128);
    case 2:
      return ~uint64_t{0} - in.ConsumeIntegralInRange<uint64_t>(0, 128);
    default:
      return in.ConsumeIntegral<uint64_t>();
  }
}

// The range must lie in the mapping `name` resolves to for `tenant`.
void CheckInside(const World& w, const std::string& tenant, const std::string& name,
                 const uint8_t* p, uint64_t size) {
  auto m = w.registry.Lookup(tenant, "check", name);
  if (!m.ok()) Fail("an OK answer for a region its tenant cannot look up");
  const uint8_t* lo = (*m)->data();
  if (p < lo || p > lo + (*m)->size() || size > static_cast<uint64_t>(lo + (*m)->size() - p)) {
    Fail("an OK range outside its region");
  }
}

void FuzzResolve(World& w, FuzzedDataProvider& in, const std::vector<std::string>& names) {
  const std::string tenant = PickTenant(in), name = PickName(in, names);
  const uint64_t offset = PickU64(in, kRegionBytes), size = PickU64(in, kRegionBytes);
  static constexpr uint64_t kAligns[] = {0, 1, 2, 4, 8, 64, 3};
  const uint64_t align = kAligns[in.ConsumeIntegralInRange<size_t>(0, std::size(kAligns) - 1)];
  absl::StatusOr<edge::RegionBytes> r = w.registry.Resolve(tenant, "q", name, offset, size, align);
  if (!r.ok()) return;
  if (align > 1 && offset % align != 0) Fail("an OK range at a misaligned offset");
  CheckInside(w, tenant, name, r->bytes.data(), r->bytes.size());
  if (r->bytes.size() != size) Fail("an OK range of another size");
}

void FuzzRingAttach(World& w, FuzzedDataProvider& in, const std::vector<std::string>& names) {
  v1::RingAttach attach;
  if (in.ConsumeBool()) {
    const std::string bytes = in.ConsumeRandomLengthString(256);
    if (!attach.ParseFromString(bytes)) return;
  } else {
    const uint32_t slots = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint32_t>(0, 300)
                                            : in.ConsumeIntegral<uint32_t>();
    const uint32_t slot_bytes = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint32_t>(0, 64) * 64
                                                 : in.ConsumeIntegral<uint32_t>();
    attach.set_slots(slots);
    attach.set_slot_bytes(slot_bytes);
    attach.mutable_ring()->set_region(PickName(in, names));
    attach.mutable_ring()->set_offset(in.ConsumeBool()
                                          ? in.ConsumeIntegralInRange<uint64_t>(0, 16) * 64
                                          : PickU64(in, kRegionBytes));
    attach.mutable_ring()->set_size(in.ConsumeBool() ? ring::RingBytes(slots, slot_bytes)
                                                     : PickU64(in, kRegionBytes));
  }
  // The header the client wrote: right for the attach, or fuzzed words (where a header can
  // be: the server refuses a misaligned ring before reading it).
  const uint64_t at = attach.ring().offset();
  if (at <= kRegionBytes - sizeof(ring::Header) && at % ring::kAlign == 0) {
    ring::Header* h = ring::HeaderAt(w.data + at);
    const bool right = in.ConsumeBool();
    h->magic = right ? ring::kMagic : in.ConsumeIntegral<uint32_t>();
    h->version = right ? ring::kVersion : in.ConsumeIntegral<uint32_t>();
    h->slots = right ? attach.slots() : in.ConsumeIntegral<uint32_t>();
    h->slot_bytes = right ? attach.slot_bytes() : in.ConsumeIntegral<uint32_t>();
  }
  const std::string tenant = PickTenant(in);
  absl::StatusOr<edge::RingPlace> place = edge::CheckRingAttach(&w.registry, tenant, attach);
  if (!place.ok()) return;
  if (place->slots < 1 || place->slots > ring::kMaxSlots ||
      place->slot_bytes < ring::kMinSlotBytes || place->slot_bytes > ring::kMaxSlotBytes) {
    Fail("an attached ring outside the slot bounds");
  }
  CheckInside(w, tenant, attach.ring().region(), place->ring,
              ring::RingBytes(place->slots, place->slot_bytes));
  const ring::Header* h = ring::HeaderAt(place->ring);
  if (h->magic != ring::kMagic || h->slots != place->slots || h->slot_bytes != place->slot_bytes) {
    Fail("an attached ring whose header does not match");
  }
}

// What one input registered, so it can be dropped at the end: (tenant, name).
using Registered = std::vector<std::pair<std::string, std::string>>;

void FuzzHandover(World& w, FuzzedDataProvider& in, std::vector<std::string>* names,
                  std::vector<std::string>* tokens, Registered* registered, absl::Time* now) {
  const uint64_t bytes = in.ConsumeIntegralInRange<uint64_t>(1, 16) * 4096;
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: {  // an offer, good or bad
      const int kind = in.ConsumeIntegralInRange<int>(0, 2);
      edge::OwnedFd fd = kind == 0   ? Sealed(bytes)
                         : kind == 1 ? Unsealed(bytes, 0)
                                     : Unsealed(bytes, F_SEAL_SHRINK | F_SEAL_SEAL);
      absl::StatusOr<std::string> token =
          w.box.Offer(std::move(fd), in.ConsumeIntegralInRange<uint32_t>(0, 3), *now);
      if (token.ok() && kind != 0) Fail("the box took an unsealed memfd");
      if (token.ok()) tokens->push_back(*token);
      return;
    }
    case 1: {  // a claim with a real or guessed token, registered with a fuzzed size
      const std::string token = PickName(in, *tokens);
      absl::StatusOr<edge::OwnedFd> fd = w.box.Claim(token, *now);
      if (!fd.ok()) return;
      if (w.box.Claim(token, *now).ok()) Fail("a token claimed twice");
      const uint64_t size = PickU64(in, 16 * 4096);
      const std::string tenant = PickTenant(in);
      auto name =
          w.registry.Register(tenant, w.registry.NewSession(), *std::move(fd), size, nullptr);
      if (name.ok()) {
        names->push_back(*name);
        registered->emplace_back(tenant, *name);
      }
      return;
    }
    case 2:  // time passes
      *now += absl::Seconds(in.ConsumeIntegralInRange<int>(0, 40));
      return;
    default: {  // an unregistration, of any name by any tenant
      const std::string name = PickName(in, *names);
      if (name == w.mine || name == w.foreign) return;
      w.registry.Unregister(PickTenant(in), name).IgnoreError();
      return;
    }
  }
}

}  // namespace
}  // namespace smla::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace smla::fuzz;
  World& w = TheWorld();
  FuzzedDataProvider in(data, size);
  std::vector<std::string> names = {w.mine, w.foreign}, tokens;
  Registered registered;
  absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  for (int op = 0; op < 32 && in.remaining_bytes() > 0; ++op) {
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
      case 0:
        FuzzResolve(w, in, names);
        break;
      case 1:
        FuzzRingAttach(w, in, names);
        break;
      default:
        FuzzHandover(w, in, &names, &tokens, &registered, &now);
        break;
    }
  }
  // Inputs do not depend on each other: drop what this one registered and left in the box.
  for (const auto& [tenant, name] : registered) w.registry.Unregister(tenant, name).IgnoreError();
  if (w.registry.size() != 2) Fail("a registration outlived its input");
  for (const std::string& t : tokens) w.box.Claim(t, now).IgnoreError();
  return 0;
}
