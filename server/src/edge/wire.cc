#include "wire.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "id_limits.h"
#include "shm_region.h"
#include "smla/base/align.h"
#include "smla/kernels/codec/mxfp8_query.h"
#include "smla/server/log_field.h"
#include "smla/server/step_validation.h"

namespace smla::server::edge {
namespace {

int64_t DTypeBytes(v1::DType d) {
  switch (d) {
    case v1::DTYPE_BF16:
      return 2;
    case v1::DTYPE_F32:
    case v1::DTYPE_INT32:
      return 4;
    case v1::DTYPE_E4M3:
    case v1::DTYPE_E8M0:
    case v1::DTYPE_UINT8:
      return 1;
    default:
      return 0;
  }
}

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status RegionsOff(absl::string_view field) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": shared-memory regions are not enabled on this server"));
}

bool RegionsOn(const RegionContext* regions) {
  return regions != nullptr && regions->registry != nullptr;
}

// Resolves a region reference of `want` bytes of elements of `align` bytes, keeping the
// mapping alive in `storage`.
absl::StatusOr<std::span<uint8_t>> ResolveRef(const RefView& ref, absl::string_view field,
                                              int64_t want, int64_t align,
                                              const RegionContext* regions, ParseStorage* storage) {
  if (!RegionsOn(regions)) return RegionsOff(field);
  if (ref.size != static_cast<uint64_t>(want)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": region '", LogField(ref.region),
                                                   "' size ", ref.size, ", the tensor needs ", want,
                                                   " bytes"));
  }
  const ShmMapping* mapping = nullptr;
  for (const auto& [name, m] : storage->looked_up) {
    if (name == ref.region) mapping = m.get();
  }
  if (mapping == nullptr) {
    auto m = regions->registry->Lookup(regions->tenant, field, ref.region);
    if (!m.ok()) return m.status();
    mapping = m->get();
    storage->looked_up.emplace_back(ref.region, *std::move(m));
  }
  return RegionRegistry::Slice(*mapping, field, ref.region, ref.offset, ref.size,
                               static_cast<uint64_t>(align));
}

// Checks dtype, shape (-1 = any extent) and byte count; returns the inline bytes or the bytes
// of the named region.
absl::StatusOr<std::span<const uint8_t>> CheckTensor(const v1::Tensor& t, const std::string& field,
                                                     v1::DType dtype,
                                                     const std::vector<int64_t>& shape,
                                                     const RegionContext* regions = nullptr,
                                                     ParseStorage* storage = nullptr) {
  if (t.data_case() == v1::Tensor::kRegion && (!RegionsOn(regions) || storage == nullptr)) {
    return RegionsOff(field);
  }
  if (t.dtype() != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": dtype ", v1::DType_Name(t.dtype()),
                                                   ", expected ", v1::DType_Name(dtype)));
  }
  if (t.shape_size() != static_cast<int>(shape.size())) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": shape ", ShapeText(t.shape()),
                                                   " has rank ", t.shape_size(), ", expected ",
                                                   shape.size()));
  }
  // Each dimension and the running product stay within kMaxElements, checked before each
  // multiplication so the count cannot wrap (a wrapped count could match a short payload).
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  int64_t elements = 1;
  for (int i = 0; i < t.shape_size(); ++i) {
    const int64_t d = t.shape(i);
    if (d < 0 || d > kMaxElements) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": shape ", ShapeText(t.shape()), " dimension ", i, " is ", d));
    }
    if (shape[i] >= 0 && d != shape[i]) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": shape ", ShapeText(t.shape()),
                                                     " dimension ", i, " is ", d, ", expected ",
                                                     shape[i]));
    }
    if (d != 0 && elements > kMaxElements / d) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": shape ", ShapeText(t.shape()), " is too large"));
    }
    elements *= d;
  }
  const int64_t want = elements * DTypeBytes(dtype);
  if (t.data_case() == v1::Tensor::kRegion) {
    auto r = ResolveRef(ViewOf(t.region(), true), field + ".region", want, DTypeBytes(dtype),
                        regions, storage);
    if (!r.ok()) return r.status();
    return std::span<const uint8_t>(r->data(), r->size());
  }
  std::span<const uint8_t> data(reinterpret_cast<const uint8_t*>(t.inline_data().data()),
                                t.inline_data().size());
  if (storage != nullptr) {
    const auto it = storage->landed.bytes.find(&t);
    if (it != storage->landed.bytes.end()) data = it->second;
  }
  if (static_cast<int64_t>(data.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": shape ", ShapeText(t.shape()),
                                                   " needs ", want, " bytes, got ", data.size()));
  }
  return data;
}

