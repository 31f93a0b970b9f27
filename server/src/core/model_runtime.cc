#include "smla/server/model_runtime.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "internal.h"

namespace smla::server {
namespace {

bool AllFinite(std::span<const float> v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

}  // namespace

absl::Status ModelRuntime::SetSinks(std::span<const float> sinks) {
  const ModelProfile& p = profile();
  if (!p.has_sink) {
    return absl::FailedPreconditionError(Cat("model ", config_.profile, " has no attention sinks"));
  }
  const int64_t want = int64_t{p.num_layers()} * config_.heads_per_rank;
  if (static_cast<int64_t>(sinks.size()) != want) {
    return absl::InvalidArgumentError(Cat("sinks: ", p.num_layers(), " layers x ",
                                          config_.heads_per_rank, " heads = ", want,
                                          " values expected, got ", sinks.size()));
  }
  for (size_t i = 0; i < sinks.size(); ++i) {
    if (!std::isfinite(sinks[i])) {
      return absl::InvalidArgumentError(Cat("sinks[", i / config_.heads_per_rank, "][",
                                            i % config_.heads_per_rank, "]: ", sinks[i],
                                            " is not finite"));
    }
  }
  absl::MutexLock lock(&mu_);
  sinks_.assign(sinks.begin(), sinks.end());
  return absl::OkStatus();
}

absl::Status ModelRuntime::SetRopeTable(kernels::Backend& backend, kernels::Stream& stream,
                                        std::span<const float> cos_sin, int32_t num_positions) {
  if (profile().geometry != kernels::Geometry::kRopeInside) {
    return absl::FailedPreconditionError(Cat("model ", config_.profile, " stores ",
                                             kernels::GeometryName(profile().geometry),
                                             " rows: inverse RoPE applies only to rope_inside"));
  }
  if (num_positions < 1) {
    return absl::InvalidArgumentError(Cat("num_positions: ", num_positions, " (at least 1)"));
  }
  if (static_cast<int64_t>(cos_sin.size()) != int64_t{num_positions} * 64) {
    return absl::InvalidArgumentError(Cat("cos_sin: ", num_positions,
                                          " positions x 64 values expected, got ", cos_sin.size(),
                                          " values"));
  }
  if (!AllFinite(cos_sin)) {
    for (size_t i = 0; i < cos_sin.size(); ++i) {
      if (!std::isfinite(cos_sin[i])) {
        return absl::InvalidArgumentError(
            Cat("cos_sin[", i / 64, "][", i % 64, "]: ", cos_sin[i], " is not finite"));
      }
    }
  }
  const size_t bytes = cos_sin.size() * sizeof(float);
  absl::StatusOr<kernels::Buffer> buffer = backend.Allocate(bytes);
  if (!buffer.ok()) return buffer.status();
  SMLA_RETURN_IF_ERROR(backend.CopyToDevice(buffer->data(), cos_sin.data(), bytes, stream));
  SMLA_RETURN_IF_ERROR(backend.Synchronize(stream));
  auto table = std::make_shared<const kernels::Buffer>(*std::move(buffer));
  absl::MutexLock lock(&mu_);
  rope_ = Rope{std::move(table), num_positions};
  return absl::OkStatus();
}

bool ModelRuntime::sinks_uploaded() const {
  absl::MutexLock lock(&mu_);
  return !sinks_.empty();
}

std::vector<float> ModelRuntime::LayerSink(int32_t layer) const {
  absl::MutexLock lock(&mu_);
  if (sinks_.empty()) return {};
  const auto first = sinks_.begin() + int64_t{layer} * config_.heads_per_rank;
  return std::vector<float>(first, first + config_.heads_per_rank);
}

ModelRuntime::Rope ModelRuntime::rope() const {
  absl::MutexLock lock(&mu_);
  return rope_;
}

}  // namespace smla::server
