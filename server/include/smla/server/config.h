// Server configuration: which model profiles are served, at what TP degree and with which
// pool formats and sizes, and the limits of the scheduler and the edge.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "smla/kernels/backend.h"
#include "smla/kernels/formats.h"

namespace smla::server {

// One served model (a profile of smla/models/profile.h at a TP degree), resolved.
struct ModelConfig {
  std::string profile;  // "dsv4-flash", "dsv4.1-flash", "glm-5.2", "glm-5.3-flash"
  int32_t tp = 1;
  int32_t heads_per_rank = 64;  // 64 / tp
  kernels::KvFormat kv_format = kernels::KvFormat::kFp8Dsv4;
  int32_t page_rows = 64;      // rows per page, a power of two
  int64_t pool_bytes = 0;      // capacity of all of this model's pools together
  float kv_scale = 1.0f;       // fp8_per_tensor cache scale
  int64_t pool_pages = 0;      // when > 0, the pool size in pages (pool_bytes is then ignored)
  float softmax_scale = 0.0f;  // 0 = the profile's default
  // SWA layers keep this many positions before the stored length beyond the window, so a step
  // may restart that far back (rolling back rejected drafts) without the window's rows lost.
  int32_t swa_rollback = 16;
};

struct Limits {
  int32_t max_rows_per_step = 16384;  // rows in one call
  int32_t max_spans_per_step = 256;
  int32_t max_batch_rows = 8192;                     // rows in one launch
  int64_t max_batch_bytes = 512 << 20;               // input+output bytes in one launch
  int32_t max_queued_requests = 1024;                // per (model, layer) queue
  int64_t max_queued_rows = 65536;                   // per (model, layer) queue
  absl::Duration batch_wait = absl::ZeroDuration();  // optional wait for more work
  // After a batch, the scheduler's thread spins this long for the next step before parking
  // (the next step then needs no thread wake-up); it burns a core meanwhile, and an idle
  // scheduler parks. Zero parks at once.
  absl::Duration scheduler_spin = absl::Microseconds(200);
  int32_t max_sequences = 4096;  // per served model
  int64_t max_context = 262144 + 16384;
  // Per-tenant quotas (0 = no quota beyond the server's own limits); exceeding one is
  // RESOURCE_EXHAUSTED naming the quota, with nothing written.
  int32_t tenant_max_sequences = 0;  // live sequences per tenant, per served model
  int64_t tenant_max_pages = 0;      // KV pool pages per tenant, per served model
  int32_t tenant_max_streams = 0;    // open StepStream calls per tenant (the edge counts them)
  int32_t tenant_max_regions = 0;    // registered shared-memory regions per tenant
  // Descriptor-bound limits of the edge; 0 = derived from the open-files limit (fd_budget.h).
  int32_t max_connections = 0;  // open gRPC connections
  int32_t max_regions = 0;      // registered shared-memory regions, all tenants
  // Sequences not used (created, stepped, truncated or read) for this long are released on
  // every layer by a background sweeper; InfiniteDuration = never.
  absl::Duration sequence_idle_timeout = absl::InfiniteDuration();
};

struct ServerConfig {
  std::string listen = "127.0.0.1:50051";
  std::string metrics_listen = "127.0.0.1:9464";  // empty = no metrics endpoint
  kernels::BackendChoice backend = kernels::BackendChoice::kAuto;
  std::vector<ModelConfig> models;
  Limits limits;
  // The attention's and the output copies' timing events (StepTimings::attend, copy_out) are
  // recorded on one launch in this many, since each event costs the device time it measures
  // (docs/performance.md, "Timing a launch"). 1 = every launch.
  int32_t phase_timings_every = 16;
};

}  // namespace smla::server
