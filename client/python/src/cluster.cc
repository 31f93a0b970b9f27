// smla.Cluster: one logical service over several servers (cluster.h), sequences placed by
// consistent hashing and routed to their server.
#include "smla/client/cluster.h"

#include "requests.h"
#include "tensors.h"

namespace smla::python {
namespace {

struct PyCluster {
  std::unique_ptr<client::Cluster> cluster;
};

}  // namespace

void RegisterCluster(py::module_& m) {
  py::class_<PyCluster, std::shared_ptr<PyCluster>>(m, "Cluster", R"(Several servers as one service.

Cluster(servers=[...] or dns_name='NAME:PORT', *, virtual_nodes=160, probe_timeout=2.0,
**client options as for Client). A sequence's cache lives on one server: create_sequence places
it by consistent hashing of its id; later calls go there. When that server dies its sequences
are reported lost (smla.DataLoss) until released.)")
      .def(py::init([](const std::vector<std::string>& servers, const std::string& dns_name,
                       int virtual_nodes, double probe_timeout, const py::kwargs& kwargs) {
             client::ClusterOptions o;
             o.servers = servers;
             o.dns_name = dns_name;
             o.virtual_nodes = virtual_nodes;
             o.probe_timeout = absl::Seconds(probe_timeout);
             o.client = OptionsFromKwargs(kwargs);
             auto c = std::make_shared<PyCluster>();
             py::gil_scoped_release release;
             c->cluster = Unwrap(client::Cluster::Connect(o));
             return c;
           }),
           py::arg("servers") = std::vector<std::string>{}, py::kw_only(), py::arg("dns_name") = "",
           py::arg("virtual_nodes") = 160, py::arg("probe_timeout") = 2.0)
      .def("servers", [](const PyCluster& c) { return c.cluster->Servers(); })
      .def("live_servers", [](const PyCluster& c) { return c.cluster->LiveServers(); })
      .def(
          "create_sequence",
          [](PyCluster& c, const std::string& model, const std::string& id) {
            py::gil_scoped_release release;
            return Unwrap(c.cluster->CreateSequence(model, id));
          },
          py::arg("model"), py::arg("id"))
      .def(
          "server_of",
          [](const PyCluster& c, const client::Sequence& s) {
            return Unwrap(c.cluster->ServerOf(s));
          },
          py::arg("sequence"))
      .def(
          "client_for",
          [](const std::shared_ptr<PyCluster>& c, const client::Sequence& s) {
            auto pc = std::make_shared<PyClient>();
            {
              py::gil_scoped_release release;
              pc->client = Unwrap(c->cluster->ClientFor(s));
            }
            pc->keep = c;
            return pc;
          },
          py::arg("sequence"),
          "The Client of the sequence's server (for streams and regions); it keeps the "
          "cluster alive.")
      .def(
          "step",
          [](PyCluster& c, const std::shared_ptr<PyRequest>& r, const py::object& timeout) {
            const absl::Duration t = Seconds(timeout, absl::ZeroDuration());
            auto response = std::make_shared<v1::StepResponse>();
            {
              py::gil_scoped_release release;
              *response = Unwrap(c.cluster->Step(r->request, t));
            }
            return MakeResult(std::move(response), *r);
          },
          py::arg("request"), py::arg("timeout") = py::none())
      .def(
          "truncate",
          [](PyCluster& c, const client::Sequence& s, int64_t length) {
            py::gil_scoped_release release;
            CheckOk(c.cluster->Truncate(s, length));
          },
          py::arg("sequence"), py::arg("length"))
      .def(
          "length",
          [](PyCluster& c, const client::Sequence& s, int32_t layer) {
            py::gil_scoped_release release;
            return Unwrap(c.cluster->Length(s, layer));
          },
          py::arg("sequence"), py::arg("layer"))
      .def(
          "release",
          [](PyCluster& c, const client::Sequence& s) {
            py::gil_scoped_release release;
            CheckOk(c.cluster->Release(s));
          },
          py::arg("sequence"))
      .def(
          "set_rope_table",
          [](PyCluster& c, const std::string& model, py::handle cos_sin) {
            HostTensor t = ReadTensor(cos_sin, Want::kF32, "cos_sin");
            if (t.shape.size() != 2) throw py::value_error("cos_sin: needs [positions, 64]");
            const auto* f = reinterpret_cast<const float*>(t.data);
            py::gil_scoped_release release;
            CheckOk(
                c.cluster->SetRopeTable(model, {f, t.bytes / 4}, static_cast<int32_t>(t.shape[0])));
          },
          py::arg("model"), py::arg("cos_sin"))
      .def(
          "set_sinks",
          [](PyCluster& c, const std::string& model, py::handle sinks) {
            HostTensor t = ReadTensor(sinks, Want::kF32, "sinks");
            if (t.shape.size() != 2) throw py::value_error("sinks: needs [layers, heads]");
            const auto* f = reinterpret_cast<const float*>(t.data);
            py::gil_scoped_release release;
            CheckOk(c.cluster->SetSinks(model, {f, t.bytes / 4}, static_cast<int32_t>(t.shape[0]),
                                        static_cast<int32_t>(t.shape[1])));
          },
          py::arg("model"), py::arg("sinks"))
      .def(
          "report_failure",
          [](PyCluster& c, const std::string& server) {
            py::gil_scoped_release release;
            return c.cluster->ReportFailure(server);
          },
          py::arg("server"),
          "After a failed call to `server` outside the cluster (a stream): probes it; "
          "returns whether it still serves.")
      .def("refresh",
           [](PyCluster& c) {
             py::gil_scoped_release release;
             CheckOk(c.cluster->Refresh());
           })
      .def("lost_sequences", [](const PyCluster& c) { return c.cluster->LostSequences(); });
}

}  // namespace smla::python
