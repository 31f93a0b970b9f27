// Bounds on the client's names and ids (request ids, model names, sequence ids), checked at the
// edge before a call does anything: a real id is short, and an over-long one would otherwise
// be carried into logs and status messages.
#pragma once

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "step_view.h"

namespace smla::server::edge {

// The longest request id, model name or sequence id accepted, in bytes.
inline constexpr size_t kMaxIdBytes = 256;

// INVALID_ARGUMENT "{field}: N bytes, at most 256" when `value` is longer than kMaxIdBytes;
// the value itself is not echoed.
absl::Status CheckIdLength(std::string_view field, std::string_view value);

// CheckIdLength of a step's request_id, model and every span's sequence_id.
absl::Status CheckStepIds(const StepView& request);

}  // namespace smla::server::edge