// A span's query tensors: bf16 q, or MXFP8 (e4m3 q codes with q_scales). The first span sets
// the step's query format and every other span must use the same one. Scale bytes are read
// whenever sent: whether the format takes them, and how many, is ValidateStep's to judge. NaN
// codes and scale bytes are the launch's to reject (CheckQueryCodes): their bytes may lie in a
// client's region.
absl::Status CheckQueryTensors(const v1::Span& s, const std::string& f, int span_index, int64_t n,
                               int64_t h, int64_t w, StepRequest* out, SpanInput* span,
                               const RegionContext* regions, ParseStorage* storage) {
  const bool mx = s.q().dtype() == v1::DTYPE_E4M3;
  const QFormat format = mx ? QFormat::kMxfp8 : QFormat::kBf16;
  if (span_index == 0) {
    out->q_format = format;
  } else if (format != out->q_format) {
    return absl::InvalidArgumentError(
        absl::StrCat(f, ".q: dtype ", v1::DType_Name(s.q().dtype()), ", but spans[0].q is ",
                     out->q_format == QFormat::kMxfp8 ? "DTYPE_E4M3" : "DTYPE_BF16",
                     " (one query format per step)"));
  }
  // MXFP8 codes are checked for NaN on the device (StepExecutor); bf16 queries are not checked.
  auto q = CheckTensor(s.q(), f + ".q", mx ? v1::DTYPE_E4M3 : v1::DTYPE_BF16, {n, h, w}, regions,
                       storage);
  if (!q.ok()) return q.status();
  span->q = *q;
  if (!s.has_q_scales()) return absl::OkStatus();
  auto scales = CheckTensor(s.q_scales(), f + ".q_scales", v1::DTYPE_E8M0,
                            {n, h, w >= 0 ? w / kernels::kMxQueryGroup : -1}, regions, storage);
  if (!scales.ok()) return scales.status();
  span->q_scales = *scales;
  return absl::OkStatus();
}

// Ids are used where they lie when aligned, in a client's region too: the executor copies them
// to the device once, and the translation checks that copy (segment_builder.h), so a client
// rewriting its region can only fail its own step.
std::span<const int32_t> AsInt32(std::span<const uint8_t> bytes, ParseStorage* storage) {
  const size_t n = bytes.size() / 4;
  if (IsAligned(bytes.data(), alignof(int32_t))) {
    return {reinterpret_cast<const int32_t*>(bytes.data()), n};
  }
  // Not value-initialised: every element is copied over.
  auto& copy = storage->int32_copies.emplace_back(new int32_t[std::max<size_t>(n, 1)]);
  if (n > 0) std::memcpy(copy.get(), bytes.data(), n * 4);
  return {copy.get(), n};
}

