// smla.Region (a sealed memfd registered with a server: shm.h) and smla.StepRing
// (step_ring.h): the same C++ objects the C++ client uses, held for Python.
#include <chrono>
#include <map>

#include "absl/strings/str_cat.h"
#include "requests.h"
#include "smla/client/step_ring.h"
#include "tensors.h"

namespace smla::python {
namespace {

struct PyRing {
  std::shared_ptr<PyStream> stream;
  std::shared_ptr<PyRegion> region;
  std::unique_ptr<client::StepRing> ring;
  // Requests awaiting their response, by ticket (their caller buffers).
  std::map<uint64_t, std::shared_ptr<PyRequest>> pending;
  ~PyRing() { ring.reset(); }
};

client::ShmRegion& Live(const PyRegion& r) {
  if (!r.region) throw py::value_error("region: closed");
  return *r.region;
}

py::array View(const std::shared_ptr<PyRegion>& r, uint64_t offset, const py::object& shape,
               const py::object& dtype) {
  client::ShmRegion& region = Live(*r);
  py::dtype dt = py::dtype::from_args(dtype);
  std::vector<ssize_t> dims;
  if (py::isinstance<py::int_>(shape)) {
    dims.push_back(shape.cast<ssize_t>());
  } else {
    for (py::handle d : shape) dims.push_back(d.cast<ssize_t>());
  }
  const auto item = static_cast<uint64_t>(ItemSize(dt));
  uint64_t bytes = item;
  for (ssize_t d : dims) {
    if (d < 0) throw py::value_error("shape: negative dimension");
    bytes *= static_cast<uint64_t>(d);
  }
  if (offset % item != 0) {
    throw py::value_error("offset: not a multiple of the element size");
  }
  if (offset > region.size() || bytes > region.size() - offset) {
    throw py::value_error(absl::StrCat("region ", region.name(), " of ", region.size(),
                                       " bytes has no ", bytes, " bytes at offset ", offset));
  }
  auto* keep = new std::shared_ptr<PyRegion>(r);
  py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<PyRegion>*>(p); });
  return CArray(dt, dims, region.data() + offset, base);
}

PyResult Wait(PyRing& r, uint64_t ticket, absl::Duration timeout) {
  auto response = std::make_shared<v1::StepResponse>();
  absl::Status st;
  {
    py::gil_scoped_release release;
    st = r.ring->Wait(ticket, response.get(), timeout);
  }
  std::shared_ptr<PyRequest> request;
  if (auto it = r.pending.find(ticket);
      it != r.pending.end() && st.code() != absl::StatusCode::kDeadlineExceeded) {
    request = std::move(it->second);
    r.pending.erase(it);
  }
  CheckOk(st);
  CheckCode(response->code(), response->message());
  if (!request) return BareResult(std::move(response));
  return MakeResult(std::move(response), *request);
}

uint64_t Submit(PyRing& r, const std::shared_ptr<PyRequest>& request) {
  uint64_t ticket;
  {
    py::gil_scoped_release release;
    ticket = Unwrap(r.ring->Submit(request->request));
  }
  if (request->out_copy || request->mx_scales_copy || request->lse_copy) {
    r.pending[ticket] = request;
  }
  return ticket;
}

}  // namespace

