#include "status_map.h"

#include <string>

namespace smla::server::edge {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering (google.rpc.Code); anything outside it
  // is a bug in our code, reported as INTERNAL rather than passed through.
  const int code = static_cast<int>(status.code());
  if (code <= 0 || code > static_cast<int>(grpc::StatusCode::UNAUTHENTICATED)) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(status.message()));
  }
  return grpc::Status(static_cast<grpc::StatusCode>(code), std::string(status.message()));
}

}  // namespace smla::server::edge
