// Device memory for smla-bench's GPU-region transports (--transport gpu, gpu_ring): an
// allocation on this process's GPU, its IPC handle for GpuRegion::Register, and uploads. Only a
// CUDA or HIP build of smla-bench has a runtime to allocate it; elsewhere Create says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace smla::bench {

class DeviceMemory {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceMemory>> Create(size_t bytes);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  std::span<const uint8_t> ipc_handle() const { return handle_; }
  size_t size() const { return bytes_; }
  // Copies `host` to the start of the allocation and waits.
  absl::Status Upload(std::span<const uint8_t> host);

 private:
  DeviceMemory() = default;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::vector<uint8_t> handle_;
};

}  // namespace smla::bench