void RegisterRegions(py::module_& m) {
  py::class_<PyRegion, std::shared_ptr<PyRegion>>(m, "Region",
                                                  R"(Shared memory registered with a server.

Region(client, label, size): a sealed memfd of `size` bytes, handed over to and registered with
the server behind `client` (same host, --allow_shm). Arrays from array() view it; tensors in it
travel by reference (RegionRef) in any StepRequest, and output buffers in it are written by the
server in place. The registration lasts until unregister() or until the region is dropped.)")
      .def(
          py::init([](const std::shared_ptr<PyClient>& c, const std::string& label, uint64_t size) {
            auto r = std::make_shared<PyRegion>();
            r->client = c;
            {
              py::gil_scoped_release release;
              r->region = Unwrap(client::ShmRegion::Create(c->client, label, size));
            }
            AddRegion(r);
            return r;
          }),
          py::arg("client"), py::arg("label"), py::arg("size"))
      .def_property_readonly("name", [](const PyRegion& r) { return Live(r).name(); })
      .def_property_readonly("size", [](const PyRegion& r) { return Live(r).size(); })
      .def_property_readonly("fd", [](const PyRegion& r) { return Live(r).fd(); })
      .def("array", &View, py::arg("offset"), py::arg("shape"), py::arg("dtype"),
           "A writable NumPy view of the region: `shape` of `dtype` at `offset` bytes.")
      .def(
          "unregister",
          [](PyRegion& r) {
            client::ShmRegion& region = Live(r);
            py::gil_scoped_release release;
            CheckOk(region.Unregister());
          },
          "Ends the registration; later steps naming the region fail with NotFound.")
      .def("__repr__", [](const PyRegion& r) {
        return r.region ? absl::StrCat("smla.Region(name='", r.region->name(),
                                       "', size=", r.region->size(), ")")
                        : std::string("smla.Region(closed)");
      });

  py::class_<PyRing, std::shared_ptr<PyRing>>(m, "StepRing", R"(A step ring attached to a stream.

StepRing(stream, region, offset, slots, slot_bytes) lays the ring out in `region` at `offset`
and attaches it to `stream` (which must have no request outstanding). Requests on the ring must
name regions for every tensor (StepRequest.place(region, layout='packed'), or tensors built
from region arrays); the stream, region and ring must stay alive together. One thread at a time.)")
      .def(py::init([](const std::shared_ptr<PyStream>& stream,
                       const std::shared_ptr<PyRegion>& region, uint64_t offset, uint32_t slots,
                       uint32_t slot_bytes) {
             auto r = std::make_shared<PyRing>();
             r->stream = stream;
             r->region = region;
             client::ShmRegion& shm = Live(*region);
             py::gil_scoped_release release;
             r->ring = Unwrap(
                 client::StepRing::Attach(stream->stream.get(), &shm, offset, slots, slot_bytes));
             return r;
           }),
           py::arg("stream"), py::arg("region"), py::arg("offset"), py::arg("slots"),
           py::arg("slot_bytes"))
      .def_static("bytes_for", &client::StepRing::BytesFor, py::arg("slots"), py::arg("slot_bytes"),
                  "Bytes a ring of `slots` slots takes in a region.")
      .def("submit", &Submit, py::arg("request"),
           "Writes the request into the next slot; returns its ticket. ResourceExhausted when "
           "more than `slots` are in flight.")
      .def(
          "wait",
          [](PyRing& r, uint64_t ticket, double timeout) {
            return Wait(r, ticket, absl::Seconds(timeout));
          },
          py::arg("ticket"), py::arg("timeout") = 60.0,
          "The StepResult of `ticket`; raises the step's error, DeadlineExceeded after "
          "`timeout` seconds, Unavailable once the server closed the ring.")
      .def(
          "call",
          [](PyRing& r, const std::shared_ptr<PyRequest>& request, double timeout) {
            return Wait(r, Submit(r, request), absl::Seconds(timeout));
          },
          py::arg("request"), py::arg("timeout") = 60.0, "submit() then wait().")
      .def(
          "set_spin", [](PyRing& r, double us) { r.ring->set_spin(absl::Microseconds(us)); },
          py::arg("microseconds"),
          "How long wait() spins before sleeping on the slot's futex word (default 30 us).")
      .def_property_readonly("slots", [](const PyRing& r) { return r.ring->slots(); })
      .def_property_readonly("slot_bytes", [](const PyRing& r) { return r.ring->slot_bytes(); })
      .def_property_readonly("next_ticket", [](const PyRing& r) { return r.ring->next_ticket(); })
      .def(
          "_time_cpp_calls",
          [](PyRing& r, const std::shared_ptr<PyRequest>& request, int calls) {
            // The C++ client's own loop on this ring, for bench/: per-call nanoseconds.
            std::vector<int64_t> ns;
            ns.reserve(calls);
            py::gil_scoped_release release;
            v1::StepResponse response;
            for (int i = 0; i < calls; ++i) {
              const auto t0 = std::chrono::steady_clock::now();
              CheckOk(r.ring->Call(request->request, &response));
              ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - t0)
                               .count());
              CheckCode(response.code(), response.message());
            }
            return ns;
          },
          py::arg("request"), py::arg("calls"));
}

}  // namespace smla::python
