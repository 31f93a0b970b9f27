#include "smla/client/testing/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "smla/base/status_macros.h"
#include "smla/client/tensor.h"
#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/mxfp8.h"
#include "smla/kernels/cpu_backend.h"

namespace smla::client {
namespace {

std::vector<float> Dequantise(const Expected& e, const std::vector<uint8_t>& out,
                              const std::vector<uint8_t>& scales) {
  const int64_t n = int64_t{e.rows} * e.heads * kernels::kValueWidth;
  std::vector<float> v(n);
  if (e.format == v1::OUTPUT_FORMAT_BF16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, out.data() + 2 * i, 2);
      v[i] = kernels::Bf16BitsToF32(b);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      v[i] = kernels::MxDecodeLane(out[i], scales[i / kernels::kMxGroup]);
    }
  }
  return v;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Reference>> Reference::Create(const v1::ModelInfo& model,
                                                             int64_t capacity_rows) {
  std::unique_ptr<Reference> r(new Reference());
  r->model_ = model;
  auto f = kernels::ParseKvFormat(model.kv_format());
  auto g = kernels::ParseGeometry(model.geometry());
  if (!f || !g) {
    return absl::InvalidArgumentError(absl::StrCat("reference: unknown format '", model.kv_format(),
                                                   "' or geometry '", model.geometry(), "'"));
  }
  r->format_ = *f;
  r->geometry_ = *g;
  r->qk_ = kernels::QkWidth(*g);
  r->pitch_ = kernels::ServingPitch(*f, *g, r->page_rows_);
  r->capacity_rows_ = (capacity_rows + r->page_rows_ - 1) / r->page_rows_ * r->page_rows_;
  SMLA_ASSIGN_OR_RETURN(r->backend_, kernels::CreateCpuBackend());
  SMLA_ASSIGN_OR_RETURN(r->stream_, r->backend_->CreateStream());
  return r;
}

void Reference::SetRopeTable(std::vector<float> cos_sin, int32_t positions) {
  cos_sin_ = std::move(cos_sin);
  rope_positions_ = positions;
}

absl::StatusOr<Reference::LayerPool*> Reference::Pool(int32_t layer) {
  auto it = pools_.find(layer);
  if (it != pools_.end()) return &it->second;
  const int64_t pages = capacity_rows_ / page_rows_;
  SMLA_ASSIGN_OR_RETURN(auto mem, backend_->Allocate(pages * pitch_));
  LayerPool& p = pools_[layer];
  p.memory = std::move(mem);
  return &p;
}

absl::StatusOr<int32_t> Reference::WriteRow(int32_t layer, const uint8_t* bf16_row) {
  SMLA_ASSIGN_OR_RETURN(auto pool, Pool(layer));
  LayerPool& p = *pool;
  if (p.next_slot >= capacity_rows_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("reference: layer ", layer, " pool of ", capacity_rows_, " rows is full"));
  }
  const int64_t slot = p.next_slot++;
  kernels::WriteRowsParams w;
  w.cache = {p.memory.data(),
             format_,
             geometry_,
             capacity_rows_ / page_rows_,
             page_rows_,
             pitch_,
             model_.kv_scale() > 0 ? model_.kv_scale() : 1.0f};
  w.slots = std::span<const int64_t>(&slot, 1);
  w.rows = bf16_row;
  SMLA_RETURN_IF_ERROR(backend_->WriteRows(w, *stream_));
  return static_cast<int32_t>(slot);
}

void Reference::Truncate(const std::string& sequence, int64_t length) {
  for (auto& [key, s] : sequences_) {
    if (key.first != sequence) continue;
    const v1::LayerInfo& l = model_.layers(key.second);
    if (static_cast<int64_t>(s.slot_of_position.size()) > length) s.slot_of_position.resize(length);
    if (l.compression_ratio() > 0) {
      const int64_t keep = length / l.compression_ratio();
      if (static_cast<int64_t>(s.slot_of_entry.size()) > keep) s.slot_of_entry.resize(keep);
    }
  }
}

