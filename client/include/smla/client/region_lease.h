// A region's registration (RegisterRegion, a server-streaming call the client holds open): the
// server answers the region's name and keeps the region while the call lives. Shared by the
// shared-memory and GPU regions.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "smla/client/client.h"
#include "smla/v1/service.grpc.pb.h"

namespace smla::client {

class RegionLease {
 public:
  // Sends `request` and waits for the server's answer (the region's name).
  static absl::StatusOr<std::unique_ptr<RegionLease>> Open(
      Client* client, const v1::RegisterRegionRequest& request);
  // Cancels the call if it is still open: the server drops the region.
  ~RegionLease();
  RegionLease(const RegionLease&) = delete;
  RegionLease& operator=(const RegionLease&) = delete;

  const std::string& name() const { return name_; }
  // Ends the registration; later steps naming the region fail with NOT_FOUND.
  absl::Status Unregister();

 private:
  RegionLease() = default;
  Client* client_ = nullptr;
  std::string name_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReader<v1::RegisterRegionResponse>> call_;
};

}  // namespace smla::client
