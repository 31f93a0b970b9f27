// The service's metrics (docs/architecture.md: requests by status, rows, batch sizes, queue and
// kernel time histograms, pool pages used/total, sequences, open streams) and the HTTP endpoint
// that exposes them as Prometheus text.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "metrics.h"
#include "smla/server/service_core.h"
#include "smla/server/step.h"

namespace httplib {
class Server;
}

namespace smla::server::edge {

class EdgeMetrics {
 public:
  // `core` must outlive this object; it is read at every scrape.
  explicit EdgeMetrics(const ServiceCore* core);

  // One finished call; `code` is a canonical status code.
  void CountRequest(std::string_view method, absl::StatusCode code);
  // A successful step: its rows and the batch that carried it.
  void ObserveStep(const StepResult& result, absl::Duration server_time);
  void StreamOpened() { open_streams_->Add(1); }
  void StreamClosed() { open_streams_->Add(-1); }

  Registry& registry() { return registry_; }

 private:
  Registry registry_;
  const ServiceCore* core_;
  Counter* rows_;
  Gauge* open_streams_;
  Histogram* batch_requests_;
  Histogram* batch_rows_;
  Histogram* queue_seconds_;
  Histogram* kernel_seconds_;
  Histogram* prep_seconds_;
  Histogram* server_seconds_;
  // The counters of successful Step and StepStream calls, found on first use (the per-step
  // path then skips building label strings and the registry's lookups).
  std::atomic<Counter*> step_ok_{nullptr}, stream_ok_{nullptr};
};

// GET /metrics over HTTP/1.1 on its own thread.
class MetricsHttpServer {
 public:
  // Binds HOST:PORT (port 0 picks a free one) and starts serving.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host_port,
                                                                  Registry* registry);
  ~MetricsHttpServer();
  int port() const { return port_; }
  void Stop();

 private:
  MetricsHttpServer() = default;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
};

// Splits "host:port" ("[::1]:80" too); the port must be 0..65535.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& host_port);

}  // namespace smla::server::edge
