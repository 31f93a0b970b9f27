#include "edge_metrics.h"

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "http_task_queue.h"
#include "httplib.h"

namespace smla::server::edge {
namespace {

// A scraper sends its request as soon as it connects and reads the answer at once, so a
// connection that stays silent or slow this long is idle, not a scrape, and gives its worker
// back. Workers exceed the idle connections a scrape should get past; past them and the
// waiting bound, connections wait in the kernel's backlog.
constexpr time_t kIdleSeconds = 1;
constexpr time_t kReadWriteSeconds = 2;
constexpr int kHttpWorkers = 64;
constexpr int kHttpMaxWaiting = 64;
// cpp-httplib listens with a backlog of 5: a burst of connects (scrapers, probes) overflows it
// whenever its accept thread is slow to run, and each overflowed connect waits a SYN
// retransmission (a second or more). Linux takes a second listen() as a new backlog.
constexpr int kHttpBacklog = 128;

std::vector<double> SecondsBuckets() {
  // 20 us .. ~10 s: decode calls sit in the tens of microseconds on a GPU, CPU prefill in seconds.
  return ExponentialBuckets(20e-6, 2.0, 20);
}

}  // namespace

EdgeMetrics::EdgeMetrics(const ServiceCore* core) : core_(core) {
  rows_ = &registry_.GetCounter("smla_step_rows_total", "Query rows of successful steps.");
  open_streams_ = &registry_.GetGauge("smla_open_streams", "StepStream calls now open.");
  const std::vector<double> counts = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  batch_requests_ = &registry_.GetHistogram(
      "smla_step_batch_requests",
      "Requests in the batch that carried each successful step (observed once per step).", counts);
  batch_rows_ = &registry_.GetHistogram("smla_step_batch_rows",
                                        "Rows in the batch that carried each successful step.",
                                        ExponentialBuckets(1, 2, 15));
  queue_seconds_ = &registry_.GetHistogram(
      "smla_step_queue_seconds", "Time from admission to launch per step.", SecondsBuckets());
  kernel_seconds_ =
      &registry_.GetHistogram("smla_step_kernel_seconds",
                              "Device time of the batch that carried each step: copies in, "
                              "row writes, attention, copies out.",
                              SecondsBuckets());
  prep_seconds_ = &registry_.GetHistogram(
      "smla_step_prep_seconds",
      "Host work of the launch of the batch that carried each step (slot lists, staging) that "
      "the device did not overlap.",
      SecondsBuckets());
  server_seconds_ = &registry_.GetHistogram("smla_step_server_seconds",
                                            "Time from parsed request to ready response per step.",
                                            SecondsBuckets());
  registry_.AddCollector([this] {
    const ServerInfo info = core_->Info();
    for (const PoolUsage& p : info.pools) {
      registry_
          .GetGauge("smla_pool_pages_used", "Pages in use in a model's pool.", {{"model", p.model}})
          .Set(static_cast<double>(p.pages_used));
      registry_.GetGauge("smla_pool_pages_total", "Pages of a model's pool.", {{"model", p.model}})
          .Set(static_cast<double>(p.pages_total));
    }
    registry_.GetGauge("smla_sequences", "Live sequences.")
        .Set(static_cast<double>(info.sequences));
    const CoreStats stats = core_->Stats();
    registry_.GetCounter("smla_batches_total", "Backend launches.")
        .Set(static_cast<double>(stats.batches));
    registry_
        .GetCounter("smla_batched_requests_total",
                    "Requests carried by launches (sum over batches).")
        .Set(static_cast<double>(stats.batched_requests));
    registry_.GetCounter("smla_batched_rows_total", "Rows carried by launches.")
        .Set(static_cast<double>(stats.rows));
    registry_.GetGauge("smla_queue_depth", "Requests waiting in the scheduler's queues.")
        .Set(static_cast<double>(stats.queue_depth));
    registry_.GetGauge("smla_healthy", "1 while the backend is healthy.")
        .Set(core_->Healthy() ? 1 : 0);
  });
}

void EdgeMetrics::CountRequest(std::string_view method, absl::StatusCode code) {
  std::atomic<Counter*>* cached = nullptr;
  if (code == absl::StatusCode::kOk) {
    if (method == "StepStream") cached = &stream_ok_;
    if (method == "Step") cached = &step_ok_;
  }
  if (cached != nullptr) {
    if (Counter* c = cached->load(std::memory_order_acquire); c != nullptr) {
      c->Inc();
      return;
    }
  }
  Counter& counter = registry_.GetCounter(
      "smla_requests_total", "Finished calls by method and status code.",
      {{"method", std::string(method)}, {"code", absl::StatusCodeToString(code)}});
  if (cached != nullptr) cached->store(&counter, std::memory_order_release);
  counter.Inc();
}

void EdgeMetrics::ObserveStep(const StepResult& result, absl::Duration server_time) {
  rows_->Inc(result.num_rows);
  batch_requests_->Observe(result.timings.batch_requests);
  batch_rows_->Observe(result.timings.batch_rows);
  queue_seconds_->Observe(absl::ToDoubleSeconds(result.timings.queued));
  kernel_seconds_->Observe(absl::ToDoubleSeconds(result.timings.kernel));
  prep_seconds_->Observe(absl::ToDoubleSeconds(result.timings.prep));
  server_seconds_->Observe(absl::ToDoubleSeconds(server_time));
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", host_port, "' is not HOST:PORT"));
  }
  std::string host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  if (!absl::SimpleAtoi(host_port.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", host_port, "': bad port"));
  }
  if (host.empty()) return absl::InvalidArgumentError(absl::StrCat("'", host_port, "': no host"));
  return std::make_pair(host, port);
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host_port, Registry* registry) {
  auto hp = SplitHostPort(host_port);
  if (!hp.ok()) return hp.status();
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->http_ = std::make_unique<httplib::Server>();
  s->http_->new_task_queue = [] { return new BoundedTaskQueue(kHttpWorkers, kHttpMaxWaiting); };
  s->http_->set_keep_alive_timeout(kIdleSeconds);
  s->http_->set_read_timeout(kReadWriteSeconds, 0);
  s->http_->set_write_timeout(kReadWriteSeconds, 0);
  int listen_fd = -1;
  s->http_->set_socket_options([&listen_fd](int fd) {
    httplib::default_socket_options(fd);
    listen_fd = fd;
  });
  s->http_->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  const auto& [host, port] = *hp;
  if (port == 0) {
    s->port_ = s->http_->bind_to_any_port(host);
  } else {
    s->port_ = s->http_->bind_to_port(host, port) ? port : -1;
  }
  if (s->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot bind ", host_port));
  }
  s->http_->set_socket_options(httplib::default_socket_options);  // drops the reference
  if (listen_fd >= 0) listen(listen_fd, kHttpBacklog);
  httplib::Server* http = s->http_.get();
  auto ended = std::make_shared<std::atomic<bool>>(false);
  s->thread_ = std::thread([http, ended] {
    http->listen_after_bind();
    ended->store(true);
  });
  // cpp-httplib 0.11's stop() does nothing until the listen loop runs, and a loop started after
  // it would never end: return only once the loop runs (or has already ended).
  while (!http->is_running() && !ended->load()) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return s;
}

void MetricsHttpServer::Stop() {
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

}  // namespace smla::server::edge