// A packed request's inputs (StepRequest.packed): one region reference per tensor kind, split
// among `out->spans` (already parsed, tensors unset) in span order.
absl::Status ParsePackedInputs(const StepView& view, const WireModel* model, int64_t total_rows,
                               StepRequest* out, ParseStorage* storage,
                               const RegionContext* regions) {
  const PackedView& p = view.packed;
  if (!RegionsOn(regions)) return RegionsOff("packed");
  if (!p.topk.set && p.topk_width != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed.topk_width: ", p.topk_width, " without packed.topk"));
  }
  if (p.topk.set && p.topk_width <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed.topk_width: ", p.topk_width, ", must be positive"));
  }
  if (!p.kv_rows.set) return absl::InvalidArgumentError("packed.kv_rows: unset");
  if (!p.q.set) return absl::InvalidArgumentError("packed.q: unset");
  // Scale bytes make the queries MXFP8: q then holds one e4m3 code per lane.
  const bool mx = p.q_scales.set;
  out->q_format = mx ? QFormat::kMxfp8 : QFormat::kBf16;
  // An unknown model is the core's NOT_FOUND; without its widths no size can be checked.
  if (model == nullptr) return absl::OkStatus();
  const int64_t row_bytes = int64_t{model->qk_width} * 2;
  auto kv = ResolveRef(p.kv_rows, "packed.kv_rows", total_rows * row_bytes, 2, regions, storage);
  if (!kv.ok()) return kv.status();
  const int64_t q_row = int64_t{model->heads} * model->qk_width * (mx ? 1 : 2);
  auto q = ResolveRef(p.q, "packed.q", total_rows * q_row, mx ? 1 : 2, regions, storage);
  if (!q.ok()) return q.status();
  const int64_t scale_row = int64_t{model->heads} * model->qk_width / kernels::kMxQueryGroup;
  std::span<const uint8_t> q_scales;
  if (mx) {
    auto sc =
        ResolveRef(p.q_scales, "packed.q_scales", total_rows * scale_row, 1, regions, storage);
    if (!sc.ok()) return sc.status();
    q_scales = *sc;
  }
  // Compressed entries split by the layer's ratio; an unknown layer is the core's NOT_FOUND.
  const int32_t layer = view.layer;
  const bool layer_known =
      layer >= 0 && layer < static_cast<int32_t>(model->compression_ratios.size());
  const int32_t ratio = layer_known ? model->compression_ratios[layer] : 0;
  std::span<const uint8_t> compressed;
  if (ratio > 0) {
    int64_t entries = 0;
    for (const SpanInput& s : out->spans) {
      entries += CompressedEntriesAdded(s.first_position, s.num_rows, ratio);
    }
    if (p.compressed_rows.set || entries > 0) {
      if (!p.compressed_rows.set) {
        return absl::InvalidArgumentError(
            absl::StrCat("packed.compressed_rows: unset, the spans complete ", entries,
                         " entries of the 1/", ratio, " cache (", entries * row_bytes, " bytes)"));
      }
      auto c = ResolveRef(p.compressed_rows, "packed.compressed_rows", entries * row_bytes, 2,
                          regions, storage);
      if (!c.ok()) return c.status();
      compressed = *c;
    }
  } else if (layer_known && p.compressed_rows.set && p.compressed_rows.size > 0) {
    return absl::InvalidArgumentError(absl::StrCat("packed.compressed_rows: layer ", layer,
                                                   " has no compressed cache, got ",
                                                   p.compressed_rows.size, " bytes"));
  }
  std::span<const int32_t> topk;
  if (p.topk.set) {
    // Left where they lie, a GPU region too: the executor copies them to the device, where they
    // are translated and checked.
    auto t = ResolveRef(p.topk, "packed.topk", total_rows * p.topk_width * 4, 4, regions, storage);
    if (!t.ok()) return t.status();
    // In place (ResolveRef checked the alignment); AsInt32 says why that is safe.
    topk = AsInt32(*t, storage);
  }
  int64_t row = 0, entry = 0;
  for (SpanInput& s : out->spans) {
    const int64_t n = s.num_rows;
    s.kv_rows = kv->subspan(row * row_bytes, n * row_bytes);
    s.q = q->subspan(row * q_row, n * q_row);
    if (mx) s.q_scales = q_scales.subspan(row * scale_row, n * scale_row);
    if (!compressed.empty()) {
      const int64_t e = CompressedEntriesAdded(s.first_position, s.num_rows, ratio);
      s.compressed_rows = compressed.subspan(entry * row_bytes, e * row_bytes);
      entry += e;
    }
    if (p.topk.set) {
      s.topk = topk.subspan(row * p.topk_width, n * p.topk_width);
      s.topk_width = p.topk_width;
    }
    row += n;
  }
  return absl::OkStatus();
}

