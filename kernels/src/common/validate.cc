#include "smla/kernels/validate.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "smla/base/align.h"
#include "smla/base/status_macros.h"
#include "smla/base/strings.h"
#include "smla/kernels/formats.h"
#include "smla/kernels/plan.h"

namespace smla::kernels {
namespace {

bool LegalHeads(int32_t h) { return h == 8 || h == 16 || h == 32 || h == 64 || h == 128; }

// CSR shape and, unless the caller vouched for them, ids of one segment. `name` is "main" or
// "extra".
absl::Status ValidateSegment(const Segment& seg, std::string_view name_view, int32_t num_rows,
                             bool ids_in_range) {
  const std::string name(name_view);
  const std::string what = absl::StrCat(name, " segment cache");
  SMLA_RETURN_IF_ERROR(ValidateCacheView(seg.cache, what));
  const size_t expected = static_cast<size_t>(num_rows) + 1;
  if (seg.indptr.size() != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s segment: indptr has %d entries, expected T+1 = %d", name, seg.indptr.size(), expected));
  }
  if (seg.indptr[0] != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s segment: indptr[0] is %d, must be 0", name, seg.indptr[0]));
  }
  for (int32_t t = 0; t < num_rows; ++t) {
    if (seg.indptr[t + 1] < seg.indptr[t]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s segment, row %d: indptr decreases (%d then %d)", name, t,
                          seg.indptr[t], seg.indptr[t + 1]));
    }
  }
  if (static_cast<size_t>(seg.indptr[num_rows]) != seg.indices.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s segment: indptr[T] = %d but indices has %d entries", name,
                        seg.indptr[num_rows], seg.indices.size()));
  }
  if (ids_in_range) return absl::OkStatus();
  if (seg.indices_on_device) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s segment: indices in backend memory need a call that vouches for them (ids_in_range)",
        name));
  }
  const int64_t slots = seg.cache.num_slots();
  for (int32_t t = 0; t < num_rows; ++t) {
    for (int32_t j = seg.indptr[t]; j < seg.indptr[t + 1]; ++j) {
      if (seg.indices[j] >= slots) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s segment, row %d: index %d out of range (pool has %d slots)", name,
                            t, seg.indices[j], slots));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateCacheView(const CacheView& cache, std::string_view what_view) {
  const std::string what(what_view);
  if (!FormatSupports(cache.format, cache.geometry)) {
    return absl::UnimplementedError(absl::StrCat(what, ": format ", Sv(KvFormatName(cache.format)),
                                                 " does not support geometry ",
                                                 Sv(GeometryName(cache.geometry))));
  }
  if (!IsPowerOfTwo(cache.rows_per_page)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: rows per page %d is not a power of two", what, cache.rows_per_page));
  }
  if (cache.num_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: negative page count %d", what, cache.num_pages));
  }
  const int64_t need = MinPitch(cache.format, cache.geometry, cache.rows_per_page);
  if (cache.pitch_bytes < need) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: pitch %d too small for %d rows of %s (needs %d)", what, cache.pitch_bytes,
        cache.rows_per_page, Sv(KvFormatName(cache.format)), need));
  }
  if (!IsAligned(cache.pitch_bytes, 16)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: pitch %d is not a multiple of 16", what, cache.pitch_bytes));
  }
  if (cache.num_pages > 0 && cache.base == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null base pointer"));
  }
  if (cache.format == KvFormat::kFp8PerTensor &&
      !(std::isfinite(cache.scale) && cache.scale > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: fp8_per_tensor scale must be finite and positive (got %g)", what, cache.scale));
  }
  return absl::OkStatus();
}

