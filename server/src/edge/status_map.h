// The one place where an absl::Status becomes a gRPC status (service.md: errors travel as
// absl::Status inside the process; the edge alone speaks gRPC codes).
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace smla::server::edge {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace smla::server::edge