absl::StatusOr<Expected> Reference::Step(const v1::StepRequest& req) {
  if (req.layer() < 0 || req.layer() >= model_.layers_size()) {
    return absl::InvalidArgumentError(absl::StrCat("reference: no layer ", req.layer()));
  }
  const int32_t layer = req.layer();
  const v1::LayerInfo& li = model_.layers(layer);
  const int32_t h = model_.heads_per_rank();
  const int64_t row_bytes = int64_t{qk_} * 2;

  // 1. The step's writes, in span order.
  for (const v1::Span& s : req.spans()) {
    SequenceLayer& sl = sequences_[{s.sequence_id(), layer}];
    const int64_t f = s.first_position();
    if (f > static_cast<int64_t>(sl.slot_of_position.size())) {
      return absl::InvalidArgumentError(absl::StrCat("reference: gap in ", s.sequence_id()));
    }
    sl.slot_of_position.resize(f);
    const auto& kv = s.kv_rows().inline_data();
    for (int32_t t = 0; t < s.num_rows(); ++t) {
      SMLA_ASSIGN_OR_RETURN(
          auto slot, WriteRow(layer, reinterpret_cast<const uint8_t*>(kv.data()) + t * row_bytes));
      sl.slot_of_position.push_back(slot);
    }
    if (li.compression_ratio() > 0) {
      const int64_t first_entry = f / li.compression_ratio();
      sl.slot_of_entry.resize(std::min<int64_t>(sl.slot_of_entry.size(), first_entry));
      const auto& c = s.compressed_rows().inline_data();
      const int64_t n = static_cast<int64_t>(c.size()) / row_bytes;
      for (int64_t e = 0; e < n; ++e) {
        SMLA_ASSIGN_OR_RETURN(
            auto slot, WriteRow(layer, reinterpret_cast<const uint8_t*>(c.data()) + e * row_bytes));
        sl.slot_of_entry.push_back(slot);
      }
    }
  }

  // 2. Segments, q, positions for every row, spans in order.
  std::vector<int32_t> main_ptr = {0}, main_idx, extra_ptr = {0}, extra_idx, positions;
  std::vector<uint16_t> q;  // bf16; MXFP8 queries decoded exactly as the server expands them
  for (const v1::Span& s : req.spans()) {
    const SequenceLayer& sl = sequences_[{s.sequence_id(), layer}];
    const int32_t k =
        s.has_topk() && s.topk().shape_size() == 2 ? static_cast<int32_t>(s.topk().shape(1)) : 0;
    std::vector<int32_t> topk(int64_t{s.num_rows()} * k);
    if (k > 0) std::memcpy(topk.data(), s.topk().inline_data().data(), topk.size() * 4);
    SMLA_ASSIGN_OR_RETURN(auto span_q, SpanQueryBf16(s));
    q.insert(q.end(), span_q.begin(), span_q.end());
    for (int32_t t = 0; t < s.num_rows(); ++t) {
      const int64_t p = s.first_position() + t;
      positions.push_back(static_cast<int32_t>(p));
      if (li.kind() == v1::LAYER_KIND_TOPK) {
        for (int32_t j = 0; j < k; ++j) {
          const int32_t e = topk[int64_t{t} * k + j];
          main_idx.push_back(e < 0 ? -1 : sl.slot_of_position.at(e));
        }
      } else {
        for (int64_t pos = std::max<int64_t>(0, p - li.window() + 1); pos <= p; ++pos) {
          main_idx.push_back(sl.slot_of_position.at(pos));
        }
      }
      main_ptr.push_back(static_cast<int32_t>(main_idx.size()));
      if (li.kind() == v1::LAYER_KIND_SWA_TOPK) {
        for (int32_t j = 0; j < k; ++j) {
          const int32_t e = topk[int64_t{t} * k + j];
          extra_idx.push_back(e < 0 ? -1 : sl.slot_of_entry.at(e));
        }
      } else if (li.kind() == v1::LAYER_KIND_SWA_ALL_COMPRESSED) {
        const int64_t visible = (p + 1) / li.compression_ratio();
        for (int64_t e = 0; e < visible; ++e) extra_idx.push_back(sl.slot_of_entry.at(e));
      }
      extra_ptr.push_back(static_cast<int32_t>(extra_idx.size()));
    }
  }
  const int32_t rows = static_cast<int32_t>(positions.size());

  // 3. The operator on the reference pool.
  SMLA_ASSIGN_OR_RETURN(auto pool, Pool(layer));
  kernels::CacheView cache{pool->memory.data(),
                           format_,
                           geometry_,
                           capacity_rows_ / page_rows_,
                           page_rows_,
                           pitch_,
                           model_.kv_scale() > 0 ? model_.kv_scale() : 1.0f};
  Expected e;
  e.rows = rows;
  e.heads = h;
  e.format = req.output_format();
  kernels::AttendParams a;
  a.num_rows = rows;
  a.num_heads = h;
  a.geometry = geometry_;
  a.q = q.data();
  a.softmax_scale = model_.softmax_scale();
  a.main = {cache, main_ptr, main_idx};
  a.has_extra =
      li.kind() == v1::LAYER_KIND_SWA_TOPK || li.kind() == v1::LAYER_KIND_SWA_ALL_COMPRESSED;
  if (a.has_extra) a.extra = {cache, extra_ptr, extra_idx};
  if (model_.has_sinks()) {
    if (static_cast<int64_t>(sinks_.size()) < int64_t{layer + 1} * h) {
      return absl::FailedPreconditionError("reference: sinks not set");
    }
    a.sink = std::span<const float>(sinks_.data() + int64_t{layer} * h, h);
  }
  if (req.inverse_rope()) {
    a.epilogue.positions = positions;
    a.epilogue.cos_sin = cos_sin_.data();
    a.epilogue.num_positions = rope_positions_;
  }
  const int64_t values = int64_t{rows} * h * kernels::kValueWidth;
  if (e.format == v1::OUTPUT_FORMAT_MXFP8) {
    e.out.resize(values);
    e.mx_scales.resize(values / kernels::kMxGroup);
    a.out.format = kernels::OutputFormat::kMxfp8;
    a.out.mx_data = e.out.data();
    a.out.mx_scales = e.mx_scales.data();
  } else {
    e.out.resize(values * 2);
    a.out.format = kernels::OutputFormat::kBf16;
    a.out.bf16 = e.out.data();
  }
  if (req.want_lse()) {
    e.lse.resize(int64_t{rows} * h);
    a.out.lse = e.lse.data();
  }
  SMLA_RETURN_IF_ERROR(backend_->Attend(a, *stream_));
  SMLA_RETURN_IF_ERROR(backend_->Synchronize(*stream_));
  return e;
}

