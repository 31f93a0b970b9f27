// The client side of a step ring (smla/v1/step_ring.h): a request ring in a registered region,
// attached to a StepStream, through which steps go without a gRPC round trip. A step on the
// ring is a StepRequest whose tensors (inputs and outputs) name regions, e.g. one placed with
// ShmRegion::Place(..., Layout::kPacked); it travels serialized in a slot, and its response
// comes back in the same slot.
//
// The stream is the ring's session: the server serves the ring until the stream ends (writes
// done, cancel, disconnect, server shutdown); then waits answer UNAVAILABLE. The stream, the
// region and the ring's bytes must outlive the StepRing. One thread at a time per StepRing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "smla/client/client.h"
#include "smla/client/shm.h"
#include "smla/v1/step.pb.h"

namespace smla::client {

class StepRing {
 public:
  // Waits spin this long for a response before sleeping on the slot's futex word, unless
  // set_spin says otherwise (a caller with a core to spare trades it for the wake-up latency).
  static constexpr absl::Duration kSpin = absl::Microseconds(30);

  // Bytes a ring of `slots` slots of `slot_bytes` takes in a region (64-byte aligned start).
  static uint64_t BytesFor(uint32_t slots, uint32_t slot_bytes);

  // Lays a ring out at `offset` (a multiple of 64) of `region` and attaches it to `stream`:
  // sends the ring_attach request and reads its response, so the stream must have no other
  // request outstanding. The server's refusal comes back as its status.
  static absl::StatusOr<std::unique_ptr<StepRing>> Attach(StepStream* stream, ShmRegion* region,
                                                          uint64_t offset, uint32_t slots,
                                                          uint32_t slot_bytes);
  // The same on any mapping at `data` that the server knows as `region_name`.
  static absl::StatusOr<std::unique_ptr<StepRing>> AttachAt(StepStream* stream, uint8_t* data,
                                                            const std::string& region_name,
                                                            uint64_t offset, uint32_t slots,
                                                            uint32_t slot_bytes);

  // Writes `request` into the next slot and wakes the server; returns its ticket for Wait.
  // RESOURCE_EXHAUSTED when that slot's previous step is unanswered (more than `slots` in
  // flight), INVALID_ARGUMENT when the request does not fit a slot.
  absl::StatusOr<uint64_t> Submit(const v1::StepRequest& request);
  // Waits for the response to `ticket` (spin, then futex); the step's own outcome is
  // response->code(). DEADLINE_EXCEEDED after `timeout`; UNAVAILABLE once the server has
  // closed the ring; DATA_LOSS when the response bytes do not parse.
  absl::Status Wait(uint64_t ticket, v1::StepResponse* response,
                    absl::Duration timeout = absl::Seconds(60));
  // Submit and Wait.
  absl::Status Call(const v1::StepRequest& request, v1::StepResponse* response,
                    absl::Duration timeout = absl::Seconds(60));

  // The ring's bytes (tests inspect and corrupt them).
  uint8_t* ring() const { return ring_; }
  uint32_t slots() const { return slots_; }
  uint32_t slot_bytes() const { return slot_bytes_; }
  // The number the next Submit gets.
  uint64_t next_ticket() const { return next_; }
  void set_spin(absl::Duration spin) { spin_ = spin; }

 private:
  StepRing(uint8_t* ring, uint32_t slots, uint32_t slot_bytes)
      : ring_(ring), slots_(slots), slot_bytes_(slot_bytes) {}
  uint8_t* const ring_;
  const uint32_t slots_;
  const uint32_t slot_bytes_;
  uint64_t next_ = 1;
  absl::Duration spin_ = kSpin;
};

}  // namespace smla::client