absl::Status ValidateAttend(const AttendParams& p) {
  if (p.num_rows < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("negative row count %d", p.num_rows));
  }
  if (!LegalHeads(p.num_heads)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("heads must be one of 8, 16, 32, 64, 128 (got %d)", p.num_heads));
  }
  if (p.q_type == QType::kBf16) {
    if (p.q_scale != 1.0f) {
      return absl::InvalidArgumentError(
          absl::StrFormat("q_scale %g given with bf16 q (only fp8 q takes a scale)", p.q_scale));
    }
  } else if (p.q_type == QType::kFp8) {
    if (!(std::isfinite(p.q_scale) && p.q_scale > 0.0f)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("fp8 q needs a finite positive q_scale (got %g)", p.q_scale));
    }
  } else {
    return absl::InvalidArgumentError("unknown q type");
  }
  if (!std::isfinite(p.softmax_scale)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("softmax_scale must be finite (got %g)", p.softmax_scale));
  }
  if (p.main.cache.geometry != p.geometry) {
    return absl::InvalidArgumentError(
        absl::StrCat("main segment cache has geometry ", Sv(GeometryName(p.main.cache.geometry)),
                     " but the call is ", Sv(GeometryName(p.geometry))));
  }
  SMLA_RETURN_IF_ERROR(ValidateSegment(p.main, "main", p.num_rows, p.ids_in_range));
  if (p.has_extra) {
    if (p.extra.cache.geometry != p.geometry) {
      return absl::InvalidArgumentError(
          absl::StrCat("extra segment cache has geometry ",
                       Sv(GeometryName(p.extra.cache.geometry)), " but the main segment has ",
                       Sv(GeometryName(p.geometry)), " (both segments share the geometry)"));
    }
    SMLA_RETURN_IF_ERROR(ValidateSegment(p.extra, "extra", p.num_rows, p.ids_in_range));
  }
  if (p.num_rows > 0 && p.q == nullptr) return absl::InvalidArgumentError("q is null");
  if (!p.sink.empty()) {
    if (p.sink.size() != static_cast<size_t>(p.num_heads)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sink has %d entries, expected H = %d", p.sink.size(), p.num_heads));
    }
    for (int32_t h = 0; h < p.num_heads; ++h) {
      if (!std::isfinite(p.sink[h])) {
        return absl::InvalidArgumentError(
            absl::StrFormat("sink[%d] is not finite (%g)", h, p.sink[h]));
      }
    }
  }
  const Epilogue& e = p.epilogue;
  if (!e.positions.empty()) {
    if (p.geometry != Geometry::kRopeInside) {
      return absl::InvalidArgumentError(absl::StrCat(
          "epilogue, row 0: positions given with geometry ", Sv(GeometryName(p.geometry)),
          " (inverse RoPE applies only to rope_inside)"));
    }
    if (e.positions.size() != static_cast<size_t>(p.num_rows)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "epilogue: positions has %d entries, expected T = %d", e.positions.size(), p.num_rows));
    }
    if (e.cos_sin == nullptr) {
      return absl::InvalidArgumentError("epilogue: positions given but cos_sin is null");
    }
    for (int32_t t = 0; t < p.num_rows; ++t) {
      if (e.positions[t] < 0 || e.positions[t] >= e.num_positions) {
        return absl::InvalidArgumentError(
            absl::StrFormat("epilogue, row %d: position %d out of range [0, %d)", t, e.positions[t],
                            e.num_positions));
      }
    }
  }
  if (p.num_rows > 0) {
    if (p.out.format == OutputFormat::kBf16) {
      if (p.out.bf16 == nullptr) {
        return absl::InvalidArgumentError("output: bf16 format but the bf16 pointer is null");
      }
    } else if (p.out.format == OutputFormat::kMxfp8) {
      if (p.out.mx_data == nullptr || p.out.mx_scales == nullptr) {
        return absl::InvalidArgumentError(
            "output: mxfp8 format needs both the data and the scales pointers");
      }
    } else {
      return absl::InvalidArgumentError("output: unknown format");
    }
    if (!IsAligned(p.out.bf16, 16) || !IsAligned(p.out.mx_data, 16) ||
        !IsAligned(p.out.lse, alignof(float))) {
      return absl::InvalidArgumentError(
          "output: the data must be 16-byte aligned (the kernels store 16 bytes at a time) and "
          "the LSE 4-byte aligned");
    }
  }
  if (p.force_head_block != 0 && p.force_head_block != 16 && p.force_head_block != 32 &&
      p.force_head_block != 64) {
    return absl::InvalidArgumentError(
        absl::StrFormat("force_head_block must be 0, 16, 32 or 64 (got %d)", p.force_head_block));
  }
  if (p.force_splits < 0 || p.force_splits > kMaxSplits) {
    return absl::InvalidArgumentError(
        absl::StrFormat("force_splits must be in [0, %d] (got %d)", kMaxSplits, p.force_splits));
  }
  return absl::OkStatus();
}

absl::Status ValidateWriteRows(const WriteRowsParams& p) {
  SMLA_RETURN_IF_ERROR(ValidateCacheView(p.cache.view(), "cache"));
  if (!p.slots.empty() && p.rows == nullptr) {
    return absl::InvalidArgumentError("rows is null");
  }
  const int64_t n = p.cache.num_slots();
  for (size_t i = 0; i < p.slots.size(); ++i) {
    if (p.slots[i] < 0 || p.slots[i] >= n) {
      return absl::InvalidArgumentError(
          absl::StrFormat("slots[%d] = %d out of range (pool has %d slots)", i, p.slots[i], n));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckInputs(const CheckInputsParams& p) {
  const TranslateParams& e = p.entries;
  if (p.num_ranges < 0 || e.num_rows < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "num_ranges %d and entries.num_rows %d must not be negative", p.num_ranges, e.num_rows));
  }
  if (e.page_shift < 0 || e.page_shift > 30) {
    return absl::InvalidArgumentError(
        absl::StrFormat("entries.page_shift %d outside [0, 30]", e.page_shift));
  }
  if (e.block_shift < 0 || e.block_shift > 16 || e.num_block_writes < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("entries.block_shift %d outside [0, 16] or num_block_writes %d negative",
                        e.block_shift, e.num_block_writes));
  }
  if (e.num_runs < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("entries.num_runs %d must not be negative", e.num_runs));
  }
  if ((p.num_ranges > 0 && p.ranges == nullptr) || (e.num_rows > 0 && e.rows == nullptr) ||
      (e.num_block_writes > 0 && e.block_writes == nullptr) ||
      (e.num_runs > 0 && e.runs == nullptr)) {
    return absl::InvalidArgumentError(
        "ranges, entries.rows, entries.block_writes or entries.runs is null");
  }
  const RowWrites& w = p.rows;
  if (w.num_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rows.num_rows %d must not be negative", w.num_rows));
  }
  if (w.num_rows > 0) {
    SMLA_RETURN_IF_ERROR(ValidateCacheView(w.cache.view(), "rows.cache"));
    if (w.rows == nullptr || w.copies == nullptr) {
      return absl::InvalidArgumentError("rows.rows or rows.copies is null");
    }
  }
  if ((p.num_ranges > 0 || e.num_rows > 0 || w.num_rows > 0) && p.flags == nullptr) {
    return absl::InvalidArgumentError("flags is null");
  }
  return absl::OkStatus();
}

absl::Status ValidateExpandQuery(const ExpandQueryParams& p) {
  if (p.width <= 0 || p.width % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("width %d is not a positive multiple of 32", p.width));
  }
  if (p.vectors < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("vectors %d is negative", p.vectors));
  }
  if (p.vectors > 0 && (p.codes == nullptr || p.scales == nullptr || p.out == nullptr)) {
    return absl::InvalidArgumentError("codes, scales or out is null");
  }
  return absl::OkStatus();
}

}  // namespace smla::kernels
