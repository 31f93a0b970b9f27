#include "edge_server.h"

#include <algorithm>
#include <bit>
#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fd_budget.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "smla/server/model_profile.h"
#include "spdlog/spdlog.h"

namespace smla::server::edge {
namespace {

constexpr char kServiceName[] = "smla.v1.Smla";
// A connection that has not finished its TLS and HTTP/2 handshake by then is closed (gRPC's
// default, 120 s, lets silent connections hold their descriptors for minutes).
constexpr int kHandshakeTimeoutMs = 20000;

void SetServing(grpc::Server* server, bool serving) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus(serving);  // every service, "" included
  health->SetServingStatus(kServiceName, serving);
}

}  // namespace

StepBytes MaxStepBytes(const ServiceCore& core, const Limits& limits) {
  StepBytes most;
  const int64_t rows = limits.max_rows_per_step;
  for (const ModelConfig& m : core.Info().models) {
    const ModelProfile* profile = FindProfile(m.profile);
    if (profile == nullptr) continue;
    const int64_t w = kernels::QkWidth(profile->geometry);
    const int64_t h = m.heads_per_rank;
    int64_t topk = 0;
    for (const LayerSpec& l : profile->layers) topk = std::max<int64_t>(topk, l.topk);
    // Per row in: KV row, at most one compressed entry, query heads, top-k ids (all bf16 /
    // int32); per row out: bf16 output (larger than MXFP8 data + scales) and LSE.
    const int64_t per_row_in = 2 * w + 2 * w + 2 * h * w + 4 * topk;
    const int64_t per_row_out = 2 * h * kernels::kValueWidth + 4 * h;
    const int64_t framing = int64_t{limits.max_spans_per_step} * 512 + (64 << 10);
    most.in = std::max(
        {most.in, rows * per_row_in + framing, int64_t{profile->num_layers()} * h * 4 + framing});
    most.out = std::max(most.out, rows * per_row_out + framing);
  }
  return most;
}

int64_t MaxMessageBytes(const ServiceCore& core, const Limits& limits) {
  const StepBytes step = MaxStepBytes(core, limits);
  int64_t most = std::max<int64_t>({4 << 20, step.in, step.out});   // never below gRPC's default
  most = std::max(most, limits.max_context * 64 * 4 + (64 << 10));  // rope table upload
  return std::min<int64_t>(most, INT_MAX);
}

