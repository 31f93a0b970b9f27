// RegisterRegion / UnregisterRegion of smla.v1.Smla: a region lives as long as its registering
// call stays open, so a client that goes away (cancel, closed channel) cannot leave mappings
// behind.
#include <memory>
#include <span>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "smla_service.h"

namespace smla::server::edge {
namespace {

absl::Status RegionsDisabled() {
  return absl::FailedPreconditionError(
      "shared-memory regions are not enabled on this server (start it with --allow_shm)");
}

// Who may finish the call: the registry (unregister, shutdown), a cancel, or a failed write.
// Whoever sets `finishing` first calls Finish; OnDone only follows Finish, so the reactor is
// alive until then.
struct LeaseState {
  absl::Mutex mu;
  grpc::ServerWriteReactor<v1::RegisterRegionResponse>* reactor = nullptr;  // set once, first
  bool write_pending ABSL_GUARDED_BY(mu) = false;
  bool end_requested ABSL_GUARDED_BY(mu) = false;
  bool finishing ABSL_GUARDED_BY(mu) = false;
};

class RegionLeaseReactor final : public grpc::ServerWriteReactor<v1::RegisterRegionResponse> {
 public:
  RegionLeaseReactor(SmlaService* service, const grpc::CallbackServerContext& ctx,
                     const v1::RegisterRegionRequest* request)
      : service_(service), state_(std::make_shared<LeaseState>()) {
    state_->reactor = this;
    RegionRegistry* regions = service_->regions();
    if (regions == nullptr) {
      FinishOnce(RegionsDisabled());
      return;
    }
    absl::StatusOr<std::string> tenant = service_->TenantOf(ctx);
    if (!tenant.ok()) {
      FinishOnce(tenant.status());
      return;
    }
    session_ = regions->NewSession();
    // The registry ends the call on unregister or shutdown; the state outlives the reactor.
    auto end = [state = state_] {
      bool finish = false;
      {
        absl::MutexLock lock(&state->mu);
        if (state->finishing) return;
        if (state->write_pending) {
          state->end_requested = true;
        } else {
          state->finishing = true;
          finish = true;
        }
      }
      if (finish) state->reactor->Finish(grpc::Status::OK);
    };
    absl::StatusOr<std::string> name = Claim(*request, *tenant, std::move(end));
    if (!name.ok()) {
      FinishOnce(name.status());
      return;
    }
    response_.set_name(*name);
    response_.set_size(request->size());
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->finishing) return;
      state_->write_pending = true;
    }
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    {
      absl::MutexLock lock(&state_->mu);
      state_->write_pending = false;
      if (!state_->finishing && (!ok || state_->end_requested)) {
        state_->finishing = true;
        finish = true;
      }
    }
    if (finish) {
      DropSession();
      Finish(grpc::Status::OK);
    }
  }

  void OnCancel() override {
    DropSession();
    bool finish = false;
    {
      absl::MutexLock lock(&state_->mu);
      if (!state_->finishing && !state_->write_pending) {
        state_->finishing = true;
        finish = true;
      } else if (!state_->finishing) {
        state_->end_requested = true;  // OnWriteDone finishes
      }
    }
    if (finish) Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    DropSession();
    delete this;
  }

 private:
  void FinishOnce(const absl::Status& st) {
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->finishing) return;
      state_->finishing = true;
    }
    Finish(service_->Finished("RegisterRegion", "", st));
  }

  // Takes the handed-over memfd, or opens the GPU memory, and registers it; returns the
  // region's name.
  absl::StatusOr<std::string> Claim(const v1::RegisterRegionRequest& request,
                                    const std::string& tenant, RegionRegistry::EndSession end) {
    if (!request.gpu_handle().empty()) return ClaimGpu(request, tenant, std::move(end));
    if (!request.name().empty()) {
      return absl::InvalidArgumentError(
          "name: regions are not registered by name; hand a sealed memfd over on "
          "ServerInfo.shm_socket and send its token in handover (the server names the region)");
    }
    absl::StatusOr<OwnedFd> object = service_->handover()->Claim(request.handover(), absl::Now());
    if (!object.ok()) return object.status();
    return service_->regions()->Register(tenant, session_, *std::move(object), request.size(),
                                         std::move(end));
  }

  absl::StatusOr<std::string> ClaimGpu(const v1::RegisterRegionRequest& request,
                                       const std::string& tenant, RegionRegistry::EndSession end) {
    if (!request.name().empty() || !request.handover().empty()) {
      return absl::InvalidArgumentError(
          "gpu_handle: a GPU region names neither a region name nor a handover token");
    }
    if (request.size() == 0) return absl::InvalidArgumentError("size: 0");
    const std::string& h = request.gpu_handle();
    absl::StatusOr<std::shared_ptr<const GpuMemory>> memory = service_->core()->OpenGpuMemory(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(h.data()), h.size()),
        request.size());
    if (!memory.ok()) return memory.status();
    uint8_t* const data = (*memory)->data;
    return service_->regions()->RegisterDevice(tenant, session_, data, request.size(),
                                               *std::move(memory), std::move(end));
  }

  void DropSession() {
    if (session_ != 0 && service_->regions() != nullptr) service_->regions()->DropSession(session_);
  }

  SmlaService* const service_;
  const std::shared_ptr<LeaseState> state_;
  uint64_t session_ = 0;
  v1::RegisterRegionResponse response_;
};

}  // namespace

grpc::ServerWriteReactor<v1::RegisterRegionResponse>* SmlaService::RegisterRegion(
    grpc::CallbackServerContext* ctx, const v1::RegisterRegionRequest* request) {
  return new RegionLeaseReactor(this, *ctx, request);
}

grpc::ServerUnaryReactor* SmlaService::UnregisterRegion(grpc::CallbackServerContext* ctx,
                                                        const v1::UnregisterRegionRequest* request,
                                                        v1::UnregisterRegionResponse*) {
  absl::StatusOr<std::string> tenant = TenantOf(*ctx);
  if (!tenant.ok()) return Reply(ctx, "UnregisterRegion", tenant.status());
  const absl::Status st =
      regions_ == nullptr ? RegionsDisabled() : regions_->Unregister(*tenant, request->name());
  return Reply(ctx, "UnregisterRegion", st);
}

}  // namespace smla::server::edge
