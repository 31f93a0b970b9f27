// absl/gRPC status codes -> the exception classes of smla/errors.py. The classes live in
// Python (documented, picklable, subclassable); this side only picks one by code.
#include "common.h"

namespace smla::python {

void RegisterErrors(py::module_& m) {
  // By value: pybind11's translator type is void (*)(std::exception_ptr).
  // NOLINTNEXTLINE(performance-unnecessary-value-param)
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object errors = py::module_::import("smla.errors");
      py::object exc = errors.attr("from_status")(static_cast<int>(e.status.code()),
                                                  std::string(e.status.message()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });
  // Raises the exception of `code` (tests, and frontends relaying a status of their own).
  m.def(
      "_raise_status",
      [](int code, const std::string& message) {
        throw StatusError(absl::Status(static_cast<absl::StatusCode>(code), message));
      },
      py::arg("code"), py::arg("message"));
}

}  // namespace smla::python
