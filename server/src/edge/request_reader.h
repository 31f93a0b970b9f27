// Reads a serialized smla.v1.StepRequest straight from gRPC's receive buffer. Every field but
// the tensors' inline bytes is parsed by protobuf as usual; each Tensor's `inline_data` is not
// copied into the message but lands once, 64-byte aligned, in a staging buffer (host_staging.h)
// that the backend copies to the device from. The wire stays plain protobuf: a client that
// serializes with any protobuf library is read exactly as ParseFromString would read it
// (repeated messages appended, singular ones merged, the last oneof member and the last
// occurrence of a scalar winning).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "grpcpp/support/byte_buffer.h"
#include "smla/v1/parallel_copy.h"
#include "smla/v1/step.pb.h"
#include "smla/v1/tensor_bytes.h"

namespace smla::server::edge {

class StagingPool;
class StagingBuffer;

// Where each tensor's inline bytes landed. A tensor absent from `bytes` has none (an unset or
// empty inline_data, or a region reference).
struct LandedTensors {
  std::shared_ptr<StagingBuffer> buffer;  // holds every tensor's bytes; null when none
  absl::flat_hash_map<const v1::Tensor*, std::span<const uint8_t>> bytes;
  size_t total_bytes() const;  // staging bytes held
};

// Messages shorter than this are parsed by protobuf as a whole (smla/v1/tensor_bytes.h).
inline constexpr uint64_t kWalkFromBytes = v1::kWalkFromBytes;

// Parses `buffer` into `request` (which must be empty) and `landed`. A message protobuf could
// not parse is INVALID_ARGUMENT naming what is wrong; staging that the pool refuses is its
// RESOURCE_EXHAUSTED. `tenant` is charged for the staging (StagingPool::Lease). Messages
// shorter than `walk_from` are parsed by protobuf, their tensors left in the message. The
// tensors' bytes are copied by `copier` (null: on the caller's thread).
absl::Status ReadStepRequest(const grpc::ByteBuffer& buffer, StagingPool& pool,
                             v1::ParallelCopier* copier, const std::string& tenant,
                             v1::StepRequest* request, LandedTensors* landed,
                             uint64_t walk_from = kWalkFromBytes);

}  // namespace smla::server::edge
