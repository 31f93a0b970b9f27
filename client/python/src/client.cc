// smla.Client (connection, info and health, the sequence lifecycle, tables, unary steps),
// smla.Sequence and smla.StepStream. Every call into gRPC runs with the GIL released.
#include <deque>

#include "absl/strings/str_cat.h"
#include "requests.h"
#include "tensors.h"

namespace smla::python {
namespace {

client::Client& Of(const std::shared_ptr<PyClient>& c) { return *c->client; }

// A stream and the requests it has outstanding, in order (their caller buffers).
struct Stream : PyStream {
  std::deque<std::shared_ptr<PyRequest>> pending;
};

void Write(Stream& s, const std::shared_ptr<PyRequest>& r) {
  if (s.ended) throw StatusError(absl::FailedPreconditionError("step stream: already finished"));
  bool ok;
  {
    py::gil_scoped_release release;
    ok = s.stream->Write(r->request);
  }
  if (!ok)
    throw StatusError(
        absl::UnavailableError("step stream: the write failed (stream ended; finish() says why)"));
  s.pending.push_back(r);
}

// The next response, or None once the stream has ended. A failed step raises its error
// (the stream goes on).
py::object Read(Stream& s) {
  auto response = std::make_shared<v1::StepResponse>();
  bool ok;
  {
    py::gil_scoped_release release;
    ok = s.stream->Read(response.get());
  }
  if (!ok) return py::none();
  std::shared_ptr<PyRequest> r;
  if (!s.pending.empty()) {
    r = s.pending.front();
    s.pending.pop_front();
  }
  CheckCode(response->code(), response->message());
  return py::cast(r ? MakeResult(std::move(response), *r) : BareResult(std::move(response)));
}

}  // namespace

client::ClientOptions OptionsFromKwargs(const py::kwargs& kwargs) {
  client::ClientOptions o;
  for (auto [key, value] : kwargs) {
    const std::string k = key.cast<std::string>();
    if (k == "target") {
      o.target = value.cast<std::string>();
    } else if (k == "timeout") {
      o.timeout = Seconds(py::reinterpret_borrow<py::object>(value), absl::InfiniteDuration());
    } else if (k == "max_message_bytes") {
      o.max_message_bytes = value.cast<int>();
    } else if (k == "tls") {
      o.tls = value.cast<bool>();
    } else if (k == "tls_ca") {
      o.tls_ca = value.cast<std::string>();
    } else if (k == "tls_cert") {
      o.tls_cert = value.cast<std::string>();
    } else if (k == "tls_key") {
      o.tls_key = value.cast<std::string>();
    } else if (k == "tls_server_name") {
      o.tls_server_name = value.cast<std::string>();
    } else if (k == "token") {
      o.token = value.cast<std::string>();
    } else if (k == "grpc_args") {
      for (auto [n, v] : value.cast<py::dict>()) {
        o.grpc_args.emplace_back(n.cast<std::string>(), v.cast<int>());
      }
    } else if (k == "keep_freed_memory") {
      o.keep_freed_memory = value.cast<bool>();
    } else {
      throw py::type_error("unexpected client option '" + k + "'");
    }
  }
  return o;
}

// A binding table, one .def per Python method: splitting it would scatter the classes.
void RegisterClient(py::module_& m) {  // NOLINT(readability-function-size)
  py::class_<client::Sequence>(m, "Sequence", "A sequence created on a server: model and id.")
      .def(py::init([](std::string model, std::string id) {
             return client::Sequence{std::move(model), std::move(id)};
           }),
           py::arg("model"), py::arg("id"))
      .def_readonly("model", &client::Sequence::model)
      .def_readonly("id", &client::Sequence::id)
      .def("__eq__", [](const client::Sequence& a,
                        const client::Sequence& b) { return a.model == b.model && a.id == b.id; })
      .def("__hash__",
           [](const client::Sequence& s) { return py::hash(py::make_tuple(s.model, s.id)); })
      .def("__repr__", [](const client::Sequence& s) {
        return absl::StrCat("smla.Sequence(model='", s.model, "', id='", s.id, "')");
      });

  py::class_<PyClient, std::shared_ptr<PyClient>>(m, "Client", R"(A connection to one server.

Client(target, *, timeout=120.0, tls=False, tls_ca='', tls_cert='', tls_key='',
tls_server_name='', token='', max_message_bytes=1<<30, grpc_args={}, keep_freed_memory=True).
timeout: seconds per unary call (None: none). TLS when tls or any PEM file is given (tls_ca,
tls_cert, tls_key are paths; mTLS with cert and key); token: a bearer token sent with every
call.)")
      .def(py::init([](const std::string& target, const py::kwargs& kwargs) {
             client::ClientOptions o = OptionsFromKwargs(kwargs);
             o.target = target;
             auto c = std::make_shared<PyClient>();
             {
               py::gil_scoped_release release;
               c->owned = Unwrap(client::Client::Connect(o));
             }
             c->client = c->owned.get();
             return c;
           }),
           py::arg("target"))
      .def(
          "info",
          [](const std::shared_ptr<PyClient>& c) {
            v1::ServerInfo info;
            {
              py::gil_scoped_release release;
              info = Unwrap(Of(c).Info());
            }
            return MessageToDict(info);
          },
          "ServerInfo as a dict (versions, device, models with their layers, pools, limits, "
          "shm_socket).")
      .def(
          "health",
          [](const std::shared_ptr<PyClient>& c, const std::string& service) {
            py::gil_scoped_release release;
            return Unwrap(Of(c).Health(service));
          },
          py::arg("service") = "", "True when grpc.health.v1 says SERVING.")
      .def(
          "create_sequence",
          [](const std::shared_ptr<PyClient>& c, const std::string& model, const std::string& id) {
            py::gil_scoped_release release;
            return Unwrap(Of(c).CreateSequence(model, id));
          },
          py::arg("model"), py::arg("id"))
      .def(
          "release",
          [](const std::shared_ptr<PyClient>& c, const client::Sequence& s) {
            py::gil_scoped_release release;
            CheckOk(Of(c).Release(s));
          },
          py::arg("sequence"))
      .def(
          "truncate",
          [](const std::shared_ptr<PyClient>& c, const client::Sequence& s, int64_t length) {
            py::gil_scoped_release release;
            CheckOk(Of(c).Truncate(s, length));
          },
          py::arg("sequence"), py::arg("length"))
      .def(
          "length",
          [](const std::shared_ptr<PyClient>& c, const client::Sequence& s, int32_t layer) {
            py::gil_scoped_release release;
            return Unwrap(Of(c).Length(s, layer));
          },
          py::arg("sequence"), py::arg("layer"), "Positions stored on `layer`.")
      .def(
          "set_rope_table",
          [](const std::shared_ptr<PyClient>& c, const std::string& model, py::handle cos_sin) {
            HostTensor t = ReadTensor(cos_sin, Want::kF32, "cos_sin");
            if (t.shape.size() != 2) throw py::value_error("cos_sin: needs [positions, 64]");
            const auto* f = reinterpret_cast<const float*>(t.data);
            py::gil_scoped_release release;
            CheckOk(Of(c).SetRopeTable(model, {f, t.bytes / 4}, static_cast<int32_t>(t.shape[0])));
          },
          py::arg("model"), py::arg("cos_sin"),
          "float32 [P, 64]: cos(p*theta_k) for k = 0..31, then sin.")
      .def(
          "set_sinks",
          [](const std::shared_ptr<PyClient>& c, const std::string& model, py::handle sinks) {
            HostTensor t = ReadTensor(sinks, Want::kF32, "sinks");
            if (t.shape.size() != 2) throw py::value_error("sinks: needs [layers, heads]");
            const auto* f = reinterpret_cast<const float*>(t.data);
            py::gil_scoped_release release;
            CheckOk(Of(c).SetSinks(model, {f, t.bytes / 4}, static_cast<int32_t>(t.shape[0]),
                                   static_cast<int32_t>(t.shape[1])));
          },
          py::arg("model"), py::arg("sinks"), "float32 [layers, heads_per_rank].")
      .def(
          "step",
          [](const std::shared_ptr<PyClient>& c, const std::shared_ptr<PyRequest>& r,
             const py::object& timeout) {
            const absl::Duration t = Seconds(timeout, absl::ZeroDuration());
            auto response = std::make_shared<v1::StepResponse>();
            {
              py::gil_scoped_release release;
              *response = Unwrap(Of(c).Step(r->request, t));
            }
            return MakeResult(std::move(response), *r);
          },
          py::arg("request"), py::arg("timeout") = py::none(),
          "One unary step; raises the server's error.")
      .def(
          "open_stream",
          [](const std::shared_ptr<PyClient>& c, const py::object& timeout) {
            const absl::Duration t = Seconds(timeout, absl::InfiniteDuration());
            auto s = std::make_shared<Stream>();
            s->client = c;
            py::gil_scoped_release release;
            s->stream = Unwrap(Of(c).OpenStream(t));
            return std::static_pointer_cast<PyStream>(s);
          },
          py::arg("timeout") = py::none(), "A StepStream (no deadline unless `timeout`).")
      .def_property_readonly("_id", [](const std::shared_ptr<PyClient>& c) {
        return reinterpret_cast<uintptr_t>(c->client);
      });

  py::class_<PyStream, std::shared_ptr<PyStream>>(m, "StepStream", R"(The bidirectional step stream.

Responses come in request order; a failed step raises its error from read()/step() and the
stream goes on. write() and read() may run on different threads.)")
      .def(
          "write",
          [](PyStream& s, const std::shared_ptr<PyRequest>& r) {
            Write(static_cast<Stream&>(s), r);
          },
          py::arg("request"))
      .def(
          "read", [](PyStream& s) { return Read(static_cast<Stream&>(s)); },
          "The next StepResult, or None when the stream has ended (finish() says why).")
      .def(
          "step",
          [](PyStream& s, const std::shared_ptr<PyRequest>& r) {
            auto& st = static_cast<Stream&>(s);
            Write(st, r);
            py::object result = Read(st);
            if (result.is_none()) {
              absl::Status status;
              {
                py::gil_scoped_release release;
                status = st.stream->Finish();
              }
              st.ended = true;
              CheckOk(status);
              throw StatusError(absl::UnavailableError("step stream ended"));
            }
            return result;
          },
          py::arg("request"), "write() then read().")
      .def("writes_done",
           [](PyStream& s) {
             py::gil_scoped_release release;
             return s.stream->WritesDone();
           })
      .def(
          "finish",
          [](PyStream& s) {
            if (s.ended) return;
            absl::Status status;
            {
              py::gil_scoped_release release;
              status = s.stream->Finish();
            }
            s.ended = true;
            CheckOk(status);
          },
          "Waits for the stream's end; raises its status unless OK.")
      .def("cancel", [](PyStream& s) { s.stream->Cancel(); })
      .def("__enter__", [](const std::shared_ptr<PyStream>& s) { return s; })
      .def("__exit__", [](PyStream& s, py::handle, py::handle, py::handle) {
        if (s.ended) return;
        py::gil_scoped_release release;
        s.stream->WritesDone();
        s.stream->Finish().IgnoreError();
        s.ended = true;
      });
}

}  // namespace smla::python
