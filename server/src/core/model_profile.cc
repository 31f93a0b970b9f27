#include "smla/server/model_profile.h"

#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "internal.h"
#include "smla/base/align.h"

namespace smla::server {
namespace {

absl::StatusOr<int64_t> ParseInt(std::string_view key, std::string_view value) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(Sv(value), &v)) {
    return absl::InvalidArgumentError(Cat(key, ": '", value, "' is not an integer"));
  }
  return v;
}

absl::StatusOr<float> ParseFloat(std::string_view key, std::string_view value) {
  float v = 0;
  if (!absl::SimpleAtof(Sv(value), &v)) {
    return absl::InvalidArgumentError(Cat(key, ": '", value, "' is not a number"));
  }
  return v;
}

}  // namespace

int64_t PageBytes(const ModelConfig& config, const ModelProfile& profile) {
  return kernels::ServingPitch(config.kv_format, profile.geometry, config.page_rows);
}

absl::StatusOr<ModelConfig> ResolveModelConfig(const ModelConfig& config) {
  const ModelProfile* profile = FindProfile(config.profile);
  if (profile == nullptr) {
    return absl::InvalidArgumentError(
        Cat("unknown model profile '", config.profile, "' (known: ", models::ProfileNames(), ")"));
  }
  ModelConfig out = config;
  if (out.tp != 1 && out.tp != 2 && out.tp != 4 && out.tp != 8) {
    return absl::InvalidArgumentError(
        Cat(config.profile, ": tp must be 1, 2, 4 or 8 (got ", out.tp, ")"));
  }
  out.heads_per_rank = profile->num_heads / out.tp;
  if (!kernels::FormatSupports(out.kv_format, profile->geometry)) {
    return absl::InvalidArgumentError(Cat(config.profile, ": kv format ",
                                          kernels::KvFormatName(out.kv_format), " cannot store ",
                                          kernels::GeometryName(profile->geometry), " rows"));
  }
  if (!IsPowerOfTwo(out.page_rows) || out.page_rows > 1024) {
    return absl::InvalidArgumentError(Cat(config.profile,
                                          ": page_rows must be a power of two in [1, 1024] (got ",
                                          out.page_rows, ")"));
  }
  if (!std::isfinite(out.kv_scale) || out.kv_scale <= 0) {
    return absl::InvalidArgumentError(
        Cat(config.profile, ": kv_scale must be positive and finite (got ", out.kv_scale, ")"));
  }
  if (out.softmax_scale == 0) out.softmax_scale = profile->softmax_scale;
  if (!std::isfinite(out.softmax_scale) || out.softmax_scale <= 0) {
    return absl::InvalidArgumentError(Cat(config.profile,
                                          ": softmax_scale must be positive and finite (got ",
                                          out.softmax_scale, ")"));
  }
  if (out.swa_rollback < 0) {
    return absl::InvalidArgumentError(
        Cat(config.profile, ": swa_rollback must be >= 0 (got ", out.swa_rollback, ")"));
  }
  const int64_t page_bytes = PageBytes(out, *profile);
  if (out.pool_pages > 0) {
    out.pool_bytes = out.pool_pages * page_bytes;
  } else {
    out.pool_pages = out.pool_bytes / page_bytes;
  }
  if (out.pool_pages < 1) {
    return absl::InvalidArgumentError(Cat(config.profile, ": pool of ", out.pool_bytes,
                                          " bytes holds no page of ", page_bytes, " bytes"));
  }
  if (out.pool_pages * out.page_rows > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(Cat(config.profile, ": pool of ", out.pool_pages, " pages x ",
                                          out.page_rows,
                                          " rows has more slots than int32 slot ids reach"));
  }
  out.pool_bytes = out.pool_pages * page_bytes;
  return out;
}

absl::StatusOr<int64_t> ParseByteSize(std::string_view text) {
  struct Suffix {
    std::string_view name;
    int64_t factor;
  };
  static constexpr Suffix kSuffixes[] = {{"TiB", int64_t{1} << 40},
                                         {"GiB", int64_t{1} << 30},
                                         {"MiB", int64_t{1} << 20},
                                         {"KiB", int64_t{1} << 10},
                                         {"B", 1}};
  absl::string_view number = absl::StripAsciiWhitespace(Sv(text));
  int64_t factor = 1;
  for (const Suffix& s : kSuffixes) {
    if (number.size() > s.name.size() && absl::EndsWith(number, Sv(s.name))) {
      number.remove_suffix(s.name.size());
      factor = s.factor;
      break;
    }
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(number, &v) || v < 0 || v > std::numeric_limits<int64_t>::max() / factor) {
    return absl::InvalidArgumentError(Cat(
        "'", text, "' is not a byte size (a non-negative integer with optional KiB/MiB/GiB/TiB)"));
  }
  return v * factor;
}

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view spec) {
  std::vector<std::string> parts = absl::StrSplit(Sv(spec), ':');
  ModelConfig config;
  config.profile = std::string(parts[0]);
  const ModelProfile* profile = FindProfile(config.profile);
  if (profile != nullptr) config.kv_format = profile->default_format;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    const std::string_view key = kv.first;
    const std::string_view value = kv.second;
    if (key == "tp") {
      absl::StatusOr<int64_t> v = ParseInt(key, value);
      if (!v.ok()) return v.status();
      if (*v < 1 || *v > 8) return absl::InvalidArgumentError(Cat("tp: ", *v, " outside [1, 8]"));
      config.tp = static_cast<int32_t>(*v);
    } else if (key == "kv") {
      std::optional<kernels::KvFormat> f = kernels::ParseKvFormat(value);
      if (!f) return absl::InvalidArgumentError(Cat("kv: unknown format '", value, "'"));
      config.kv_format = *f;
    } else if (key == "page_rows") {
      absl::StatusOr<int64_t> v = ParseInt(key, value);
      if (!v.ok()) return v.status();
      if (*v <= 0 || *v > 1024) {
        return absl::InvalidArgumentError(Cat("page_rows: ", *v, " outside [1, 1024]"));
      }
      config.page_rows = static_cast<int32_t>(*v);
    } else if (key == "pool") {
      absl::StatusOr<int64_t> v = ParseByteSize(value);
      if (!v.ok()) return v.status();
      config.pool_bytes = *v;
    } else if (key == "pool_pages") {
      absl::StatusOr<int64_t> v = ParseInt(key, value);
      if (!v.ok()) return v.status();
      config.pool_pages = *v;
    } else if (key == "kv_scale") {
      absl::StatusOr<float> v = ParseFloat(key, value);
      if (!v.ok()) return v.status();
      config.kv_scale = *v;
    } else if (key == "softmax_scale") {
      absl::StatusOr<float> v = ParseFloat(key, value);
      if (!v.ok()) return v.status();
      config.softmax_scale = *v;
    } else if (key == "swa_rollback") {
      absl::StatusOr<int64_t> v = ParseInt(key, value);
      if (!v.ok()) return v.status();
      if (*v < 0 || *v > (1 << 20)) {
        return absl::InvalidArgumentError(Cat("swa_rollback: ", *v, " outside [0, 2^20]"));
      }
      config.swa_rollback = static_cast<int32_t>(*v);
    } else {
      return absl::InvalidArgumentError(Cat(
          "model spec '", spec, "': unknown key '", key,
          "' (known: tp, kv, page_rows, pool, pool_pages, kv_scale, softmax_scale, swa_rollback)"));
    }
  }
  return ResolveModelConfig(config);
}

}  // namespace smla::server
