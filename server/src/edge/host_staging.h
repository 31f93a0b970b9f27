// Reusable host buffers for a step's inline tensors. A request's tensor bytes land here once,
// straight from gRPC's receive buffers; outputs come back from the device into here and are sent
// from here (gRPC slices that reference the buffer). Buffers are page-locked for the backend's
// copies where it can, and are kept for reuse, so a steady stream of steps maps and faults in
// no fresh memory (docs/architecture.md, "The inline data path").
//
// Thread-safe. Buffers keep the pool's state alive, so a buffer may outlive the pool object
// (a slice still queued in gRPC when the server stops).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "shm_region.h"

namespace smla::server::edge {

class StagingBuffer;

class StagingPool {
 public:
  struct Options {
    // Bytes leased at once, server-wide; past it Lease is RESOURCE_EXHAUSTED.
    uint64_t max_bytes = uint64_t{4} << 30;
    // Bytes one tenant may hold leased at once (its streams and unary calls together).
    uint64_t max_tenant_bytes = uint64_t{2} << 30;
    // Free buffers kept for reuse; beyond this they are unmapped.
    uint64_t max_cached_bytes = uint64_t{1} << 30;
  };

  // `pinning` page-locks each new buffer once (a pin that fails only costs copy speed).
  StagingPool(HostPinning pinning, Options options);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A buffer of at least `bytes` (64-byte aligned, contents unspecified), charged to `tenant`
  // until it is returned. Sizes round up to a power of two of at least 64 KiB, so reuse finds a
  // fit. RESOURCE_EXHAUSTED, naming the limit, past the server's or the tenant's bytes.
  absl::StatusOr<std::shared_ptr<StagingBuffer>> Lease(size_t bytes, const std::string& tenant);

  uint64_t bytes_leased() const;
  uint64_t tenant_bytes_leased(const std::string& tenant) const;
  uint64_t bytes_cached() const;
  // Buffers mapped since start (tests: a steady load maps none after warm-up).
  uint64_t buffers_mapped() const;

  struct State;  // shared with the buffers (host_staging.cc)

 private:
  std::shared_ptr<State> state_;
};

// One leased buffer; returned to its pool when the last reference goes.
class StagingBuffer {
 public:
  StagingBuffer(std::shared_ptr<StagingPool::State> pool, uint8_t* data, size_t size,
                std::string tenant)
      : pool_(std::move(pool)), data_(data), size_(size), tenant_(std::move(tenant)) {}
  ~StagingBuffer();
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::shared_ptr<StagingPool::State> pool_;
  uint8_t* const data_;
  const size_t size_;
  const std::string tenant_;
};

}  // namespace smla::server::edge
