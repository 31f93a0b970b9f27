// The checks of a StepRequest.ring_attach (smla/v1/step_ring.h), apart from the ring that
// serves it, so the fuzzer can drive them: regions allowed, the tenant's region, bounds,
// alignment, slot count and size, and the header the client wrote.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "shm_region.h"
#include "smla/v1/step.pb.h"

namespace smla::server::edge {

struct RingPlace {
  std::shared_ptr<ShmMapping> mapping;  // keeps `ring` mapped
  uint8_t* ring = nullptr;
  uint32_t slots = 0;
  uint32_t slot_bytes = 0;
};

// `registry` null: regions are off (FAILED_PRECONDITION).
absl::StatusOr<RingPlace> CheckRingAttach(const RegionRegistry* registry, const std::string& tenant,
                                          const v1::RingAttach& attach);

}  // namespace smla::server::edge
