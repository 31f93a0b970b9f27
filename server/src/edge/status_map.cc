#include "status_map.h"

#include <string>

#include "smla/server/log_field.h"

namespace smla::server::edge {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering (google.rpc.Code), and an absl::Status
  // only ever holds canonical codes (others become UNKNOWN when constructed).
  return grpc::Status(
      static_cast<grpc::StatusCode>(status.code()),
      Bounded({status.message().data(), status.message().size()}, kMaxStatusMessageBytes));
}

}  // namespace smla::server::edge
