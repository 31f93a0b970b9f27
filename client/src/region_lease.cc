#include "smla/client/region_lease.h"

#include "absl/strings/str_cat.h"
#include "smla/base/status_macros.h"

namespace smla::client {

absl::StatusOr<std::unique_ptr<RegionLease>> RegionLease::Open(
    Client* client, const v1::RegisterRegionRequest& request) {
  std::unique_ptr<RegionLease> lease(new RegionLease());
  lease->client_ = client;
  lease->context_ = std::make_unique<grpc::ClientContext>();
  lease->call_ = client->stub()->RegisterRegion(lease->context_.get(), request);
  // The first message is the ack; the call then stays open until the region ends.
  v1::RegisterRegionResponse ack;
  if (!lease->call_->Read(&ack)) {
    absl::Status st = FromGrpcStatus(lease->call_->Finish());
    lease->call_.reset();
    return st.ok() ? absl::UnavailableError("RegisterRegion ended without an answer") : st;
  }
  lease->name_ = ack.name();
  return lease;
}

absl::Status RegionLease::Unregister() {
  if (!call_) return absl::FailedPreconditionError(absl::StrCat(name_, ": not registered"));
  grpc::ClientContext ctx;
  v1::UnregisterRegionRequest req;
  req.set_name(name_);
  v1::UnregisterRegionResponse resp;
  SMLA_RETURN_IF_ERROR(FromGrpcStatus(client_->stub()->UnregisterRegion(&ctx, req, &resp)));
  v1::RegisterRegionResponse more;
  while (call_->Read(&more)) {
  }
  absl::Status st = FromGrpcStatus(call_->Finish());
  call_.reset();
  return st;
}

RegionLease::~RegionLease() {
  if (!call_) return;
  context_->TryCancel();
  v1::RegisterRegionResponse more;
  while (call_->Read(&more)) {
  }
  call_->Finish().ok();
}

}  // namespace smla::client
