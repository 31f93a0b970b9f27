// A GPU region on the client side (docs/integration.md "GPU regions"): device memory of this
// process that a server on the same node reads step inputs from and writes outputs into, device
// to device. The client library links no GPU runtime: the caller allocates the memory and
// passes the bytes of its IPC handle (cudaIpcGetMemHandle / hipIpcGetMemHandle, or PyTorch's
// storage sharing), and keeps the allocation alive while the region lives.
//
// Steps name (region, offset, size) in it as in a shared-memory region; ShmRegion::PlaceInto
// lays a request out in a host mirror of the region, which the caller copies to the device
// before sending the step (the server reads the inputs when the step arrives).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "smla/client/client.h"
#include "smla/client/region_lease.h"

namespace smla::client {

class GpuRegion {
 public:
  // Registers the first `size` bytes of the allocation behind `ipc_handle` with the server
  // behind `client` (which must outlive the region). The server needs a GPU backend that
  // reaches this memory and --allow_shm.
  static absl::StatusOr<std::unique_ptr<GpuRegion>> Register(Client* client,
                                                             std::span<const uint8_t> ipc_handle,
                                                             uint64_t size);

  const std::string& name() const { return lease_->name(); }
  uint64_t size() const { return size_; }
  // Ends the registration; later steps naming the region fail with NOT_FOUND.
  absl::Status Unregister() { return lease_->Unregister(); }

 private:
  GpuRegion() = default;
  uint64_t size_ = 0;
  std::unique_ptr<RegionLease> lease_;
};

}  // namespace smla::client
