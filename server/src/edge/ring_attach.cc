#include "ring_attach.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "smla/server/log_field.h"
#include "smla/v1/step_ring.h"

namespace smla::server::edge {
namespace ring = v1::ring;

absl::StatusOr<RingPlace> CheckRingAttach(const RegionRegistry* registry, const std::string& tenant,
                                          const v1::RingAttach& attach) {
  if (registry == nullptr) {
    return absl::FailedPreconditionError(
        "ring_attach: shared-memory regions are not enabled on this server (start it with "
        "--allow_shm)");
  }
  const uint32_t slots = attach.slots(), slot_bytes = attach.slot_bytes();
  if (slots < 1 || slots > ring::kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring_attach.slots: ", slots, " is outside 1..", ring::kMaxSlots));
  }
  if (slot_bytes < ring::kMinSlotBytes || slot_bytes > ring::kMaxSlotBytes ||
      slot_bytes % ring::kAlign != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ring_attach.slot_bytes: ", slot_bytes,
                                                   " is not a multiple of ", ring::kAlign, " in ",
                                                   ring::kMinSlotBytes, "..", ring::kMaxSlotBytes));
  }
  const v1::RegionRef& ref = attach.ring();
  const uint64_t need = ring::RingBytes(slots, slot_bytes);
  if (ref.size() != need) {
    return absl::InvalidArgumentError(absl::StrCat("ring_attach.ring: size ", ref.size(),
                                                   ", a ring of ", slots, " slots of ", slot_bytes,
                                                   " bytes takes ", need));
  }
  absl::StatusOr<std::shared_ptr<ShmMapping>> mapping =
      registry->Lookup(tenant, "ring_attach.ring", ref.region());
  if (!mapping.ok()) return mapping.status();
  if ((*mapping)->on_device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring_attach.ring: region ", LogField(ref.region()),
        " is GPU memory; a ring lies in a shared-memory region (the server polls it)"));
  }
  // Slice checks the bounds and the offset's alignment to ring::kAlign.
  absl::StatusOr<std::span<uint8_t>> bytes = RegionRegistry::Slice(
      **mapping, "ring_attach.ring", ref.region(), ref.offset(), ref.size(), ring::kAlign);
  if (!bytes.ok()) return bytes.status();
  const ring::Header* h = ring::HeaderAt(bytes->data());
  const uint32_t magic = ring::Load(h->magic), version = ring::Load(h->version);
  const uint32_t h_slots = ring::Load(h->slots), h_slot_bytes = ring::Load(h->slot_bytes);
  if (magic != ring::kMagic || version != ring::kVersion || h_slots != slots ||
      h_slot_bytes != slot_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ring_attach.ring: the ring's header (magic 0x%08x, version %u, %u slots of %u bytes) is "
        "not a version %u ring of %u slots of %u bytes",
        magic, version, h_slots, h_slot_bytes, ring::kVersion, slots, slot_bytes));
  }
  return RingPlace{*std::move(mapping), bytes->data(), slots, slot_bytes};
}

}  // namespace smla::server::edge
