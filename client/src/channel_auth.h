// The client's channel: plaintext or TLS / mTLS from PEM files, and a bearer token attached to
// every call made on it (by an interceptor, so plaintext channels and raw stubs carry it too).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "smla/client/client.h"

namespace smla::client {

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ClientOptions& options,
                                                           const grpc::ChannelArguments& args);

}  // namespace smla::client
