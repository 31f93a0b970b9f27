// The numeric limits that both a config file (smla.v1.LimitsConfig, plus the top-level
// shutdown_grace_s) and the command-line flags of the same names set. One table serves both,
// so they accept the same values and a bad one is an error naming the field, never ignored.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "smla/server/config.h"

namespace smla::server::edge {

// Where the limits land: the core's Limits and the edge's own two settings.
struct LimitTargets {
  Limits* limits = nullptr;
  int32_t* stream_max_inflight = nullptr;
  int32_t* shutdown_grace_s = nullptr;
};

// Sets the limit `name` to `value`. A negative value, or one past an int32 field's range, is
// InvalidArgument "{prefix}{name}: {value} ..."; 0 keeps the default for the sizes and counts
// (max_*, stream_max_inflight, shutdown_grace_s) and is a value for the waits
// (batch_wait_us, scheduler_spin_us) and the tenant quotas (0 = no quota). An unknown name is
// an internal error: the table and its callers disagree.
absl::Status SetLimit(absl::string_view prefix, absl::string_view name, int64_t value,
                      const LimitTargets& targets);

// Every limit's name, in table order.
std::span<const absl::string_view> LimitNames();

}  // namespace smla::server::edge
