#include "limit_fields.h"

#include <array>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace smla::server::edge {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

struct LimitField {
  absl::string_view name;
  bool zero_keeps_default;
  int64_t max;
  void (*set)(const LimitTargets&, int64_t);
};

constexpr LimitField kFields[] = {
    {"max_rows_per_step", true, kInt32Max,
     [](const LimitTargets& t, int64_t v) { t.limits->max_rows_per_step = static_cast<int32_t>(v); }},
    {"max_spans_per_step", true, kInt32Max,
     [](const LimitTargets& t, int64_t v) { t.limits->max_spans_per_step = static_cast<int32_t>(v); }},
    {"max_batch_rows", true, kInt32Max,
     [](const LimitTargets& t, int64_t v) { t.limits->max_batch_rows = static_cast<int32_t>(v); }},
    {"max_batch_bytes", true, kInt64Max,
     [](const LimitTargets& t, int64_t v) { t.limits->max_batch_bytes = v; }},
    {"max_queued_requests", true, kInt32Max,
     [](const LimitTargets& t, int64_t v) { t.limits->max_queued_requests = static_cast<int32_t>(v); }},
    {"max_queued_rows", true, kInt64Max,
     [](const LimitTargets& t, int64_t v) { t.limits->max_queued_rows = v; }},
    {"batch_wait_us", false, kInt64Max,
     [](const LimitTargets& t, int64_t v) { t.limits->batch_wait = absl::Microseconds(v); }},
    {"scheduler_spin_us", false, kInt64Max,
     [](const LimitTargets& t, int64_t v) { t.limits->scheduler_spin = absl::Microseconds(v); }},
    {"max_sequences", true, kInt32Max,
     [](const LimitTargets& t, int64_t v) { t.limits->max_sequences = static_cast<int32_t>(v); }},
    {"max_context", true, kInt64Max,
     [](const LimitTargets& t, int64_t v) { t.limits->max_context = v; }},
    {"stream_max_inflight", true, kInt32Max,
     [](const LimitTargets& t, int64_t v) { *t.stream_max_inflight = static_cast<int32_t>(v); }},
    {"shutdown_grace_s", true, kInt32Max,
     [](const LimitTargets& t, int64_t v) { *t.shutdown_grace_s = static_cast<int32_t>(v); }},
    {"tenant_max_sequences", false, kInt32Max,
     [](const LimitTargets& t, int64_t v) { t.limits->tenant_max_sequences = static_cast<int32_t>(v); }},
    {"tenant_max_pages", false, kInt64Max,
     [](const LimitTargets& t, int64_t v) { t.limits->tenant_max_pages = v; }},
    {"tenant_max_streams", false, kInt32Max,
     [](const LimitTargets& t, int64_t v) { t.limits->tenant_max_streams = static_cast<int32_t>(v); }},
};

constexpr std::array<absl::string_view, std::size(kFields)> kNames = [] {
  std::array<absl::string_view, std::size(kFields)> names{};
  for (size_t i = 0; i < names.size(); ++i) names[i] = kFields[i].name;
  return names;
}();

}  // namespace

absl::Status SetLimit(absl::string_view prefix, absl::string_view name, int64_t value,
                      const LimitTargets& targets) {
  for (const LimitField& f : kFields) {
    if (f.name != name) continue;
    if (value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, name, ": ", value, " is negative (",
          f.zero_keeps_default ? "0 keeps the default" : "0 is the smallest value", ")"));
    }
    if (value > f.max) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, name, ": ", value, " is out of range (at most ", f.max, ")"));
    }
    if (value == 0 && f.zero_keeps_default) return absl::OkStatus();
    f.set(targets, value);
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat(prefix, name, ": not a limit this server knows"));
}

std::span<const absl::string_view> LimitNames() { return kNames; }

}  // namespace smla::server::edge