absl::StatusOr<std::unique_ptr<EdgeServer>> EdgeServer::Start(ServiceCore* core,
                                                              const Limits& limits,
                                                              const EdgeServerOptions& options) {
  std::unique_ptr<EdgeServer> s(new EdgeServer());
  s->core_ = core;
  s->options_ = options;
  s->edge_metrics_ = std::make_unique<EdgeMetrics>(core);
  EdgeOptions eo;
  eo.stream_max_inflight = std::max(1, options.stream_max_inflight);
  eo.limits = limits;
  const int64_t fd_limit = FdLimit();
  const FdBudget budget = DefaultFdBudget(fd_limit);
  if (eo.limits.max_connections <= 0) eo.limits.max_connections = budget.max_connections;
  if (eo.limits.max_regions <= 0) eo.limits.max_regions = budget.max_regions;
  eo.max_message_bytes = MaxMessageBytes(*core, limits);
  eo.allow_shm = options.allow_shm;
  eo.max_pinned_bytes = options.max_pinned_bytes;
  // Two of the largest legal steps always fit (staging rounds each buffer up to a power of two);
  // a stream always reads one request, whatever its bound.
  const StepBytes step = MaxStepBytes(*core, limits);
  const uint64_t floor = 2 * (std::bit_ceil(static_cast<uint64_t>(step.in)) +
                              std::bit_ceil(static_cast<uint64_t>(step.out)));
  eo.staging.max_bytes = std::max(options.max_inflight_bytes, floor);
  eo.staging.max_tenant_bytes = std::max(options.tenant_max_inflight_bytes, floor);
  eo.staging.max_cached_bytes = std::min(eo.staging.max_bytes, options.inline_cache_bytes);
  eo.stream_max_inflight_bytes = options.stream_max_inflight_bytes;
  eo.shm_socket = options.shm_socket;
  eo.copy_threads = options.copy_threads;
  std::shared_ptr<const TokenTable> tokens;
  if (!options.auth.token_file.empty()) {
    absl::StatusOr<std::shared_ptr<const TokenTable>> t = TokenTable::Load(options.auth.token_file);
    if (!t.ok()) return t.status();
    tokens = *std::move(t);
  }
  if (tokens != nullptr || !options.auth.tls_client_ca.empty()) {
    eo.auth = std::make_shared<Authenticator>(tokens);
  }
  s->service_ = std::make_unique<SmlaService>(core, s->edge_metrics_.get(), eo);
  if (absl::Status st = s->service_->StartHandover(); !st.ok()) return st;

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
      MakeServerCredentials(options.auth, options.listen, tokens);
  if (!creds.ok()) return creds.status();
  // The port is ours (listener.h): gRPC takes each accepted connection with the same
  // credentials it would have applied to its own.
  s->acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, *creds);
  builder.RegisterService(s->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(eo.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(eo.max_message_bytes));
  for (const auto& [name, value] : options.grpc_args) builder.AddChannelArgument(name, value);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, kHandshakeTimeoutMs);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counting;
  counting.push_back(s->calls_.Factory());
  builder.experimental().SetInterceptorCreators(std::move(counting));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve on ", options.listen));
  }
  auto listener = ConnectionListener::Start(
      options.listen, eo.limits.max_connections,
      [acceptor = s->acceptor_.get()](int fd, int listener_fd) {
        grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
        p.listener_fd = listener_fd;
        p.fd = fd;
        acceptor->HandleNewConnection(&p);
      });
  if (!listener.ok()) {
    s->server_->Shutdown();
    return listener.status();
  }
  s->listener_ = *std::move(listener);
  s->port_ = s->listener_->port();
  Registry& registry = s->edge_metrics_->registry();
  Gauge& open = registry.GetGauge("smla_connections_open", "Open gRPC connections.");
  Counter& refused = registry.GetCounter(
      "smla_connections_refused_total",
      "Connections closed at once: past --max_connections, or for want of descriptors.");
  registry.AddCollector([l = s->listener_.get(), &open, &refused] {
    open.Set(static_cast<double>(l->open_connections()));
    refused.Set(static_cast<double>(l->refused_connections()));
  });
  if (!options.metrics_listen.empty()) {
    auto m = MetricsHttpServer::Start(options.metrics_listen, &s->edge_metrics_->registry());
    if (!m.ok()) {
      s->server_->Shutdown();
      return m.status();
    }
    s->metrics_ = std::move(*m);
  }
  SetServing(s->server_.get(), core->Healthy());
  s->health_thread_ = std::thread([p = s.get()] { p->WatchHealth(); });
  spdlog::info(
      "gRPC on port {}, max message {} bytes, at most {} connections and {} regions "
      "({} open files), inline bytes in flight {} (tenant {}, stream {})",
      s->port_, eo.max_message_bytes, eo.limits.max_connections, eo.limits.max_regions, fd_limit,
      eo.staging.max_bytes, eo.staging.max_tenant_bytes, eo.stream_max_inflight_bytes);
  return s;
}

void EdgeServer::WatchHealth() {
  // A backend failure flips the core's health from any thread; the probe follows it here.
  bool serving = core_->Healthy();
  while (!stop_watch_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    const bool now = core_->Healthy() && !shutting_down_.load();
    if (now != serving) {
      serving = now;
      SetServing(server_.get(), serving);
      spdlog::warn("health: {}", serving ? "SERVING" : "NOT_SERVING");
    }
  }
}

void EdgeServer::Shutdown() {
  if (server_ == nullptr || shutting_down_.exchange(true)) return;
  SetServing(server_.get(), false);
  spdlog::info("shutdown: draining queued work");
  core_->Drain();
  service_->CloseRegions();  // their registering calls would otherwise hold up the shutdown
  if (listener_) listener_->StopAccepting();
  spdlog::info("shutdown: waiting for open calls (grace {})",
               absl::FormatDuration(options_.shutdown_grace));
  const absl::Time deadline = absl::Now() + options_.shutdown_grace;
  while (calls_.open() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  // gRPC's shutdown answers a call that arrives while it runs CANCELLED, which clients do not
  // fail over on. Closing every connection first leaves it none to answer: whatever a client
  // still has in flight ends UNAVAILABLE with the connection.
  spdlog::info("shutdown: closing connections ({} calls open)", calls_.open());
  if (listener_) listener_->DisconnectAll();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  stop_watch_.Notify();
  if (health_thread_.joinable()) health_thread_.join();
  if (metrics_) metrics_->Stop();
  spdlog::info("shutdown: done");
}

EdgeServer::~EdgeServer() { Shutdown(); }

}  // namespace smla::server::edge
