// Shared pieces of the `_smla` extension: the Python-side holders of the C++ client objects,
// and the status -> exception bridge. Each Register* function binds one concern.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "smla/client/client.h"

namespace smla::python {

namespace py = pybind11;

// A failed absl::Status on its way to Python; the translator registered by RegisterErrors
// raises it as the smla.errors class of its code, with the server's message.
struct StatusError : std::exception {
  explicit StatusError(absl::Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "smla status error"; }
  absl::Status status;
};

inline void CheckOk(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status);
}
template <typename T>
T Unwrap(absl::StatusOr<T>&& value) {
  if (!value.ok()) throw StatusError(value.status());
  return *std::move(value);
}
// A step's own outcome on a stream or ring (a google.rpc.Code and its message).
inline void CheckCode(int32_t code, const std::string& message) {
  if (code != 0) throw StatusError(absl::Status(static_cast<absl::StatusCode>(code), message));
}

// pybind11 before 2.12 reads a dtype's element size from NumPy 1's struct layout, which NumPy 2
// changed (it then reads 0), so sizes, byte counts and the strides of arrays made here come from
// Python's attributes, right under NumPy 1 and 2 alike.
inline ssize_t ItemSize(const py::handle& dtype_or_array) {
  return dtype_or_array.attr("itemsize").cast<ssize_t>();
}
inline char Kind(const py::array& a) { return a.dtype().attr("kind").cast<std::string>()[0]; }
// A C-contiguous array of `shape` over `data`, whose lifetime `base` keeps.
inline py::array CArray(const py::dtype& dtype, const std::vector<ssize_t>& shape, void* data,
                        const py::handle& base) {
  std::vector<ssize_t> strides(shape.size());
  ssize_t step = ItemSize(dtype);
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    step *= shape[i];
  }
  return py::array(dtype, shape, strides, data, base);
}

// Seconds from Python (None = `none`) as an absl::Duration.
inline absl::Duration Seconds(const py::object& seconds, absl::Duration none) {
  if (seconds.is_none()) return none;
  const double s = seconds.cast<double>();
  if (s < 0) throw py::value_error("timeout must be >= 0 seconds");
  return absl::Seconds(s);
}

// A connection. Owned, or borrowed from a Cluster (`keep` then holds the cluster alive).
struct PyClient {
  std::unique_ptr<client::Client> owned;
  client::Client* client = nullptr;
  std::shared_ptr<void> keep;
};

// The step stream of a client (which it keeps alive).
struct PyStream {
  std::shared_ptr<PyClient> client;
  std::unique_ptr<client::StepStream> stream;
  bool ended = false;
};

void RegisterErrors(py::module_& m);
void RegisterRequests(py::module_& m);
void RegisterClient(py::module_& m);
void RegisterRegions(py::module_& m);
void RegisterCluster(py::module_& m);

// The client options from keyword arguments (target, timeout, tls, tls_ca, tls_cert, tls_key,
// tls_server_name, token, max_message_bytes, grpc_args, keep_freed_memory); unknown names
// raise TypeError.
client::ClientOptions OptionsFromKwargs(const py::kwargs& kwargs);

// A protobuf message as nested dicts/lists (enums by name, 64-bit integers as int).
py::object MessageToDict(const google::protobuf::Message& message);

}  // namespace smla::python
