// Step requests built from Python tensors, and step results as NumPy arrays.
#pragma once

#include <memory>

#include "common.h"
#include "smla/v1/step.pb.h"

namespace smla::python {

// One span's arguments, converted when a StepRequest is built from it.
struct PySpan {
  std::string sequence_id;
  int64_t first_position = 0;
  py::object kv_rows, q, compressed_rows, topk, q_scales, roles;
  int32_t drafts = 0;
};

struct PyRequest {
  v1::StepRequest request;
  // Caller buffers outside every region: the response's bytes are copied into them. Buffers
  // inside a region are named in out_region etc. and written by the server; both kinds are
  // what the result returns.
  py::object out = py::none(), mx_scales = py::none(), lse = py::none();
  bool out_copy = false, mx_scales_copy = false, lse_copy = false;
};

struct PyResult {
  std::shared_ptr<v1::StepResponse> response;
  // The caller buffers the request named, else None.
  py::object out = py::none(), mx_scales = py::none(), lse = py::none();
};
inline PyResult BareResult(std::shared_ptr<v1::StepResponse> response) {
  PyResult r;
  r.response = std::move(response);
  return r;
}

// The result of `response` to `request` (copies into the request's non-region buffers).
PyResult MakeResult(std::shared_ptr<v1::StepResponse> response, const PyRequest& request);

}  // namespace smla::python
