// Serializes a StepResponse whose outputs lie in a staging buffer (host_staging.h) without
// copying them: protobuf serializes the message without those bytes, and each output's bytes
// follow as a gRPC slice that references the buffer, which stays leased until gRPC has sent
// it. The bytes on the wire are a plain smla.v1.StepResponse.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "grpcpp/support/byte_buffer.h"
#include "smla/v1/step.pb.h"

namespace smla::server::edge {

class StagingBuffer;

// A step's outputs in staging (each span empty when not staged).
struct StagedOutputs {
  std::shared_ptr<StagingBuffer> buffer;  // null: nothing staged
  std::span<uint8_t> out;
  std::span<uint8_t> mx_scales;
  std::span<uint8_t> lse;
};

// Writes `response` to `bytes`. Each of out, mx_scales and lse that `response` has (with dtype
// and shape, no data) and `staged` holds is sent with the staged bytes as its inline data;
// `response` loses those fields.
void SerializeStepResponse(v1::StepResponse* response, const StagedOutputs& staged,
                           grpc::ByteBuffer* bytes);

}  // namespace smla::server::edge
