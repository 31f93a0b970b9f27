#include "smla/client/gpu_region.h"

#include "smla/base/status_macros.h"

namespace smla::client {

absl::StatusOr<std::unique_ptr<GpuRegion>> GpuRegion::Register(Client* client,
                                                               std::span<const uint8_t> ipc_handle,
                                                               uint64_t size) {
  v1::RegisterRegionRequest req;
  req.set_size(size);
  req.set_gpu_handle(
      std::string(reinterpret_cast<const char*>(ipc_handle.data()), ipc_handle.size()));
  std::unique_ptr<GpuRegion> r(new GpuRegion());
  r->size_ = size;
  SMLA_ASSIGN_OR_RETURN(r->lease_, RegionLease::Open(client, req));
  return r;
}

}  // namespace smla::client
