// The one place where an absl::Status becomes a gRPC status (docs/architecture.md: errors travel as
// absl::Status inside the process; the edge alone speaks gRPC codes).
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace smla::server::edge {

// The longest status message a client is sent, in bytes. gRPC carries the message in a
// trailer, percent-encoding bytes outside printable ASCII (up to 3x), under a metadata limit
// of 8 KiB by default: past it the client sees RESOURCE_EXHAUSTED instead of the real status.
inline constexpr size_t kMaxStatusMessageBytes = 1024;

// Same code; the message cut to kMaxStatusMessageBytes (log_field.h's Bounded).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace smla::server::edge
