// The one semantic validator of a step: the checks that need no stored state, run at
// admission: layer known, shapes and byte sizes (the queries' by the step's q_format), positions
// and roles, sink and RoPE table present. The gRPC edge checks only the wire form (dtypes,
// tensor shapes against their bytes, enum values, region references, wire.h) and leaves every
// other rule here. Checks against stored state (sequence exists, no position gap, window kept, pool
// capacity) run when the step is launched, in queue order (KvStore::Prepare). The checks of
// the inputs' contents (KV rows finite and within the accepted magnitude, no NaN in MXFP8
// queries, chosen entries visible at their rows) run on the device, on the launch's copies of
// the inputs (Backend::CheckInputs, kernels/input_checks.h), so a
// client that rewrites its memory mid-step can only fail its own step; for a step they flag,
// CheckRowsFinite, CheckQueryCodes and ExplainChosenEntries below, run on those copies, give
// the message.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "smla/server/config.h"
#include "smla/server/model_profile.h"
#include "smla/server/step.h"

namespace smla::server {

struct StepContext {
  const ModelConfig* config = nullptr;  // resolved
  const ModelProfile* profile = nullptr;
  const Limits* limits = nullptr;
  bool sinks_uploaded = false;
  int32_t rope_positions = 0;  // P of the uploaded cos/sin table, 0 = none
};

// The rules that bound a step's extent: 1..max_spans_per_step spans, each of at least one row,
// max_rows_per_step rows in all, positions from 0 within the longest context, and one role per
// row when roles are given. ValidateStep runs them; the edge runs them too before it sizes the
// spans' tensors from these values (wire.h), so its sizes cannot overflow. INVALID_ARGUMENT
// naming the field.
absl::Status ValidateStepExtent(const StepRequest& request, const Limits& limits);

// ValidateStepExtent, then the rest. INVALID_ARGUMENT naming field, span, row and value; NOT_FOUND
// for an unknown layer; FAILED_PRECONDITION when the model's sinks or the RoPE table a step needs
// are missing.
absl::Status ValidateStep(const StepRequest& request, const StepContext& context);

// INVALID_ARGUMENT naming the first value of the span's KV or compressed rows (spans[index])
// that is not finite or past the accepted magnitude 2^kKvMaxLog2 (kernels/formats.h), with
// its row, column and the bound, else OK.
absl::Status CheckRowsFinite(const SpanInput& span, size_t index, int qk_width);

// INVALID_ARGUMENT naming the first NaN of an MXFP8 span's queries (spans[index].q[row][head]
// [lane] for an e4m3 code 0x7F / 0xFF, .q_scales[row][head][group] for the scale byte 255),
// else OK; nothing to check for bf16 queries (no q_scales).
absl::Status CheckQueryCodes(const SpanInput& span, size_t index, int32_t heads, int qk_width);

// The error for a span with a chosen entry its row may not see (the device's translation flagged
// its step): INVALID_ARGUMENT naming the first such entry; OK when every entry checks out.
absl::Status ExplainChosenEntries(const SpanInput& span, size_t index, const LayerSpec& spec);

// Compressed entries a span of `num_rows` rows from `first_position` adds to a 1/r cache:
// [floor(first/r), floor((first+n)/r)).
inline int64_t CompressedEntriesAdded(int64_t first_position, int32_t num_rows, int32_t ratio) {
  return (first_position + num_rows) / ratio - first_position / ratio;
}

// Input plus output bytes of a step: what it costs in a launch (Limits::max_batch_bytes).
int64_t StepBytes(const StepRequest& request, const ModelProfile& profile, int32_t heads);

// Rows over all spans.
int64_t StepRows(const StepRequest& request);

}  // namespace smla::server
