// In-process types of one step call (docs/architecture.md "A step"), as the gRPC edge hands them to
// the service core. Tensor bytes are views into memory the caller keeps alive until `done` runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "smla/kernels/formats.h"

namespace smla::server {

enum class RowRole : uint8_t { kVerify = 0, kDraft = 1 };

// How a step's queries travel (every span of a step alike): bf16, or MXFP8 (e4m3 codes plus
// one UE8M0 scale byte per 32 lanes, smla/kernels/codec/mxfp8_query.h), which the executor
// copies to the device as they are and expands there into the bf16 Q the operator reads.
enum class QFormat : uint8_t { kBf16 = 0, kMxfp8 = 1 };

// Rows of one sequence at consecutive positions [first_position, first_position + num_rows).
struct SpanInput {
  std::string sequence_id;
  int64_t first_position = 0;
  int32_t num_rows = 0;
  // [num_rows], empty = all verify. Inline up to a decode span's rows: a step of many spans
  // allocates nothing for them.
  absl::InlinedVector<RowRole, 8> roles;
  // [num_rows, QkWidth] bf16: the new KV rows, written at their positions (positions at or
  // past first_position are replaced: this is how a rejected draft is rolled back).
  std::span<const uint8_t> kv_rows;
  // [n, QkWidth] bf16: new entries of the layer's compressed cache, when it has one; entries
  // [floor(first/r), floor((first+num_rows)/r)) in order.
  std::span<const uint8_t> compressed_rows;
  // [num_rows, H, QkWidth] query rows: bf16, or e4m3 codes when the step's q_format is MXFP8.
  std::span<const uint8_t> q;
  // MXFP8 queries only: [num_rows, H, QkWidth / 32] UE8M0 scale bytes, one per 32 lanes of q.
  std::span<const uint8_t> q_scales;
  // [num_rows, K] int32 logical entry numbers chosen by the indexer, -1 = none (top-k layers).
  std::span<const int32_t> topk;
  int32_t topk_width = 0;  // K
};

// Where a step's output goes instead of StepResult's vectors (e.g. a client's shared-memory
// region, so the output is copied once, from the batch buffer straight to the client). Each
// span is empty (use the result vector) or exactly the byte size of its tensor; the memory
// must stay valid until `done` runs.
struct OutputDestination {
  std::span<uint8_t> out;        // bf16 [rows, H, 512] or e4m3 [rows, H*512]
  std::span<uint8_t> mx_scales;  // [rows, H*16] for MXFP8
  std::span<uint8_t> lse;        // f32 [rows, H] when want_lse
};

// A cancellation flag the edge raises when the client cancels; queued work checks it.
using CancelFlag = std::shared_ptr<std::atomic<bool>>;

struct StepRequest {
  std::string request_id;  // for logs
  std::string tenant;
  std::string model;
  // Set by the service core at admission: the model's place in the core's configuration order,
  // so that the scheduler and the executor need not look it up by name again.
  int32_t model_index = -1;
  int32_t layer = 0;
  std::vector<SpanInput> spans;
  QFormat q_format = QFormat::kBf16;
  kernels::OutputFormat output_format = kernels::OutputFormat::kBf16;
  bool want_lse = false;
  bool inverse_rope = false;  // rope_inside only; needs the model's cos/sin table
  absl::Time deadline = absl::InfiniteFuture();
  CancelFlag cancelled;  // may be null
  OutputDestination destination;
};

// Times of the batch that carried a step (all of its steps get the same launch times).
struct StepTimings {
  absl::Duration queued;  // admission to launch
  // Device time of the batch's device work, input copies to output copies, from events on the
  // backend's stream (wall time of the same work on the CPU backend), less any time the device
  // waited for the host's segment build after the input copies. No host work.
  absl::Duration kernel;
  // Host work of the launch that its device work did not overlap: sizing buffers and gathering
  // inputs before the first device work, the part of the segment build that outlasted the
  // input copies, and enqueueing beyond the device's time. prep + kernel is about the launch's
  // wall time.
  absl::Duration prep;
  absl::Duration attend;  // the attention kernel(s) alone (device events; part of kernel)
  // Parts of kernel: its start to the end of the input copies (and of the expansion of MXFP8
  // queries), and the end of attention to the end of the output copies (device events, with any
  // wait for the host's enqueueing). copy_in is zero where no copy comes before the checks
  // (inputs in a GPU region are copied by the checks).
  absl::Duration copy_in;
  absl::Duration copy_out;
  // Whether attend and copy_out were measured: on one launch in
  // ServerConfig::phase_timings_every; zero on the others.
  bool phases = false;
  absl::Duration batch;  // the executor's whole batch: page reservations, prep, kernel, commits
  absl::Time admitted;   // when the scheduler queued the step
  int32_t batch_requests = 0;
  int32_t batch_rows = 0;
};

struct StepResult {
  int32_t num_rows = 0;  // total over spans, in span order
  int32_t num_heads = 0;
  kernels::OutputFormat output_format = kernels::OutputFormat::kBf16;
  // Empty where the request named an OutputDestination for them.
  std::vector<uint8_t> out;        // bf16 [rows, H, 512] or e4m3 [rows, H*512]
  std::vector<uint8_t> mx_scales;  // [rows, H*16] for MXFP8
  std::vector<float> lse;          // [rows, H] when asked
  StepTimings timings;
};

using StepCallback = std::function<void(absl::StatusOr<StepResult>)>;

}  // namespace smla::server
