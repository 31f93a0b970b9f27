// The running edge: the gRPC server (smla.v1.Smla, grpc.health.v1, reflection) with message
// limits sized from the largest legal step, and the metrics endpoint. Start after the core is
// ready: health reports SERVING from the moment Start returns.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "auth.h"
#include "call_counter.h"
#include "edge_metrics.h"
#include "grpcpp/grpcpp.h"
#include "listener.h"
#include "smla/server/service_core.h"
#include "smla_service.h"

namespace smla::server::edge {

struct EdgeServerOptions {
  std::string listen = "127.0.0.1:0";
  std::string metrics_listen;  // empty = no metrics endpoint
  int32_t stream_max_inflight = 16;
  // How long Shutdown waits for open calls (streams) after the drain before cancelling them.
  absl::Duration shutdown_grace = absl::Seconds(10);
  // TLS / mTLS and bearer tokens; none by default (plaintext, loopback only).
  AuthOptions auth;
  // Registered shared-memory regions (the zero-copy transport); off by default.
  bool allow_shm = false;
  // Bytes of regions page-locked at once; regions past it are served unpinned.
  uint64_t max_pinned_bytes = 0;
  // Inline tensor bytes held at once (server-wide, per tenant, per stream). The first two are
  // raised to two of the largest legal steps when set lower, so that any legal step can be
  // served; a stream always reads one request, whatever its bound.
  uint64_t max_inflight_bytes = uint64_t{8} << 30;
  uint64_t tenant_max_inflight_bytes = uint64_t{4} << 30;
  uint64_t stream_max_inflight_bytes = uint64_t{512} << 20;
  // Free staging kept for reuse (resident: the next steps fault in no pages).
  uint64_t inline_cache_bytes = uint64_t{512} << 20;
  // Extra gRPC channel arguments (name, integer value) for the listening server.
  std::vector<std::pair<std::string, int>> grpc_args;
  // Where clients hand region memory over: "@name" (abstract) or a path; empty: an abstract
  // name of the process's own (ServerInfo.shm_socket tells clients).
  std::string shm_socket;
  // Threads copying large requests' tensor bytes (EdgeOptions::copy_threads); -1: default.
  int32_t copy_threads = -1;
};

// The largest request (in) and response (out) of one legal step, in bytes.
struct StepBytes {
  int64_t in = 0;
  int64_t out = 0;
};
StepBytes MaxStepBytes(const ServiceCore& core, const Limits& limits);

// The largest request or response a legal step (or rope/sink upload) can need, in bytes,
// capped at what gRPC can express.
int64_t MaxMessageBytes(const ServiceCore& core, const Limits& limits);

class EdgeServer {
 public:
  // `core` must outlive the server.
  static absl::StatusOr<std::unique_ptr<EdgeServer>> Start(ServiceCore* core, const Limits& limits,
                                                           const EdgeServerOptions& options);
  ~EdgeServer();

  int port() const { return port_; }
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }

  // Health NOT_SERVING, drain the core (new steps UNAVAILABLE, queued ones finish), stop
  // accepting connections, wait up to the grace period for open calls, then close every
  // connection (clients see UNAVAILABLE) before gRPC's own shutdown, stop metrics. Idempotent.
  void Shutdown();

 private:
  EdgeServer() = default;
  void WatchHealth();

  ServiceCore* core_ = nullptr;
  EdgeServerOptions options_;
  std::unique_ptr<EdgeMetrics> edge_metrics_;
  CallCounter calls_;  // outlives server_, whose interceptors count through it
  std::unique_ptr<SmlaService> service_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::unique_ptr<grpc::Server> server_;
  // After server_, which it hands connections to; before metrics_, whose collector reads it.
  std::unique_ptr<ConnectionListener> listener_;
  std::unique_ptr<MetricsHttpServer> metrics_;
  int port_ = 0;
  std::atomic<bool> shutting_down_{false};
  absl::Notification stop_watch_;
  std::thread health_thread_;
};

}  // namespace smla::server::edge
