#include "limit_fields.h"

#include <array>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace smla::server::edge {
namespace {

struct LimitField {
  absl::string_view name;
  bool zero_keeps_default;
  int64_t max;
  void (*set)(const LimitTargets&, int64_t);
};

// A Limits member holding the value as is (its type bounds it).
template <auto kMember>
constexpr LimitField Count(absl::string_view name, bool zero_keeps_default) {
  using T = std::remove_cvref_t<decltype(std::declval<Limits&>().*kMember)>;
  return {name, zero_keeps_default, std::numeric_limits<T>::max(),
          [](const LimitTargets& t, int64_t v) { t.limits->*kMember = static_cast<T>(v); }};
}

// A Limits duration given in microseconds.
template <auto kMember>
constexpr LimitField Micros(absl::string_view name) {
  return {name, false, std::numeric_limits<int64_t>::max(),
          [](const LimitTargets& t, int64_t v) { t.limits->*kMember = absl::Microseconds(v); }};
}

constexpr LimitField kFields[] = {
    Count<&Limits::max_rows_per_step>("max_rows_per_step", true),
    Count<&Limits::max_spans_per_step>("max_spans_per_step", true),
    Count<&Limits::max_batch_rows>("max_batch_rows", true),
    Count<&Limits::max_batch_bytes>("max_batch_bytes", true),
    Count<&Limits::max_queued_requests>("max_queued_requests", true),
    Count<&Limits::max_queued_rows>("max_queued_rows", true),
    Micros<&Limits::batch_wait>("batch_wait_us"),
    Micros<&Limits::scheduler_spin>("scheduler_spin_us"),
    Count<&Limits::max_sequences>("max_sequences", true),
    Count<&Limits::max_context>("max_context", true),
    // 0 keeps the default, which follows the open-files limit.
    Count<&Limits::max_connections>("max_connections", true),
    Count<&Limits::max_regions>("max_regions", true),
    {"stream_max_inflight", true, std::numeric_limits<int32_t>::max(),
     [](const LimitTargets& t, int64_t v) { *t.stream_max_inflight = static_cast<int32_t>(v); }},
    {"shutdown_grace_s", true, std::numeric_limits<int32_t>::max(),
     [](const LimitTargets& t, int64_t v) { *t.shutdown_grace_s = static_cast<int32_t>(v); }},
    // The tenant quotas: 0 = no quota, the default.
    Count<&Limits::tenant_max_sequences>("tenant_max_sequences", false),
    Count<&Limits::tenant_max_pages>("tenant_max_pages", false),
    Count<&Limits::tenant_max_streams>("tenant_max_streams", false),
    Count<&Limits::tenant_max_regions>("tenant_max_regions", false),
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