// Output regions: all or nothing (out, plus mx_scales for MXFP8 and lse when asked), each of
// exactly the tensor's size.
absl::Status ParseOutputRegions(const OutputsView& o, const WireModel* model, int64_t total_rows,
                                StepRequest* out, ParseStorage* storage,
                                const RegionContext* regions) {
  const bool mx = out->output_format == kernels::OutputFormat::kMxfp8;
  if (!o.out.set) {
    if (o.mx_scales.set) {
      return absl::InvalidArgumentError("mx_scales_region: set without out_region");
    }
    if (o.lse.set) {
      return absl::InvalidArgumentError("lse_region: set without out_region");
    }
    return absl::OkStatus();
  }
  if (!RegionsOn(regions)) return RegionsOff("out_region");
  if (mx != o.mx_scales.set) {
    return absl::InvalidArgumentError(mx ? "mx_scales_region: needed for MXFP8 output"
                                         : "mx_scales_region: set for bf16 output");
  }
  if (out->want_lse != o.lse.set) {
    return absl::InvalidArgumentError(out->want_lse ? "lse_region: needed when want_lse"
                                                    : "lse_region: set without want_lse");
  }
  // An unknown model is the core's NOT_FOUND; without its heads no size can be checked.
  if (model == nullptr) return absl::OkStatus();
  const int64_t cells = total_rows * model->heads;
  auto dst = ResolveRef(o.out, "out_region", cells * kernels::kValueWidth * (mx ? 1 : 2),
                        mx ? 1 : 2, regions, storage);
  if (!dst.ok()) return dst.status();
  out->destination.out = *dst;
  if (mx) {
    auto sc = ResolveRef(o.mx_scales, "mx_scales_region", cells * kernels::kMxGroupsPerHead, 1,
                         regions, storage);
    if (!sc.ok()) return sc.status();
    out->destination.mx_scales = *sc;
  }
  if (out->want_lse) {
    auto l = ResolveRef(o.lse, "lse_region", cells * 4, 4, regions, storage);
    if (!l.ok()) return l.status();
    out->destination.lse = *l;
  }
  return absl::OkStatus();
}

// The request's own fields and its spans' ids, positions, rows and roles, then the step's
// extent (ValidateStepExtent), which sizes every tensor.
absl::Status ParseHeader(const StepView& view, const Limits& limits, StepRequest* out) {
  // Over-long ids are refused before they are copied anywhere.
  if (absl::Status st = CheckStepIds(view); !st.ok()) return st;
  out->request_id = view.request_id;
  out->model = view.model;
  out->layer = view.layer;
  switch (view.output_format) {
    case v1::OUTPUT_FORMAT_BF16:
      out->output_format = kernels::OutputFormat::kBf16;
      break;
    case v1::OUTPUT_FORMAT_MXFP8:
      out->output_format = kernels::OutputFormat::kMxfp8;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("output_format: unknown value ", view.output_format));
  }
  out->want_lse = view.outputs.want_lse;
  out->inverse_rope = view.inverse_rope;
  out->spans.clear();
  out->spans.reserve(view.spans.size());
  for (size_t i = 0; i < view.spans.size(); ++i) {
    const SpanView& s = view.spans[i];
    SpanInput& span = out->spans.emplace_back();
    span.sequence_id = s.sequence_id;
    span.first_position = s.first_position;
    span.num_rows = s.num_rows;
    span.roles.reserve(s.roles.size());
    for (size_t r = 0; r < s.roles.size(); ++r) {
      const int role = s.roles[r];
      if (role != v1::ROW_ROLE_VERIFY && role != v1::ROW_ROLE_DRAFT) {
        return absl::InvalidArgumentError(
            absl::StrCat("spans[", i, "].roles[", r, "]: unknown role ", role));
      }
      span.roles.push_back(role == v1::ROW_ROLE_DRAFT ? RowRole::kDraft : RowRole::kVerify);
    }
  }
  // Tensors are sized from the spans' rows and positions: those are bounded first, by the
  // core's rules.
  return ValidateStepExtent(*out, limits);
}

