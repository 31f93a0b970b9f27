// The `_smla` extension module: bindings over the C++ client library (client/include/smla/
// client/). The Python package `smla` (client/python/smla/) re-exports it.
#include "common.h"

PYBIND11_MODULE(_smla, m) {
  m.doc() = "SMLA client bindings (see the smla package)";
  m.attr("__version__") = SMLA_VERSION;
  smla::python::RegisterErrors(m);
  smla::python::RegisterClient(m);
  smla::python::RegisterRequests(m);
  smla::python::RegisterRegions(m);
  smla::python::RegisterCluster(m);
}
