#include "requests.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "smla/client/shm.h"
#include "tensors.h"

namespace smla::python {
namespace {

v1::OutputFormat ParseFormat(const std::string& f) {
  if (f == "bf16") return v1::OUTPUT_FORMAT_BF16;
  if (f == "mxfp8") return v1::OUTPUT_FORMAT_MXFP8;
  throw py::value_error("output_format must be 'bf16' or 'mxfp8', got '" + f + "'");
}

void FillSpan(const PySpan& in, size_t index, v1::Span* s) {
  const std::string at = absl::StrCat("spans[", index, "].");
  s->set_sequence_id(in.sequence_id);
  s->set_first_position(in.first_position);
  HostTensor kv = ReadTensor(in.kv_rows, Want::kBf16, at + "kv_rows");
  if (kv.shape.empty()) throw py::value_error(at + "kv_rows: needs a shape [rows, W]");
  const int64_t rows = kv.shape[0];
  s->set_num_rows(static_cast<int32_t>(rows));
  PutTensor(kv, v1::DTYPE_BF16, s->mutable_kv_rows());
  if (in.q_scales.is_none()) {
    PutTensor(ReadTensor(in.q, Want::kBf16, at + "q"), v1::DTYPE_BF16, s->mutable_q());
  } else {
    PutTensor(ReadTensor(in.q, Want::kU8, at + "q"), v1::DTYPE_E4M3, s->mutable_q());
    PutTensor(ReadTensor(in.q_scales, Want::kU8, at + "q_scales"), v1::DTYPE_E8M0,
              s->mutable_q_scales());
  }
  if (!in.compressed_rows.is_none()) {
    PutTensor(ReadTensor(in.compressed_rows, Want::kBf16, at + "compressed_rows"), v1::DTYPE_BF16,
              s->mutable_compressed_rows());
  }
  if (!in.topk.is_none()) {
    PutTensor(ReadTensor(in.topk, Want::kInt32, at + "topk"), v1::DTYPE_INT32, s->mutable_topk());
  }
  if (!in.roles.is_none()) {
    for (py::handle r : in.roles) {
      s->add_roles(r.cast<int>() != 0 ? v1::ROW_ROLE_DRAFT : v1::ROW_ROLE_VERIFY);
    }
  } else if (in.drafts > 0) {
    if (in.drafts > rows) throw py::value_error(at + "drafts: more than the span's rows");
    for (int64_t i = 0; i < rows; ++i) {
      s->add_roles(i >= rows - in.drafts ? v1::ROW_ROLE_DRAFT : v1::ROW_ROLE_VERIFY);
    }
  }
}

// An output buffer: its RegionRef when it lies in a region (the server writes it there),
// else nullopt (the response is copied in).
std::optional<v1::RegionRef> TakeBuffer(const py::object& buffer, Want want, const char* what) {
  if (py::isinstance<py::array>(buffer) && !py::array(buffer).writeable()) {
    throw py::type_error(std::string(what) + ": read-only");
  }
  return RegionRefOf(ReadTensor(buffer, want, what, /*convert=*/false));
}

// Copies a response tensor's inline bytes into the caller's buffer.
void CopyOut(const py::object& buffer, Want want, const v1::Tensor& t, const char* what) {
  HostTensor h = ReadTensor(buffer, want, what, false);
  const std::string& bytes = t.inline_data();
  if (t.has_region() || bytes.size() != h.bytes) {
    throw py::value_error(
        absl::StrCat(what, ": the buffer holds ", h.bytes, " bytes, the response ", bytes.size()));
  }
  std::memcpy(const_cast<uint8_t*>(h.data), bytes.data(), bytes.size());
}

std::shared_ptr<PyRequest> MakeRequest(const std::string& model, int32_t layer,
                                       const std::vector<PySpan>& spans,
                                       const std::string& output_format, bool want_lse,
                                       bool inverse_rope, int64_t timeout_us,
                                       const std::string& request_id, const py::object& out,
                                       const py::object& mx_scales_out, const py::object& lse_out) {
  auto r = std::make_shared<PyRequest>();
  v1::StepRequest& q = r->request;
  q.set_model(model);
  q.set_layer(layer);
  q.set_output_format(ParseFormat(output_format));
  q.set_want_lse(want_lse);
  q.set_inverse_rope(inverse_rope);
  q.set_timeout_us(timeout_us);
  q.set_request_id(request_id);
  for (size_t i = 0; i < spans.size(); ++i) FillSpan(spans[i], i, q.add_spans());
  const bool mx = q.output_format() == v1::OUTPUT_FORMAT_MXFP8;
  if (!out.is_none()) {
    auto ref = TakeBuffer(out, mx ? Want::kU8 : Want::kBf16, "out");
    if (ref) *q.mutable_out_region() = *ref;
    r->out_copy = !ref;
    r->out = out;
  }
  if (!mx_scales_out.is_none()) {
    auto ref = TakeBuffer(mx_scales_out, Want::kU8, "mx_scales_out");
    if (ref) *q.mutable_mx_scales_region() = *ref;
    r->mx_scales_copy = !ref;
    r->mx_scales = mx_scales_out;
  }
  if (!lse_out.is_none()) {
    auto ref = TakeBuffer(lse_out, Want::kF32, "lse_out");
    if (ref) *q.mutable_lse_region() = *ref;
    r->lse_copy = !ref;
    r->lse = lse_out;
  }
  return r;
}

client::ShmRegion::Layout ParseLayout(const std::string& layout) {
  if (layout == "per_span") return client::ShmRegion::Layout::kPerSpan;
  if (layout == "packed") return client::ShmRegion::Layout::kPacked;
  throw py::value_error("layout must be 'per_span' or 'packed', got '" + layout + "'");
}

}  // namespace

PyResult MakeResult(std::shared_ptr<v1::StepResponse> response, const PyRequest& request) {
  PyResult r;
  const bool mx = request.request.output_format() == v1::OUTPUT_FORMAT_MXFP8;
  if (request.out_copy && response->has_out()) {
    CopyOut(request.out, mx ? Want::kU8 : Want::kBf16, response->out(), "out");
  }
  if (request.mx_scales_copy && response->has_mx_scales()) {
    CopyOut(request.mx_scales, Want::kU8, response->mx_scales(), "mx_scales_out");
  }
  if (request.lse_copy && response->has_lse()) {
    CopyOut(request.lse, Want::kF32, response->lse(), "lse_out");
  }
  if (response->code() == 0) {
    r.out = request.out;
    r.mx_scales = request.mx_scales;
    r.lse = request.lse;
  }
  r.response = std::move(response);
  return r;
}

void RegisterRequests(py::module_& m) {
  m.attr("ROW_VERIFY") = static_cast<int>(v1::ROW_ROLE_VERIFY);
  m.attr("ROW_DRAFT") = static_cast<int>(v1::ROW_ROLE_DRAFT);

  py::class_<PySpan>(m, "Span", R"(Rows of one sequence at consecutive positions.

kv_rows: bf16 [rows, W]; q: bf16 [rows, H, W], or e4m3 codes (uint8) with q_scales (uint8
[rows, H, W/32]); compressed_rows: bf16 [n, W]; topk: int32 [rows, K]. bf16 tensors are uint16
bit patterns, DLPack bfloat16 tensors, or float32 (rounded to nearest even, a copy). roles: one
of ROW_VERIFY / ROW_DRAFT per row, or drafts=k for the last k rows.)")
      .def(py::init([](const py::object& sequence, int64_t first_position, py::object kv_rows,
                       py::object q, py::object compressed_rows, py::object topk,
                       py::object q_scales, py::object roles, int32_t drafts) {
             PySpan s;
             s.sequence_id = py::isinstance<py::str>(sequence)
                                 ? sequence.cast<std::string>()
                                 : sequence.attr("id").cast<std::string>();
             s.first_position = first_position;
             s.kv_rows = std::move(kv_rows);
             s.q = std::move(q);
             s.compressed_rows = std::move(compressed_rows);
             s.topk = std::move(topk);
             s.q_scales = std::move(q_scales);
             s.roles = std::move(roles);
             s.drafts = drafts;
             return s;
           }),
           py::arg("sequence"), py::arg("first_position"), py::arg("kv_rows"), py::arg("q"),
           py::kw_only(), py::arg("compressed_rows") = py::none(), py::arg("topk") = py::none(),
           py::arg("q_scales") = py::none(), py::arg("roles") = py::none(), py::arg("drafts") = 0)
      .def_readwrite("sequence_id", &PySpan::sequence_id)
      .def_readwrite("first_position", &PySpan::first_position)
      .def_readwrite("kv_rows", &PySpan::kv_rows)
      .def_readwrite("q", &PySpan::q)
      .def_readwrite("compressed_rows", &PySpan::compressed_rows)
      .def_readwrite("topk", &PySpan::topk)
      .def_readwrite("q_scales", &PySpan::q_scales)
      .def_readwrite("roles", &PySpan::roles)
      .def_readwrite("drafts", &PySpan::drafts);

  py::class_<PyRequest, std::shared_ptr<PyRequest>>(m, "StepRequest", R"(One step on one layer.

Tensors are read when the request is built: those inside a registered Region travel by
reference (nothing copied), others are copied once into the message. out / mx_scales_out /
lse_out name caller buffers for the outputs (inside a region: the server writes them there;
elsewhere: the response is copied in); the result then returns those buffers.)")
      .def(py::init(&MakeRequest), py::arg("model"), py::arg("layer"), py::arg("spans"),
           py::kw_only(), py::arg("output_format") = "bf16", py::arg("want_lse") = false,
           py::arg("inverse_rope") = false, py::arg("timeout_us") = 0, py::arg("request_id") = "",
           py::arg("out") = py::none(), py::arg("mx_scales_out") = py::none(),
           py::arg("lse_out") = py::none())
      .def_property_readonly("model", [](const PyRequest& r) { return r.request.model(); })
      .def_property_readonly("layer", [](const PyRequest& r) { return r.request.layer(); })
      .def_property(
          "request_id", [](const PyRequest& r) { return r.request.request_id(); },
          [](PyRequest& r, const std::string& id) { r.request.set_request_id(id); })
      .def_property_readonly("num_spans", [](const PyRequest& r) { return r.request.spans_size(); })
      .def_property_readonly("num_rows",
                             [](const PyRequest& r) {
                               int64_t n = 0;
                               for (const auto& s : r.request.spans()) n += s.num_rows();
                               return n;
                             })
      .def(
          "set_span",
          [](PyRequest& r, int index, const py::object& sequence,
             const py::object& first_position) {
            if (index < 0 || index >= r.request.spans_size()) throw py::index_error("span");
            v1::Span* s = r.request.mutable_spans(index);
            if (!sequence.is_none()) {
              s->set_sequence_id(py::isinstance<py::str>(sequence)
                                     ? sequence.cast<std::string>()
                                     : sequence.attr("id").cast<std::string>());
            }
            if (!first_position.is_none()) s->set_first_position(first_position.cast<int64_t>());
          },
          py::arg("index"), py::arg("sequence") = py::none(),
          py::arg("first_position") = py::none(),
          "Re-aims span `index` (another sequence or first position), keeping its tensors.")
      .def(
          "place",
          [](PyRequest& r, const std::shared_ptr<PyRegion>& region, uint64_t offset,
             const std::string& layout) {
            if (!region->region) throw py::value_error("region: closed");
            uint64_t end = Unwrap(region->region->Place(&r.request, offset, ParseLayout(layout)));
            // The outputs now go to the region; results are views of it.
            r.out = r.mx_scales = r.lse = py::none();
            r.out_copy = r.mx_scales_copy = r.lse_copy = false;
            return end;
          },
          py::arg("region"), py::arg("offset") = 0, py::arg("layout") = "per_span",
          R"(Moves the inline inputs into `region` from `offset` on (ShmRegion::Place) and
points the outputs there; returns the end offset. layout: 'per_span' or 'packed' (the form
the step ring takes). Results of a placed request are views of the region, valid until the
next step placed at the same offset.)")
      .def(
          "bytes_for", [](const PyRequest& r) { return client::ShmRegion::BytesFor(r.request); },
          "Bytes place() needs for this request.")
      .def(
          "byte_size", [](const PyRequest& r) { return r.request.ByteSizeLong(); },
          "The serialized request's size (what a ring slot must hold).")
      .def("uses_regions",
           [](const PyRequest& r) {
             // Whether any tensor travels by reference.
             for (const auto& s : r.request.spans()) {
               for (const v1::Tensor* t :
                    {&s.kv_rows(), &s.q(), &s.compressed_rows(), &s.topk(), &s.q_scales()}) {
                 if (t->has_region()) return true;
               }
             }
             return r.request.has_packed() || r.request.has_out_region();
           })
      .def("debug_string", [](const PyRequest& r) {
        std::string text;
        google::protobuf::TextFormat::PrintToString(r.request, &text);
        return text;
      });

  py::class_<PyResult>(m, "StepResult", R"(A step's outputs.

out: bf16 [T, H, 512] as uint16 bits (smla.bf16_to_float32), or MXFP8 e4m3 codes [T, H*512]
with mx_scales [T, H*16] (smla.decode_mxfp8); lse: float32 [T, H] when asked. Arrays view the
response's own bytes, or the region the outputs were written to (valid until that range is
reused), or are the caller's buffers.)")
      .def_property_readonly("out",
                             [](const PyResult& r) -> py::object {
                               if (!r.out.is_none()) return r.out;
                               if (!r.response->has_out()) return py::none();
                               return TensorView(r.response->out(), r.response);
                             })
      .def_property_readonly("mx_scales",
                             [](const PyResult& r) -> py::object {
                               if (!r.mx_scales.is_none()) return r.mx_scales;
                               if (!r.response->has_mx_scales()) return py::none();
                               return TensorView(r.response->mx_scales(), r.response);
                             })
      .def_property_readonly("lse",
                             [](const PyResult& r) -> py::object {
                               if (!r.lse.is_none()) return r.lse;
                               if (!r.response->has_lse()) return py::none();
                               return TensorView(r.response->lse(), r.response);
                             })
      .def_property_readonly("request_id",
                             [](const PyResult& r) { return r.response->request_id(); })
      .def_property_readonly("timings",
                             [](const PyResult& r) { return MessageToDict(r.response->timings()); })
      .def_property_readonly("code", [](const PyResult& r) { return r.response->code(); })
      .def_property_readonly("message", [](const PyResult& r) { return r.response->message(); });
}

}  // namespace smla::python