// A packed request's tensors once its header is parsed.
absl::Status ParsePackedTensors(const StepView& view, const WireModel* model, StepRequest* out,
                                ParseStorage* storage, const RegionContext* regions) {
  const int64_t total_rows = StepRows(*out);
  absl::Status st = ParsePackedInputs(view, model, total_rows, out, storage, regions);
  if (!st.ok()) return st;
  return ParseOutputRegions(view.outputs, model, total_rows, out, storage, regions);
}

}  // namespace

WireModel MakeWireModel(int32_t heads, const ModelProfile& profile) {
  WireModel m{heads, kernels::QkWidth(profile.geometry), {}};
  for (const LayerSpec& l : profile.layers) {
    m.compression_ratios.push_back(l.has_compressed() ? l.ratio : 0);
  }
  return m;
}

void ParseStorage::KeepOutputs(const OutputsView& o) {
  outputs = o;
  RefView* refs[] = {&outputs.out, &outputs.mx_scales, &outputs.lse};
  for (int i = 0; i < 3; ++i) {
    output_names[i].assign(refs[i]->region);
    refs[i]->region = output_names[i];
  }
}

absl::Status ParseStepView(const StepView& view, const WireModel* model, const Limits& limits,
                           StepRequest* out, ParseStorage* storage, const RegionContext* regions) {
  storage->KeepOutputs(view.outputs);
  if (absl::Status st = ParseHeader(view, limits, out); !st.ok()) return st;
  return ParsePackedTensors(view, model, out, storage, regions);
}

absl::Status ParseStepRequest(const v1::StepRequest& pb, const WireModel* model,
                              const Limits& limits, StepRequest* out, ParseStorage* storage,
                              const RegionContext* regions) {
  StepView view;
  ViewOf(pb, &view);
  storage->outputs = view.outputs;
  if (absl::Status st = ParseHeader(view, limits, out); !st.ok()) return st;
  if (pb.has_packed()) {
    // The packed ranges carry every span's tensors: the spans must carry none.
    for (int i = 0; i < pb.spans_size(); ++i) {
      const v1::Span& s = pb.spans(i);
      for (const auto& [set, name] :
           {std::pair{s.has_kv_rows(), "kv_rows"}, std::pair{s.has_q(), "q"},
            std::pair{s.has_compressed_rows(), "compressed_rows"}, std::pair{s.has_topk(), "topk"},
            std::pair{s.has_q_scales(), "q_scales"}}) {
        if (set) {
          return absl::InvalidArgumentError(absl::StrCat("spans[", i, "].", name,
                                                         ": set in a packed request (packed.", name,
                                                         " carries every span's)"));
        }
      }
    }
    return ParsePackedTensors(view, model, out, storage, regions);
  }
  const int64_t total_rows = StepRows(*out);
  const int64_t w = model ? model->qk_width : -1;
  const int64_t h = model ? model->heads : -1;
  for (int i = 0; i < pb.spans_size(); ++i) {
    const v1::Span& s = pb.spans(i);
    const std::string f = absl::StrCat("spans[", i, "]");
    SpanInput& span = out->spans[i];
    const int64_t n = span.num_rows;
    auto kv = CheckTensor(s.kv_rows(), f + ".kv_rows", v1::DTYPE_BF16, {n, w}, regions, storage);
    if (!kv.ok()) return kv.status();
    span.kv_rows = *kv;
    if (absl::Status st = CheckQueryTensors(s, f, i, n, h, w, out, &span, regions, storage);
        !st.ok()) {
      return st;
    }
    if (s.has_compressed_rows()) {
      // Width of compressed entries equals the row width; their count is the core's to check.
      const int64_t cw = w >= 0 ? w : (s.kv_rows().shape_size() == 2 ? s.kv_rows().shape(1) : -1);
      auto c = CheckTensor(s.compressed_rows(), f + ".compressed_rows", v1::DTYPE_BF16, {-1, cw},
                           regions, storage);
      if (!c.ok()) return c.status();
      span.compressed_rows = *c;
    }
    if (s.has_topk()) {
      auto t = CheckTensor(s.topk(), f + ".topk", v1::DTYPE_INT32, {n, -1}, regions, storage);
      if (!t.ok()) return t.status();
      span.topk = AsInt32(*t, storage);
      span.topk_width = static_cast<int32_t>(s.topk().shape(1));
    }
  }
  return ParseOutputRegions(view.outputs, model, total_rows, out, storage, regions);
}

