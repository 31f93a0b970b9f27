#include "smla/server/step_validation.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "internal.h"
#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/mxfp8_query.h"
#include "smla/kernels/formats.h"
#include "smla/kernels/input_checks.h"
#include "smla/server/log_field.h"

namespace smla::server {
namespace {

using kernels::Geometry;

// First bf16 value of a [rows, width] tensor outside the accepted range (input_checks.h), as
// (row, column), or false. Run on the inputs of a step the device flagged, to name the value.
bool FindOutOfRange(std::span<const uint8_t> bytes, int width, int64_t& row, int64_t& col,
                    float& value) {
  const int64_t n = static_cast<int64_t>(bytes.size() / 2);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * i, 2);
    if (kernels::Bf16OutOfBounds(bits)) {
      row = i / width;
      col = i % width;
      value = kernels::Bf16BitsToF32(bits);
      return true;
    }
  }
  return false;
}

// Why `v` was refused, for the message.
std::string OutOfRangeText(float v) {
  if (v != v) return "nan (KV rows must be finite)";
  if (std::isinf(v)) return Cat(v > 0 ? "inf" : "-inf", " (KV rows must be finite)");
  return Cat(v, " (KV values must satisfy |x| <= 2^", kernels::kKvMaxLog2, " = ",
             std::ldexp(1.0, kernels::kKvMaxLog2), ")");
}

// A span's name in errors; built only for an error, as validation runs for every span of every
// step.
std::string SpanField(size_t index) { return Cat("spans[", index, "]"); }

