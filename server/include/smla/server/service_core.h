// The service without its transport: model profiles, KV store, scheduler and backend behind
// one thread-safe object. The gRPC edge (and tests) call it; it never speaks gRPC.
//
// Ownership: the core owns the backend, the pools and the scheduler thread(s). Step inputs are
// borrowed until the callback runs; the callback runs exactly once, on a scheduler thread or
// inline for requests rejected at admission.
//
// Tenants: a sequence is keyed by (tenant, model, sequence id). Naming a sequence of another
// tenant is answered exactly like naming one that does not exist (NOT_FOUND), so a tenant can
// learn nothing about another's sequences; two tenants may use the same id independently.
//
// When errors are found: Submit checks the model, layer, shapes, sizes, positions, top-k
// visibility, finiteness of KV rows, sinks and RoPE table at admission (the callback runs
// inline). Checks against stored state (sequence exists for the tenant, no gap after the stored
// length, the sliding window still kept, pool capacity) run when the step is launched, in queue
// order, so a frontend may pipeline steps of one sequence. Either way a failed step changes
// nothing. After a backend failure (INTERNAL) the core is unhealthy and refuses new steps
// with UNAVAILABLE.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "smla/kernels/backend.h"
#include "smla/server/config.h"
#include "smla/server/step.h"

namespace smla::server {

struct PoolUsage {
  std::string model;
  int64_t pages_total = 0;
  int64_t pages_used = 0;
  int64_t page_bytes = 0;
};

struct ServerInfo {
  kernels::DeviceInfo device;
  std::vector<ModelConfig> models;  // what is loaded, resolved (heads per rank, formats, ...)
  std::vector<PoolUsage> pools;
  int64_t sequences = 0;
};

// Counters the metrics endpoint reads; cumulative since start.
struct CoreStats {
  int64_t batches = 0;
  int64_t batched_requests = 0;  // sum over batches of the requests in each
  int64_t rows = 0;
  int64_t queue_depth = 0;  // requests waiting now
};

// Device memory opened for a GPU region (ServiceCore::OpenGpuMemory); `data` is a device address.
struct GpuMemory {
  uint8_t* data = nullptr;
  size_t size = 0;
};

class ServiceCore {
 public:
  virtual ~ServiceCore() = default;

  // Allocates the pools and warms the backend; the core is ready when this returns OK.
  static absl::StatusOr<std::unique_ptr<ServiceCore>> Create(
      const ServerConfig& config, std::unique_ptr<kernels::Backend> backend);

  virtual ServerInfo Info() const = 0;
  virtual CoreStats Stats() const = 0;

  virtual absl::Status CreateSequence(const std::string& tenant, const std::string& model,
                                      const std::string& sequence_id) = 0;
  virtual absl::Status ReleaseSequence(const std::string& tenant, const std::string& model,
                                       const std::string& sequence_id) = 0;
  // Drops positions >= length on every layer (and compressed entries that depended on them).
  // FAILED_PRECONDITION when a sliding-window layer no longer keeps the W - 1 positions before
  // `length` (see ModelConfig::swa_rollback); 0 is always allowed. Waits for a running batch.
  virtual absl::Status TruncateSequence(const std::string& tenant, const std::string& model,
                                        const std::string& sequence_id, int64_t length) = 0;
  // Current stored length (positions) of a sequence on a layer.
  virtual absl::StatusOr<int64_t> SequenceLength(const std::string& tenant,
                                                 const std::string& model,
                                                 const std::string& sequence_id,
                                                 int32_t layer) const = 0;

  // The frontend's cos/sin table for inverse RoPE: [P, 64] f32 (cos 0..31, sin 32..63).
  virtual absl::Status SetRopeTable(const std::string& model, std::span<const float> cos_sin,
                                    int32_t num_positions) = 0;

  // Per-head attention sinks of every layer, [layers, heads_per_rank] f32 natural-log units
  // (the rank's slice of the model's learned sink weights). Profiles with sinks refuse steps
  // (FAILED_PRECONDITION) until these are uploaded.
  virtual absl::Status SetSinks(const std::string& model, std::span<const float> sinks) = 0;

  // Validates, admits (RESOURCE_EXHAUSTED when the queue is full), and later runs the step in
  // a batch; `done` gets the result or the error. A failed step changes nothing.
  virtual void Submit(StepRequest request, StepCallback done) = 0;

  // Stops admitting (UNAVAILABLE), finishes what is queued, then returns.
  virtual void Drain() = 0;
  // False after a backend failure: health turns NOT_SERVING.
  virtual bool Healthy() const = 0;

  // Host memory that steps will read and write in place (shared-memory regions); see
  // kernels::Backend::RegisterHostMemory. Unregister before unmapping.
  virtual absl::Status RegisterHostMemory(void* /*data*/, size_t /*bytes*/) {
    return absl::OkStatus();
  }
  virtual void UnregisterHostMemory(void* /*data*/) {}

  // A GPU region: device memory another process on this node exported (`handle`, an IPC memory
  // handle; kernels::Backend::OpenIpcMemory), its first `bytes` bytes, which steps then read and
  // write device to device. Open while the returned object lives. UNIMPLEMENTED on a backend
  // without device memory; INVALID_ARGUMENT for a handle that cannot be opened or is too short.
  virtual absl::StatusOr<std::shared_ptr<const GpuMemory>> OpenGpuMemory(
      std::span<const uint8_t> /*handle*/, size_t /*bytes*/) {
    return absl::UnimplementedError(
        "GPU regions need a GPU backend; this server runs the CPU backend");
  }
};

}  // namespace smla::server
