#include "smla/server/step_executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "internal.h"
#include "smla/server/step_validation.h"
#include "spdlog/spdlog.h"

namespace smla::server {
namespace {

using kernels::OutputFormat;

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

StepExecutor::StepExecutor(kernels::Backend& backend, std::unique_ptr<kernels::Stream> stream,
                           std::vector<ModelRuntime*> models)
    : backend_(backend), stream_(std::move(stream)) {
  for (ModelRuntime* m : models) models_[m->config().profile] = m;
}

absl::StatusOr<std::unique_ptr<StepExecutor>> StepExecutor::Create(
    kernels::Backend& backend, std::vector<ModelRuntime*> models) {
  absl::StatusOr<std::unique_ptr<kernels::Stream>> stream = backend.CreateStream();
  if (!stream.ok()) return stream.status();
  return std::unique_ptr<StepExecutor>(
      new StepExecutor(backend, *std::move(stream), std::move(models)));
}

absl::Status StepExecutor::Ensure(kernels::Buffer& buffer, size_t bytes) {
  if (buffer.size() >= bytes && buffer.data() != nullptr) return absl::OkStatus();
  // Grow geometrically so that a slowly growing batch does not reallocate every launch.
  const size_t size = std::max<size_t>({bytes, buffer.size() * 2, 4096});
  buffer = kernels::Buffer();
  absl::StatusOr<kernels::Buffer> fresh = backend_.Allocate(size);
  if (!fresh.ok()) return fresh.status();
  buffer = *std::move(fresh);
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> StepExecutor::HostStaging(size_t bytes) {
  if (!host_staging_) return nullptr;
  if (host_in_.size() < bytes || host_in_.data() == nullptr) {
    const size_t size = std::max<size_t>({bytes, host_in_.size() * 2, size_t{1} << 20});
    host_in_ = kernels::Buffer();
    absl::StatusOr<kernels::Buffer> fresh = backend_.AllocateHost(size);
    if (absl::IsUnimplemented(fresh.status())) {
      host_staging_ = false;
      return nullptr;
    }
    if (!fresh.ok()) return fresh.status();
    host_in_ = *std::move(fresh);
  }
  return host_in_.as<uint8_t>();
}

absl::Status StepExecutor::WarmUp() {
  for (auto& [name, model] : models_) {
    const int32_t heads = model->config().heads_per_rank;
    const int qk = kernels::QkWidth(model->profile().geometry);
    SMLA_RETURN_IF_ERROR(Ensure(q_, size_t{2} * heads * qk));
    SMLA_RETURN_IF_ERROR(Ensure(out_, size_t{2} * heads * kernels::kValueWidth));
    SMLA_RETURN_IF_ERROR(backend_.Fill(q_.data(), 0, size_t{2} * heads * qk, *stream_));
    const int32_t indptr[2] = {0, 0};
    kernels::AttendParams p;
    p.num_rows = 1;
    p.num_heads = heads;
    p.geometry = model->profile().geometry;
    p.q = q_.data();
    p.softmax_scale = model->config().softmax_scale;
    p.main.cache = model->store().cache().view();
    p.main.indptr = indptr;
    p.out.format = OutputFormat::kBf16;
    p.out.bf16 = out_.data();
    SMLA_RETURN_IF_ERROR(backend_.Attend(p, *stream_));
    SMLA_RETURN_IF_ERROR(backend_.Synchronize(*stream_));
  }
  return absl::OkStatus();
}

std::vector<absl::StatusOr<StepResult>> StepExecutor::RunBatch(
    std::span<const StepRequest* const> steps) {
  std::vector<absl::StatusOr<StepResult>> results(steps.size(),
                                                  absl::InternalError("step was not run"));
  auto it = models_.find(steps[0]->model);
  SMLA_CHECK(it != models_.end(), "batch for a model the executor does not serve");
  ModelRuntime& model = *it->second;
  const int32_t layer = steps[0]->layer;
  KvStore& store = model.store();
  const ModelRuntime::Rope rope = model.rope();

  store.BeginBatch();
  std::vector<std::unique_ptr<PreparedStep>> prepared(steps.size());
  std::vector<size_t> included;
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepRequest& r = *steps[i];
    SMLA_CHECK(r.model == steps[0]->model && r.layer == layer, "batch mixes queues");
    // The table may have been replaced by a shorter one since admission.
    if (r.inverse_rope) {
      absl::Status rope_status;
      for (size_t s = 0; s < r.spans.size() && rope_status.ok(); ++s) {
        const SpanInput& span = r.spans[s];
        if (span.first_position + span.num_rows > rope.positions) {
          rope_status = absl::InvalidArgumentError(
              Cat("spans[", s, "]: positions up to ", span.first_position + span.num_rows - 1,
                  " outside the cos/sin table (", rope.positions, " positions)"));
        }
      }
      if (!rope_status.ok()) {
        results[i] = rope_status;
        continue;
      }
    }
    std::vector<SpanWrite> writes;
    writes.reserve(r.spans.size());
    for (const SpanInput& s : r.spans) {
      writes.push_back(SpanWrite{s.sequence_id, s.first_position, s.num_rows});
    }
    absl::StatusOr<std::unique_ptr<PreparedStep>> p = store.Prepare(r.tenant, layer, writes);
    if (!p.ok()) {
      results[i] = p.status();
      continue;
    }
    prepared[i] = *std::move(p);
    included.push_back(i);
  }
  if (!included.empty()) {
    const absl::Status status = Launch(model, layer, rope, steps, included, prepared, results);
    for (size_t i : included) {
      if (status.ok()) {
        store.Commit(*prepared[i]);
      } else {
        store.Abort(*prepared[i]);
        results[i] = absl::InternalError(Cat("backend failure: ", status.message()));
      }
    }
    if (!status.ok()) {
      // Rows of the failed batch may have been written over stored positions, so the core
      // stops serving rather than risk answering from a half-updated cache.
      spdlog::error("backend failure on {} layer {} ({} steps); service is now unhealthy: {}",
                    steps[0]->model, layer, included.size(), std::string(status.message()));
      healthy_.store(false);
    }
  }
  store.EndBatch();
  return results;
}

absl::Status StepExecutor::Launch(ModelRuntime& model, int32_t layer,
                                  const ModelRuntime::Rope& rope,
                                  std::span<const StepRequest* const> steps,
                                  std::span<const size_t> included,
                                  std::span<const std::unique_ptr<PreparedStep>> prepared,
                                  std::vector<absl::StatusOr<StepResult>>& results) {
  const absl::Time start = absl::Now();
  const ModelProfile& profile = model.profile();
  const LayerSpec& spec = profile.layers[layer];
  const int32_t heads = model.config().heads_per_rank;
  const int qk = kernels::QkWidth(profile.geometry);
  const size_t row_bytes = size_t{2} * qk;
  const StepRequest& head = *steps[included[0]];
  const OutputFormat format = head.output_format;
  const bool inverse_rope = head.inverse_rope;
  const int32_t W = profile.swa_window;

  int64_t total_rows = 0, write_rows = 0;
  bool want_lse = false;
  for (size_t i : included) {
    const StepRequest& r = *steps[i];
    want_lse = want_lse || r.want_lse;
    for (const SpanInput& s : r.spans) {
      total_rows += s.num_rows;
      write_rows += s.num_rows + static_cast<int64_t>(s.compressed_rows.size() / row_bytes);
    }
  }
  const size_t q_bytes = static_cast<size_t>(total_rows) * heads * row_bytes;
  SMLA_RETURN_IF_ERROR(Ensure(q_, q_bytes));
  SMLA_RETURN_IF_ERROR(Ensure(rows_, static_cast<size_t>(write_rows) * row_bytes));

  // Inputs to backend memory, slots and segments on the host. A GPU backend gets the batch's
  // queries and rows gathered into page-locked memory and copied in two transfers: one
  // copy per span from pageable memory costs a synchronous bounce-buffer copy each.
  const size_t rows_bytes = static_cast<size_t>(write_rows) * row_bytes;
  absl::StatusOr<uint8_t*> staging = HostStaging(q_bytes + rows_bytes);
  if (!staging.ok()) return staging.status();
  uint8_t* const q_stage = *staging;
  uint8_t* const rows_stage = q_stage == nullptr ? nullptr : q_stage + q_bytes;
  auto put = [&](uint8_t* stage, uint8_t* device, size_t off, std::span<const uint8_t> src) {
    if (src.empty()) return absl::OkStatus();
    if (stage != nullptr) {
      std::memcpy(stage + off, src.data(), src.size());
      return absl::OkStatus();
    }
    return backend_.CopyToDevice(device + off, src.data(), src.size(), *stream_);
  };
  std::vector<int64_t> slots;
  slots.reserve(write_rows);
  std::vector<int32_t> main_indptr{0}, main_idx, extra_indptr{0}, extra_idx, positions;
  main_indptr.reserve(total_rows + 1);
  extra_indptr.reserve(total_rows + 1);
  size_t q_off = 0, row_off = 0;
  auto* q_base = static_cast<uint8_t*>(q_.data());
  auto* rows_base = static_cast<uint8_t*>(rows_.data());
  for (size_t i : included) {
    const StepRequest& r = *steps[i];
    const PreparedStep& p = *prepared[i];
    for (size_t si = 0; si < r.spans.size(); ++si) {
      const SpanInput& s = r.spans[si];
      SMLA_RETURN_IF_ERROR(put(q_stage, q_base, q_off, s.q));
      q_off += s.q.size();
      SMLA_RETURN_IF_ERROR(put(rows_stage, rows_base, row_off, s.kv_rows));
      row_off += s.kv_rows.size();
      for (int32_t t = 0; t < s.num_rows; ++t)
        slots.push_back(p.MainSlot(si, s.first_position + t));
      if (spec.has_compressed() && !s.compressed_rows.empty()) {
        SMLA_RETURN_IF_ERROR(put(rows_stage, rows_base, row_off, s.compressed_rows));
        row_off += s.compressed_rows.size();
        const int64_t e0 = s.first_position / spec.ratio;
        const int64_t n = static_cast<int64_t>(s.compressed_rows.size() / row_bytes);
        for (int64_t e = e0; e < e0 + n; ++e) slots.push_back(p.CompressedSlot(si, e));
      }
      for (int32_t t = 0; t < s.num_rows; ++t) {
        const int64_t pos = s.first_position + t;
        if (spec.has_window()) {
          for (int64_t k = std::max<int64_t>(0, pos - (W - 1)); k <= pos; ++k) {
            main_idx.push_back(static_cast<int32_t>(p.MainSlot(si, k)));
          }
        } else {
          for (int32_t k = 0; k < s.topk_width; ++k) {
            const int32_t e = s.topk[int64_t{t} * s.topk_width + k];
            main_idx.push_back(e < 0 ? -1 : static_cast<int32_t>(p.MainSlot(si, e)));
          }
        }
        main_indptr.push_back(static_cast<int32_t>(main_idx.size()));
        if (spec.kind == LayerKind::kSwaTopK) {
          for (int32_t k = 0; k < s.topk_width; ++k) {
            const int32_t e = s.topk[int64_t{t} * s.topk_width + k];
            extra_idx.push_back(e < 0 ? -1 : static_cast<int32_t>(p.CompressedSlot(si, e)));
          }
        } else if (spec.kind == LayerKind::kSwaDense) {
          for (int64_t e = 0; e < (pos + 1) / spec.ratio; ++e) {
            extra_idx.push_back(static_cast<int32_t>(p.CompressedSlot(si, e)));
          }
        }
        extra_indptr.push_back(static_cast<int32_t>(extra_idx.size()));
        if (inverse_rope) positions.push_back(static_cast<int32_t>(pos));
      }
    }
  }

  if (q_stage != nullptr) {
    SMLA_CHECK(q_off == q_bytes && row_off <= rows_bytes, "staged input sizes");
    if (q_off > 0) SMLA_RETURN_IF_ERROR(backend_.CopyToDevice(q_base, q_stage, q_off, *stream_));
    if (row_off > 0) {
      SMLA_RETURN_IF_ERROR(backend_.CopyToDevice(rows_base, rows_stage, row_off, *stream_));
    }
  }

  if (!slots.empty()) {
    kernels::WriteRowsParams w;
    w.cache = model.store().cache();
    w.slots = slots;
    w.rows = rows_.data();
    SMLA_RETURN_IF_ERROR(backend_.WriteRows(w, *stream_));
  }

  const size_t out_bytes = format == OutputFormat::kBf16
                               ? static_cast<size_t>(total_rows) * heads * kernels::kValueWidth * 2
                               : static_cast<size_t>(total_rows) * heads * kernels::kValueWidth;
  SMLA_RETURN_IF_ERROR(Ensure(out_, out_bytes));
  const size_t scale_bytes = static_cast<size_t>(total_rows) * heads * kernels::kMxGroupsPerHead;
  if (format == OutputFormat::kMxfp8) SMLA_RETURN_IF_ERROR(Ensure(scales_, scale_bytes));
  const size_t lse_bytes = static_cast<size_t>(total_rows) * heads * sizeof(float);
  if (want_lse) SMLA_RETURN_IF_ERROR(Ensure(lse_, lse_bytes));

  const std::vector<float> sink = profile.has_sink ? model.LayerSink(layer) : std::vector<float>();
  kernels::AttendParams a;
  a.num_rows = static_cast<int32_t>(total_rows);
  a.num_heads = heads;
  a.geometry = profile.geometry;
  a.q = q_.data();
  a.softmax_scale = model.config().softmax_scale;
  a.main.cache = model.store().cache().view();
  a.main.indptr = main_indptr;
  a.main.indices = main_idx;
  a.has_extra = spec.has_compressed();
  if (a.has_extra) {
    a.extra.cache = a.main.cache;
    a.extra.indptr = extra_indptr;
    a.extra.indices = extra_idx;
  }
  a.sink = sink;
  if (inverse_rope) {
    SMLA_CHECK(rope.table != nullptr, "inverse RoPE without a table");
    a.epilogue.positions = positions;
    a.epilogue.cos_sin = rope.table->as<const float>();
    a.epilogue.num_positions = rope.positions;
  }
  a.out.format = format;
  if (format == OutputFormat::kBf16) {
    a.out.bf16 = out_.data();
  } else {
    a.out.mx_data = out_.as<uint8_t>();
    a.out.mx_scales = scales_.as<uint8_t>();
  }
  a.out.lse = want_lse ? lse_.as<float>() : nullptr;
  SMLA_RETURN_IF_ERROR(backend_.Attend(a, *stream_));

  // Copy each step's rows back into its own result.
  const size_t out_row = out_bytes / static_cast<size_t>(total_rows);
  const size_t scale_row = size_t{static_cast<size_t>(heads)} * kernels::kMxGroupsPerHead;
  int64_t row0 = 0;
  for (size_t i : included) {
    const StepRequest& r = *steps[i];
    const int64_t n = StepRows(r);
    StepResult res;
    res.num_rows = static_cast<int32_t>(n);
    res.num_heads = heads;
    res.output_format = format;
    // Each tensor goes to the caller's destination when it named one, else to the result.
    const OutputDestination& dst = r.destination;
    uint8_t* out_dst = dst.out.data();
    if (dst.out.empty()) {
      res.out.resize(n * out_row);
      out_dst = res.out.data();
    }
    SMLA_CHECK(dst.out.empty() || dst.out.size() == n * out_row, "output destination size");
    SMLA_RETURN_IF_ERROR(
        backend_.CopyToHost(out_dst, out_.as<uint8_t>() + row0 * out_row, n * out_row, *stream_));
    if (format == OutputFormat::kMxfp8) {
      uint8_t* sc_dst = dst.mx_scales.data();
      if (dst.mx_scales.empty()) {
        res.mx_scales.resize(n * scale_row);
        sc_dst = res.mx_scales.data();
      }
      SMLA_CHECK(dst.mx_scales.empty() || dst.mx_scales.size() == n * scale_row,
                 "scale destination size");
      SMLA_RETURN_IF_ERROR(backend_.CopyToHost(sc_dst, scales_.as<uint8_t>() + row0 * scale_row,
                                               n * scale_row, *stream_));
    }
    if (r.want_lse) {
      void* lse_dst = dst.lse.data();
      if (dst.lse.empty()) {
        res.lse.resize(n * heads);
        lse_dst = res.lse.data();
      }
      SMLA_CHECK(dst.lse.empty() || dst.lse.size() == n * heads * sizeof(float),
                 "LSE destination size");
      SMLA_RETURN_IF_ERROR(backend_.CopyToHost(lse_dst, lse_.as<float>() + row0 * heads,
                                               n * heads * sizeof(float), *stream_));
    }
    // Moving keeps the vectors' storage, which the copies above may still be filling.
    results[i] = std::move(res);
    row0 += n;
  }
  SMLA_RETURN_IF_ERROR(backend_.Synchronize(*stream_));
  const absl::Duration kernel = absl::Now() - start;
  for (size_t i : included) results[i]->timings.kernel = kernel;
  return absl::OkStatus();
}

}  // namespace smla::server