// Byte sizes of a span's query tensors for the step's query format.
absl::Status CheckQuerySizes(const SpanInput& s, size_t index, QFormat format, int32_t heads,
                             int qk) {
  const bool mx = format == QFormat::kMxfp8;
  const int64_t lanes = int64_t{s.num_rows} * heads * qk;
  const int64_t want_q = lanes * (mx ? 1 : 2);
  if (static_cast<int64_t>(s.q.size()) != want_q) {
    return absl::InvalidArgumentError(
        Cat(SpanField(index), ".q: ", s.num_rows, " rows x ", heads, " heads x ", qk * (mx ? 1 : 2),
            " bytes", mx ? " (e4m3 codes)" : "", " expected, got ", s.q.size(), " bytes"));
  }
  const int64_t want_scales = mx ? lanes / kernels::kMxQueryGroup : 0;
  if (static_cast<int64_t>(s.q_scales.size()) != want_scales) {
    return absl::InvalidArgumentError(
        mx ? Cat(SpanField(index), ".q_scales: ", s.num_rows, " rows x ", heads, " heads x ",
                 qk / kernels::kMxQueryGroup, " scale bytes expected, got ", s.q_scales.size(),
                 " bytes")
           : Cat(SpanField(index), ".q_scales: set for bf16 queries (", s.q_scales.size(),
                 " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t StepRows(const StepRequest& request) {
  int64_t rows = 0;
  for (const SpanInput& s : request.spans) rows += s.num_rows;
  return rows;
}

int64_t StepBytes(const StepRequest& request, const ModelProfile& profile, int32_t heads) {
  int64_t bytes = 0;
  for (const SpanInput& s : request.spans) {
    bytes += static_cast<int64_t>(s.kv_rows.size() + s.compressed_rows.size() + s.q.size() +
                                  s.q_scales.size()) +
             static_cast<int64_t>(s.topk.size()) * 4;
  }
  const int64_t rows = StepRows(request);
  const int64_t out_row = request.output_format == kernels::OutputFormat::kBf16
                              ? int64_t{heads} * kernels::kValueWidth * 2
                              : int64_t{heads} * (kernels::kValueWidth + kernels::kMxGroupsPerHead);
  bytes += rows * out_row;
  if (request.want_lse) bytes += rows * heads * 4;
  return bytes;
}

absl::Status ValidateStepExtent(const StepRequest& r, const Limits& limits) {
  if (r.spans.empty()) return absl::InvalidArgumentError("spans: a step needs at least one span");
  if (static_cast<int64_t>(r.spans.size()) > limits.max_spans_per_step) {
    return absl::InvalidArgumentError(
        Cat("spans: ", r.spans.size(), " spans, at most ", limits.max_spans_per_step));
  }
  int64_t total_rows = 0;
  for (size_t i = 0; i < r.spans.size(); ++i) {
    const SpanInput& s = r.spans[i];
    if (s.num_rows < 1) {
      return absl::InvalidArgumentError(
          Cat("spans[", i, "].num_rows: ", s.num_rows, ", must be positive"));
    }
    total_rows += s.num_rows;
    if (total_rows > limits.max_rows_per_step) {
      return absl::InvalidArgumentError(Cat("spans[", i, "].num_rows: ", total_rows,
                                            " rows in the step, at most ",
                                            limits.max_rows_per_step));
    }
    if (s.first_position < 0) {
      return absl::InvalidArgumentError(
          Cat("spans[", i, "].first_position: ", s.first_position, " is negative"));
    }
    // Compared so that it cannot wrap (num_rows >= 1 and 0 <= first_position here): past this
    // check first_position + num_rows fits, and every position is computed from it.
    if (s.first_position > limits.max_context - s.num_rows) {
      return absl::InvalidArgumentError(Cat("spans[", i, "]: ", s.num_rows, " rows from position ",
                                            s.first_position, " exceed the longest context (",
                                            limits.max_context, " positions)"));
    }
    if (!s.roles.empty() && static_cast<int64_t>(s.roles.size()) != s.num_rows) {
      return absl::InvalidArgumentError(
          Cat("spans[", i, "].roles: ", s.roles.size(), " roles for ", s.num_rows, " rows"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateStep(const StepRequest& r, const StepContext& ctx) {
  const ModelConfig& config = *ctx.config;
  const ModelProfile& profile = *ctx.profile;
  const Limits& limits = *ctx.limits;
  if (r.layer < 0 || r.layer >= profile.num_layers()) {
    return absl::NotFoundError(Cat("layer ", r.layer, " not found (model ", config.profile,
                                   " has layers 0..", profile.num_layers() - 1, ")"));
  }
  const LayerSpec& spec = profile.layers[r.layer];
  if (profile.has_sink && !ctx.sinks_uploaded) {
    return absl::FailedPreconditionError(
        Cat("model ", config.profile,
            " has attention sinks and they have not been uploaded (SetSinks)"));
  }
  if (r.inverse_rope) {
    if (profile.geometry != Geometry::kRopeInside) {
      return absl::InvalidArgumentError(Cat("inverse_rope: model ", config.profile, " stores ",
                                            kernels::GeometryName(profile.geometry),
                                            " rows; inverse RoPE applies only to rope_inside"));
    }
    if (ctx.rope_positions <= 0) {
      return absl::FailedPreconditionError(
          Cat("inverse_rope: model ", config.profile, " has no cos/sin table (SetRopeTable)"));
    }
  }
  if (r.q_format != QFormat::kBf16 && r.q_format != QFormat::kMxfp8) {
    return absl::InvalidArgumentError(
        Cat("q_format: unknown value ", static_cast<int>(r.q_format)));
  }
  if (absl::Status extent = ValidateStepExtent(r, limits); !extent.ok()) return extent;
  const int qk = kernels::QkWidth(profile.geometry);
  const int64_t row_bytes = int64_t{qk} * 2;
  const int32_t heads = config.heads_per_rank;
  absl::flat_hash_map<std::string_view, size_t> seen;
  seen.reserve(r.spans.size());
  for (size_t i = 0; i < r.spans.size(); ++i) {
    const SpanInput& s = r.spans[i];
    if (s.sequence_id.empty()) {
      return absl::InvalidArgumentError(Cat(SpanField(i), ".sequence_id: empty"));
    }
    auto [it, inserted] = seen.emplace(s.sequence_id, i);
    if (!inserted) {
      return absl::InvalidArgumentError(Cat(SpanField(i), ".sequence_id '", LogField(s.sequence_id),
                                            "' repeats spans[", it->second, "]"));
    }
    // ValidateStepExtent bounded the positions: this cannot wrap.
    const int64_t end = s.first_position + s.num_rows;
    const int64_t want_kv = s.num_rows * row_bytes;
    if (static_cast<int64_t>(s.kv_rows.size()) != want_kv) {
      return absl::InvalidArgumentError(Cat(SpanField(i), ".kv_rows: ", s.num_rows, " rows x ",
                                            row_bytes, " bytes expected, got ", s.kv_rows.size(),
                                            " bytes"));
    }
    if (absl::Status q = CheckQuerySizes(s, i, r.q_format, heads, qk); !q.ok()) return q;
    if (spec.has_compressed()) {
      const int64_t n = CompressedEntriesAdded(s.first_position, s.num_rows, spec.ratio);
      if (static_cast<int64_t>(s.compressed_rows.size()) != n * row_bytes) {
        return absl::InvalidArgumentError(
            Cat(SpanField(i), ".compressed_rows: ", n, " entries x ", row_bytes,
                " bytes expected (entries ", s.first_position / spec.ratio, "..",
                end / spec.ratio - 1, " of the 1/", spec.ratio, " cache for positions ",
                s.first_position, "..", end - 1, "), got ", s.compressed_rows.size(), " bytes"));
      }
    } else if (!s.compressed_rows.empty()) {
      return absl::InvalidArgumentError(
          Cat(SpanField(i), ".compressed_rows: layer ", r.layer, " (", LayerKindName(spec.kind),
              ") has no compressed cache, got ", s.compressed_rows.size(), " bytes"));
    }
    if (spec.client_chooses()) {
      if (s.topk_width < 1 || s.topk_width > spec.topk) {
        return absl::InvalidArgumentError(Cat(SpanField(i), ".topk_width: ", s.topk_width,
                                              " outside [1, ", spec.topk, "] for layer ", r.layer,
                                              " (", LayerKindName(spec.kind), ")"));
      }
      if (static_cast<int64_t>(s.topk.size()) != int64_t{s.num_rows} * s.topk_width) {
        return absl::InvalidArgumentError(Cat(SpanField(i), ".topk: ", s.num_rows, " rows x ",
                                              s.topk_width, " entries expected, got ",
                                              s.topk.size(), " entries"));
      }
    } else if (!s.topk.empty() || s.topk_width != 0) {
      return absl::InvalidArgumentError(Cat(
          SpanField(i), ".topk: layer ", r.layer, " (", LayerKindName(spec.kind),
          ") takes no chosen entries, got ", s.topk.size(), " entries of width ", s.topk_width));
    }
    if (r.inverse_rope && end > ctx.rope_positions) {
      const int64_t bad_pos = std::max<int64_t>(s.first_position, ctx.rope_positions);
      return absl::InvalidArgumentError(Cat(SpanField(i), " row ", bad_pos - s.first_position,
                                            ": position ", bad_pos, " outside the cos/sin table (",
                                            ctx.rope_positions, " positions)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRowsFinite(const SpanInput& s, size_t index, int qk_width) {
  int64_t bad_row = 0, bad_col = 0;
  float bad = 0;
  if (FindOutOfRange(s.kv_rows, qk_width, bad_row, bad_col, bad)) {
    return absl::InvalidArgumentError(
        Cat("spans[", index, "].kv_rows[", bad_row, "][", bad_col, "]: ", OutOfRangeText(bad)));
  }
  if (FindOutOfRange(s.compressed_rows, qk_width, bad_row, bad_col, bad)) {
    return absl::InvalidArgumentError(Cat("spans[", index, "].compressed_rows[", bad_row, "][",
                                          bad_col, "]: ", OutOfRangeText(bad)));
  }
  return absl::OkStatus();
}

absl::Status CheckQueryCodes(const SpanInput& s, size_t index, int32_t heads, int qk_width) {
  if (s.q_scales.empty()) return absl::OkStatus();
  for (size_t i = 0; i < s.q.size(); ++i) {
    if (!kernels::E4m3IsNaN(s.q[i])) continue;
    const size_t vector = i / qk_width;
    return absl::InvalidArgumentError(Cat("spans[", index, "].q[", vector / heads, "][",
                                          vector % heads, "][", i % qk_width, "]: e4m3 code 0x",
                                          absl::Hex(s.q[i], absl::kZeroPad2),
                                          " is NaN (MXFP8 queries must be finite)"));
  }
  const int groups = qk_width / kernels::kMxQueryGroup;
  for (size_t i = 0; i < s.q_scales.size(); ++i) {
    if (!kernels::E8m0IsNaN(s.q_scales[i])) continue;
    const size_t vector = i / groups;
    return absl::InvalidArgumentError(
        Cat("spans[", index, "].q_scales[", vector / heads, "][", vector % heads, "][", i % groups,
            "]: scale byte 255 is NaN (MXFP8 queries must be finite)"));
  }
  return absl::OkStatus();
}

absl::Status ExplainChosenEntries(const SpanInput& s, size_t index, const LayerSpec& spec) {
  const std::string field = SpanField(index);
  for (int32_t t = 0; t < s.num_rows; ++t) {
    const int64_t p = s.first_position + t;
    const int64_t visible = spec.visible(p);
    for (int32_t k = 0; k < s.topk_width; ++k) {
      const int32_t e =
          __atomic_load_n(s.topk.data() + int64_t{t} * s.topk_width + k, __ATOMIC_RELAXED);
      if (e < -1) {
        return absl::InvalidArgumentError(
            Cat(field, ".topk[", t, "][", k, "]: entry ", e, " is invalid (-1 means none)"));
      }
      if (e >= visible) {
        return absl::InvalidArgumentError(Cat(field, ".topk[", t, "][", k, "]: entry ", e,
                                              " not visible at position ", p, " (sequence has ",
                                              visible, " visible entries)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace smla::server
