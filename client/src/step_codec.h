// The client's side of the inline data path (docs/performance.md, "The inline data path"):
// a StepRequest is serialized with its tensors' bytes left where the message holds them (gRPC
// slices that reference the message's strings, kept alive by the caller's shared pointer), and a
// large StepResponse is parsed with its tensors' bytes copied once, over a few threads, into the
// message. The wire is plain smla.v1 protobuf either way.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "grpcpp/support/byte_buffer.h"
#include "smla/v1/parallel_copy.h"
#include "smla/v1/step.pb.h"

namespace smla::client {

// `request` serialized; tensor bytes longer than a few KiB are not copied but referenced, and
// `request` is kept alive until gRPC lets go of them. It must not change meanwhile.
grpc::ByteBuffer EncodeStepRequest(std::shared_ptr<const v1::StepRequest> request);

// Parses `buffer` into `response` (cleared first). Messages past a few hundred KiB are parsed
// without their tensors' bytes, which `copier` then copies into the message (null: on this
// thread), reusing the strings of the tensors `response` held: a caller that decodes into one
// response object call after call (without clearing it in between) has its output bytes
// overwritten in place rather than zeroed and written. INVALID_ARGUMENT when protobuf could not
// parse the bytes.
absl::Status DecodeStepResponse(const grpc::ByteBuffer& buffer, v1::ParallelCopier* copier,
                                v1::StepResponse* response);

}  // namespace smla::client
