#include "smla/client/step_ring.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "smla/base/status_macros.h"
#include "smla/v1/step_ring.h"

namespace smla::client {
namespace ring = v1::ring;

uint64_t StepRing::BytesFor(uint32_t slots, uint32_t slot_bytes) {
  return ring::RingBytes(slots, slot_bytes);
}

absl::StatusOr<std::unique_ptr<StepRing>> StepRing::Attach(StepStream* stream, ShmRegion* region,
                                                           uint64_t offset, uint32_t slots,
                                                           uint32_t slot_bytes) {
  const uint64_t bytes = BytesFor(slots, slot_bytes);
  if (offset > region->size() || bytes > region->size() - offset) {
    return absl::OutOfRangeError(absl::StrCat("region ", region->name(), " of ", region->size(),
                                              " bytes is too small for a ring of ", bytes,
                                              " bytes at offset ", offset));
  }
  return AttachAt(stream, region->data(), region->name(), offset, slots, slot_bytes);
}

absl::StatusOr<std::unique_ptr<StepRing>> StepRing::AttachAt(StepStream* stream, uint8_t* data,
                                                             const std::string& region_name,
                                                             uint64_t offset, uint32_t slots,
                                                             uint32_t slot_bytes) {
  uint8_t* at = data + offset;
  const uint64_t bytes = BytesFor(slots, slot_bytes);
  // Only the headers need zeros; slot data is written before it is read, so a large ring's
  // memory is only touched as its slots are used.
  std::memset(at, 0, sizeof(ring::Header));
  for (uint32_t i = 0; i < slots; ++i) {
    std::memset(ring::SlotAt(at, slot_bytes, i), 0, sizeof(ring::SlotHeader));
  }
  ring::Header* h = ring::HeaderAt(at);
  h->magic = ring::kMagic;
  h->version = ring::kVersion;
  h->slots = slots;
  h->slot_bytes = slot_bytes;
  std::atomic_thread_fence(std::memory_order_release);
  v1::StepRequest attach;
  v1::RingAttach* a = attach.mutable_ring_attach();
  a->mutable_ring()->set_region(region_name);
  a->mutable_ring()->set_offset(offset);
  a->mutable_ring()->set_size(bytes);
  a->set_slots(slots);
  a->set_slot_bytes(slot_bytes);
  v1::StepResponse resp;
  if (!stream->Write(attach) || !stream->Read(&resp)) {
    absl::Status st = stream->Finish();
    return st.ok() ? absl::UnavailableError("step stream ended") : st;
  }
  if (resp.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(resp.code()), resp.message());
  }
  return std::unique_ptr<StepRing>(new StepRing(at, slots, slot_bytes));
}

absl::StatusOr<uint64_t> StepRing::Submit(const v1::StepRequest& request) {
  const uint64_t n = next_;
  const uint32_t index = static_cast<uint32_t>((n - 1) % slots_);
  ring::SlotHeader* s = ring::SlotAt(ring_, slot_bytes_, index);
  // The slot is free once the request `slots` before this one (none at first) is answered.
  const uint32_t previous = n > slots_ ? static_cast<uint32_t>(n - slots_) : 0;
  if (ring::Load(s->response_seq) != previous) {
    return absl::ResourceExhaustedError(
        absl::StrCat("step ring: slot ", index, " still holds an unanswered step"));
  }
  const size_t len = request.ByteSizeLong();
  if (len > slot_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ring: the request takes ", len, " bytes, a slot holds ", slot_bytes_));
  }
  request.SerializeWithCachedSizesToArray(ring::SlotData(s));
  ring::Store(s->request_bytes, static_cast<uint32_t>(len), std::memory_order_relaxed);
  ring::Store(s->request_seq, static_cast<uint32_t>(n), std::memory_order_release);
  ring::Header* h = ring::HeaderAt(ring_);
  std::atomic_ref<uint32_t>(h->doorbell).fetch_add(1, std::memory_order_seq_cst);
  if (ring::Load(h->server_sleeping, std::memory_order_seq_cst) != 0) {
    ring::FutexWakeAll(&h->doorbell);
  }
  next_ = n + 1;
  return n;
}

absl::Status StepRing::Wait(uint64_t ticket, v1::StepResponse* response, absl::Duration timeout) {
  const uint32_t index = static_cast<uint32_t>((ticket - 1) % slots_);
  const uint32_t seq = static_cast<uint32_t>(ticket);
  ring::SlotHeader* s = ring::SlotAt(ring_, slot_bytes_, index);
  const ring::Header* h = ring::HeaderAt(ring_);
  const absl::Time start = absl::Now();
  const absl::Time spin_until = start + spin_, deadline = start + timeout;
  auto answered = [&] { return ring::Load(s->response_seq) == seq; };
  while (!answered()) {
    const absl::Time now = absl::Now();
    if (ring::Load(h->closed) != 0) {
      if (answered()) break;
      return absl::UnavailableError("step ring: the server closed the ring (its stream ended)");
    }
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("step ring: no response to step ", ticket,
                                                      " within ", absl::FormatDuration(timeout)));
    }
    if (now < spin_until) {
      for (int i = 0; i < 16; ++i) v1::CpuRelax();
      continue;
    }
    const uint32_t seen = ring::Load(s->response_seq);
    ring::Store(s->client_waiting, 1, std::memory_order_seq_cst);
    if (ring::Load(s->response_seq, std::memory_order_seq_cst) == seen && !answered() &&
        ring::Load(h->closed) == 0) {
      // In slices: the server's close wakes without changing response_seq, so a wake that
      // comes just before the sleep is noticed at the next slice.
      const int64_t left = absl::ToInt64Nanoseconds(deadline - absl::Now());
      if (left > 0) ring::FutexWait(&s->response_seq, seen, std::min<int64_t>(left, 50'000'000));
    }
    ring::Store(s->client_waiting, 0, std::memory_order_relaxed);
  }
  const uint32_t len = ring::Load(s->response_bytes, std::memory_order_relaxed);
  if (len > slot_bytes_ || !response->ParseFromArray(ring::SlotData(s), static_cast<int>(len))) {
    return absl::DataLossError(absl::StrCat("step ring: slot ", index, " holds no valid response"));
  }
  return absl::OkStatus();
}

absl::Status StepRing::Call(const v1::StepRequest& request, v1::StepResponse* response,
                            absl::Duration timeout) {
  SMLA_ASSIGN_OR_RETURN(uint64_t ticket, Submit(request));
  return Wait(ticket, response, timeout);
}

}  // namespace smla::client