Comparison Reference::Compare(const Expected& expected, const v1::StepResponse& response,
                              double tolerance) {
  Comparison c;
  auto fail = [&c](std::string what) {
    if (c.ok) c.first_mismatch = std::move(what);
    c.ok = false;
  };
  if (response.code() != 0) {
    fail(absl::StrCat("response code ", response.code(), ": ", response.message()));
    return c;
  }
  const bool mx = expected.format == v1::OUTPUT_FORMAT_MXFP8;
  auto out = UnpackBytes(response.out(), mx ? v1::DTYPE_E4M3 : v1::DTYPE_BF16);
  absl::StatusOr<std::vector<uint8_t>> scales = std::vector<uint8_t>();
  if (mx) scales = UnpackBytes(response.mx_scales(), v1::DTYPE_E8M0);
  if (!out.ok() || !scales.ok() || out->size() != expected.out.size() ||
      scales->size() != expected.mx_scales.size()) {
    fail(absl::StrCat("output tensor shape or size differs (", response.out().inline_data().size(),
                      " bytes, expected ", expected.out.size(), ")"));
    return c;
  }
  const std::vector<float> got = Dequantise(expected, *out, *scales);
  const std::vector<float> ref = Dequantise(expected, expected.out, expected.mx_scales);
  const int w = kernels::kValueWidth;
  for (int32_t t = 0; t < expected.rows; ++t) {
    for (int32_t h = 0; h < expected.heads; ++h) {
      const int64_t base = (int64_t{t} * expected.heads + h) * w;
      double amax = 0, err = 0;
      for (int i = 0; i < w; ++i) {
        amax = std::max(amax, std::fabs(double{ref[base + i]}));
        const double d = std::fabs(double{got[base + i]} - double{ref[base + i]});
        err = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(err, d);
      }
      c.max_abs_error = std::max(c.max_abs_error, err);
      if (amax > 0) c.max_rel_error = std::max(c.max_rel_error, err / amax);
      // MXFP8 data may differ by one e4m3 step (2^-3 relative) where rounding flips.
      const double bound = tolerance * amax + (mx ? amax / 8 : 0);
      if (err > bound || (amax == 0 && err != 0)) {
        fail(absl::StrCat("row ", t, " head ", h, ": max|out-ref| ", err, " > ", bound,
                          " (max|ref| ", amax, ")"));
      }
    }
  }
  if (!expected.lse.empty()) {
    auto lse = UnpackF32(response.lse());
    if (!lse.ok() || lse->size() != expected.lse.size()) {
      fail("lse tensor missing or of the wrong size");
      return c;
    }
    for (size_t i = 0; i < lse->size(); ++i) {
      const double r = expected.lse[i], g = (*lse)[i];
      if (std::isinf(r) || std::isinf(g)) {
        if (r != g) fail(absl::StrCat("lse[", i, "] ", g, ", expected ", r));
        continue;
      }
      const double d = std::fabs(g - r);
      c.max_lse_error = std::max(c.max_lse_error, d);
      if (!(d <= tolerance * std::max(1.0, std::fabs(r)))) {
        fail(absl::StrCat("lse[", i, "] ", g, ", expected ", r));
      }
    }
  }
  return c;
}

}  // namespace smla::client