namespace {

void SetRegion(const RefView& ref, v1::Tensor* t) {
  v1::RegionRef* r = t->mutable_region();
  r->set_region(ref.region.data(), ref.region.size());
  r->set_offset(ref.offset);
  r->set_size(ref.size);
}

}  // namespace

void FillStepResponse(const StepResult& result, v1::StepResponse* pb, const OutputsView* request,
                      bool staged) {
  const bool to_regions = request != nullptr && request->out.set;
  const int64_t t = result.num_rows;
  const int64_t h = result.num_heads;
  v1::Tensor* out = pb->mutable_out();
  if (result.output_format == kernels::OutputFormat::kMxfp8) {
    out->set_dtype(v1::DTYPE_E4M3);
    out->add_shape(t);
    out->add_shape(h * kernels::kValueWidth);
    v1::Tensor* sc = pb->mutable_mx_scales();
    sc->set_dtype(v1::DTYPE_E8M0);
    sc->add_shape(t);
    sc->add_shape(h * kernels::kMxGroupsPerHead);
    if (to_regions) {
      SetRegion(request->mx_scales, sc);
    } else if (!staged) {
      sc->set_inline_data(result.mx_scales.data(), result.mx_scales.size());
    }
  } else {
    out->set_dtype(v1::DTYPE_BF16);
    out->add_shape(t);
    out->add_shape(h);
    out->add_shape(kernels::kValueWidth);
  }
  if (to_regions) {
    SetRegion(request->out, out);
  } else if (!staged) {
    out->set_inline_data(result.out.data(), result.out.size());
  }
  if (to_regions && request->want_lse) {
    v1::Tensor* lse = pb->mutable_lse();
    lse->set_dtype(v1::DTYPE_F32);
    lse->add_shape(t);
    lse->add_shape(h);
    SetRegion(request->lse, lse);
  } else if (!result.lse.empty() || (staged && request != nullptr && request->want_lse)) {
    v1::Tensor* lse = pb->mutable_lse();
    lse->set_dtype(v1::DTYPE_F32);
    lse->add_shape(t);
    lse->add_shape(h);
    if (!staged) lse->set_inline_data(result.lse.data(), result.lse.size() * sizeof(float));
  }
  v1::StepTimings* tm = pb->mutable_timings();
  tm->set_queued_us(absl::ToInt64Microseconds(result.timings.queued));
  tm->set_kernel_us(absl::ToInt64Microseconds(result.timings.kernel));
  tm->set_prep_us(absl::ToInt64Microseconds(result.timings.prep));
  tm->set_copy_in_us(absl::ToInt64Microseconds(result.timings.copy_in));
  if (result.timings.phases) {
    tm->set_phases_measured(true);
    tm->set_attend_us(absl::ToInt64Microseconds(result.timings.attend));
    tm->set_copy_out_us(absl::ToInt64Microseconds(result.timings.copy_out));
  }
  tm->set_batch_us(absl::ToInt64Microseconds(result.timings.batch));
  tm->set_batch_requests(result.timings.batch_requests);
  tm->set_batch_rows(result.timings.batch_rows);
}

absl::StatusOr<std::vector<float>> ParseF32Tensor(const v1::Tensor& t, const std::string& field,
                                                  const std::vector<int64_t>& shape) {
  auto bytes = CheckTensor(t, field, v1::DTYPE_F32, shape);
  if (!bytes.ok()) return bytes.status();
  std::vector<float> v(bytes->size() / 4);
  if (!v.empty()) std::memcpy(v.data(), bytes->data(), bytes->size());
  return v;
}

}  // namespace smla::server::edge
