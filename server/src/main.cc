// smla-server: the sparse-MLA attention service (docs/architecture.md). Flags override the --config
// file, which overrides the built-in defaults.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edge/config_file.h"
#include "edge/edge_metrics.h"
#include "edge/edge_server.h"
#include "edge/fault_backend.h"
#include "edge/fd_budget.h"
#include "edge/limit_fields.h"
#include "smla/kernels/backend.h"
#include "smla/server/model_profile.h"
#include "smla/server/service_core.h"
#include "smla/v1/allocator.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "",
          "gRPC HOST:PORT (port 0 picks a free port); default 127.0.0.1:50051");
ABSL_FLAG(std::string, metrics_listen, "default",
          "Prometheus metrics HTTP HOST:PORT (port 0 picks one; empty disables); default "
          "127.0.0.1:9464");
ABSL_FLAG(std::string, backend, "", "auto, cpu, cuda or hip; default auto");
ABSL_FLAG(std::vector<std::string>, model, {},
          "Served model, repeatable or comma-separated, e.g. "
          "dsv4.1-flash:tp=4:kv=fp8_dsv4:page_rows=64:pool=2GiB");
ABSL_FLAG(std::string, config, "", "Configuration file (text format of smla.v1.ServerConfig)");
// The limits below are applied only when given, on top of the --config file, through the
// table that the file uses too (edge/limit_fields.h): a negative value is an error, and 0 keeps
// the default for the sizes and counts. Their help names the built-in default.
namespace {
using smla::server::Limits;
std::string LimitHelp(absl::string_view what, int64_t default_value) {
  return absl::StrCat(what, "; default ", default_value);
}
}  // namespace
ABSL_FLAG(std::optional<int64_t>, batch_wait_us, std::nullopt,
          LimitHelp("Wait this long for more work before a launch",
                    absl::ToInt64Microseconds(Limits().batch_wait)));
ABSL_FLAG(std::optional<int64_t>, scheduler_spin_us, std::nullopt,
          LimitHelp("After a launch, the scheduler's thread spins this long for the next step "
                    "before parking (a step arriving meanwhile needs no thread wake-up; the spin "
                    "burns a core, an idle server parks); 0 parks at once",
                    absl::ToInt64Microseconds(Limits().scheduler_spin)));
ABSL_FLAG(std::optional<int64_t>, max_rows_per_step, std::nullopt,
          LimitHelp("Rows in one call", Limits().max_rows_per_step));
ABSL_FLAG(std::optional<int64_t>, max_spans_per_step, std::nullopt,
          LimitHelp("Spans in one call", Limits().max_spans_per_step));
ABSL_FLAG(std::optional<int64_t>, max_batch_rows, std::nullopt,
          LimitHelp("Rows in one launch", Limits().max_batch_rows));
ABSL_FLAG(std::optional<int64_t>, max_batch_bytes, std::nullopt,
          LimitHelp("Input and output bytes in one launch", Limits().max_batch_bytes));
ABSL_FLAG(std::optional<int64_t>, max_context, std::nullopt,
          LimitHelp("Longest context (positions) of a sequence", Limits().max_context));
ABSL_FLAG(std::optional<int64_t>, max_queued_requests, std::nullopt,
          LimitHelp("Requests waiting per (model, layer) queue", Limits().max_queued_requests));
ABSL_FLAG(std::optional<int64_t>, max_queued_rows, std::nullopt,
          LimitHelp("Rows waiting per (model, layer) queue", Limits().max_queued_rows));
ABSL_FLAG(std::optional<int64_t>, max_sequences, std::nullopt,
          LimitHelp("Live sequences", Limits().max_sequences));
ABSL_FLAG(std::optional<int64_t>, max_connections, std::nullopt,
          "Open gRPC connections; one past it is closed at once (default: a quarter of the "
          "open-files limit left after a reserve)");
ABSL_FLAG(std::optional<int64_t>, max_regions, std::nullopt,
          "Registered shared-memory regions of all tenants (default: half of the open-files "
          "limit left after a reserve)");
ABSL_FLAG(std::optional<int64_t>, stream_max_inflight, std::nullopt,
          "Requests of one StepStream in flight (default 16)");
ABSL_FLAG(std::optional<int64_t>, shutdown_grace_s, std::nullopt,
          "Seconds to wait for open calls at shutdown (default 10)");
ABSL_FLAG(std::optional<int64_t>, tenant_max_sequences, std::nullopt,
          "Live sequences per tenant and model (0 = no quota, the default)");
ABSL_FLAG(std::optional<int64_t>, tenant_max_pages, std::nullopt,
          "KV pool pages per tenant and model (0 = no quota, the default)");
ABSL_FLAG(std::optional<int64_t>, tenant_max_streams, std::nullopt,
          "Open StepStream calls per tenant (0 = no quota, the default)");
ABSL_FLAG(std::optional<int64_t>, tenant_max_regions, std::nullopt,
          "Registered shared-memory regions per tenant (0 = no quota, the default)");
ABSL_FLAG(int32_t, cpu_threads, 0, "CPU backend threads (0 = all cores)");
ABSL_FLAG(bool, allow_shm, false,
          "Let clients on this host register shared-memory regions (zero-copy transport)");
ABSL_FLAG(std::string, shm_socket, "",
          "With --allow_shm: the Unix datagram socket on which clients hand region memory "
          "(sealed memfds) over, a path or @abstract-name; default an abstract name of this "
          "process (clients read it from GetServerInfo)");
ABSL_FLAG(std::string, max_pinned_bytes, "",
          "Bytes of shared-memory regions and inline staging page-locked at once for faster GPU "
          "copies, e.g. 32GiB (memory past it works unpinned); default a quarter of physical "
          "memory");
ABSL_FLAG(std::string, max_inflight_bytes, "8GiB",
          "Inline tensor bytes (requests and responses in flight) held at once, server-wide; "
          "a request past it is RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, tenant_max_inflight_bytes, "4GiB",
          "Inline tensor bytes one tenant may hold at once");
ABSL_FLAG(std::string, stream_max_inflight_bytes, "512MiB",
          "Inline tensor bytes one StepStream holds before it pauses reading (a client that "
          "does not read its responses holds at most this much)");
ABSL_FLAG(std::string, inline_cache_bytes, "512MiB",
          "Free inline-tensor staging kept for reuse (resident, so steady steps fault in no "
          "fresh pages)");
ABSL_FLAG(int32_t, copy_threads, -1,
          "Threads that copy a large inline request's tensor bytes into staging beside the "
          "call's own (-1: a quarter of the cores, at most 4; 0: none)");
ABSL_FLAG(std::vector<std::string>, grpc_arg, {},
          "Extra gRPC server channel arguments NAME=INT, comma-separated "
          "(docs/operations.md lists the measured choices)");
ABSL_FLAG(int64_t, inject_backend_failure_after, -1,
          "Fault tests: every Attend after this many served ones fails (INTERNAL); -1 = off");
ABSL_FLAG(int32_t, inject_attend_delay_ms, 0,
          "Fault tests: hold every served Attend this many ms before it runs (a slow device)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates signed by it (mTLS)");
ABSL_FLAG(std::string, token_file, "",
          "Bearer tokens: lines \"token tenant\"; every smla.v1 call must carry one");
ABSL_FLAG(bool, mutex_deadlock_checks, false,
          "abseil's lock-order checks on every Mutex operation: a debugging aid that every lock "
          "pays for (the test suites run with them)");
ABSL_FLAG(int32_t, phase_timings_every, 16,
          "Record the attention's and the output copies' timing events (a response's attend_us, "
          "copy_out_us) on one batch in this many, since each event costs device time "
          "(1 = every batch)");
ABSL_FLAG(bool, allow_insecure_remote, false,
          "Serve plaintext without tokens on a non-loopback address");
ABSL_FLAG(absl::Duration, sequence_idle_timeout, absl::InfiniteDuration(),
          "Release sequences unused this long, e.g. 10m (inf = never)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error");

namespace smla::server {
namespace {

// A laptop-sized default: one dsv4.1-flash TP4 rank with a pool of a few hundred MiB.
constexpr char kDefaultModel[] = "dsv4.1-flash:tp=4:kv=fp8_dsv4:page_rows=64:pool=384MiB";

// absl keeps only the last occurrence of a flag; --model is repeatable, so every occurrence
// is collected from argv before absl parses it.
std::vector<std::string>& ModelFlagOccurrences() {
  static std::vector<std::string> occurrences;
  return occurrences;
}

void CollectModelFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    std::string value;
    if (a.rfind("--model=", 0) == 0) {
      value = a.substr(8);
    } else if (a == "--model" && i + 1 < argc) {
      value = argv[++i];
    } else {
      continue;
    }
    for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
      ModelFlagOccurrences().emplace_back(part);
    }
  }
}

std::vector<std::string> RepeatedModelFlags() {
  return ModelFlagOccurrences().empty() ? absl::GetFlag(FLAGS_model) : ModelFlagOccurrences();
}

absl::StatusOr<ServerConfig> BuildConfig(int32_t* stream_max_inflight, int32_t* grace_s) {
  ServerConfig config;
  config.listen = "127.0.0.1:50051";
  config.metrics_listen = "127.0.0.1:9464";
  *stream_max_inflight = 16;
  *grace_s = 10;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    auto file = edge::ReadConfigFile(absl::GetFlag(FLAGS_config));
    if (!file.ok()) return file.status();
    if (absl::Status st = edge::ApplyConfig(*file, &config, stream_max_inflight, grace_s);
        !st.ok()) {
      return st;
    }
  }
  if (!absl::GetFlag(FLAGS_listen).empty()) config.listen = absl::GetFlag(FLAGS_listen);
  config.phase_timings_every = absl::GetFlag(FLAGS_phase_timings_every);
  if (config.phase_timings_every < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--phase_timings_every: ", config.phase_timings_every, " is not a positive count"));
  }
  if (absl::GetFlag(FLAGS_metrics_listen) != "default") {
    config.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  }
  if (!absl::GetFlag(FLAGS_backend).empty()) {
    auto b = kernels::ParseBackendChoice(absl::GetFlag(FLAGS_backend));
    if (!b) {
      return absl::InvalidArgumentError(
          absl::StrCat("--backend: unknown '", absl::GetFlag(FLAGS_backend), "'"));
    }
    config.backend = *b;
  }
  for (const std::string* hp : {&config.listen, &config.metrics_listen}) {
    if (hp->empty() && hp == &config.metrics_listen) continue;
    if (auto split = edge::SplitHostPort(*hp); !split.ok()) return split.status();
  }
  const std::vector<std::string> models = RepeatedModelFlags();
  if (!models.empty()) config.models.clear();
  for (const std::string& spec : models) {
    auto m = ParseModelConfig(spec);
    if (!m.ok())
      return absl::InvalidArgumentError(absl::StrCat("--model ", spec, ": ", m.status().message()));
    config.models.push_back(*m);
  }
  if (config.models.empty()) {
    auto m = ParseModelConfig(kDefaultModel);
    if (!m.ok()) return m.status();
    config.models.push_back(*m);
  }
  // Every limit of the table has a flag of its name above; a given one overrides the file.
  const edge::LimitTargets targets{&config.limits, stream_max_inflight, grace_s};
  for (absl::string_view name : edge::LimitNames()) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    const auto value = flag != nullptr ? flag->TryGet<std::optional<int64_t>>() : absl::nullopt;
    if (!value.has_value()) {
      return absl::InternalError(absl::StrCat("limit ", name, " has no int64 flag"));
    }
    if (!value->has_value()) continue;
    if (absl::Status st = edge::SetLimit("--", name, **value, targets); !st.ok()) return st;
  }
  const absl::Duration idle = absl::GetFlag(FLAGS_sequence_idle_timeout);
  if (idle <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sequence_idle_timeout: ", absl::FormatDuration(idle), " is not positive (inf = never)"));
  }
  config.limits.sequence_idle_timeout = idle;
  return config;
}

int Run() {
  v1::KeepFreedMemoryForReuse();
  auto logger = spdlog::stderr_color_mt("smla");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%t] %v");
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));

  // Termination signals are taken synchronously by the main thread (sigwait); every thread
  // created from here on inherits the mask. SIGPIPE from a vanished HTTP peer is ignored.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  spdlog::info("open files: up to {}", edge::RaiseFdLimit());

  int32_t stream_max_inflight = 0;
  int32_t grace_s = 0;
  auto config = BuildConfig(&stream_max_inflight, &grace_s);
  if (!config.ok()) {
    spdlog::error("configuration: {}", config.status().ToString());
    return 2;
  }
  kernels::BackendOptions backend_options;
  backend_options.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  auto backend = kernels::CreateBackend(config->backend, backend_options);
  if (!backend.ok()) {
    spdlog::error("backend: {}", backend.status().ToString());
    return 1;
  }
  const kernels::DeviceInfo device = (*backend)->device();
  for (const ModelConfig& m : config->models) {
    spdlog::info("model {} tp={} heads={} kv={} page_rows={} pool={} bytes", m.profile, m.tp,
                 m.heads_per_rank, kernels::KvFormatName(m.kv_format), m.page_rows, m.pool_bytes);
  }
  edge::FaultInjectingBackend* fault = nullptr;
  const edge::FaultOptions faults{
      .attends_before_failure = absl::GetFlag(FLAGS_inject_backend_failure_after),
      .attend_delay = absl::Milliseconds(absl::GetFlag(FLAGS_inject_attend_delay_ms))};
  if (faults.attends_before_failure >= 0 || faults.attend_delay > absl::ZeroDuration()) {
    auto wrapped = std::make_unique<edge::FaultInjectingBackend>(std::move(*backend), faults);
    fault = wrapped.get();
    *backend = std::move(wrapped);
    spdlog::warn("fault injection: Attend fails after {} calls (-1: never), each held {}",
                 faults.attends_before_failure, absl::FormatDuration(faults.attend_delay));
  }
  auto core = ServiceCore::Create(*config, std::move(*backend));
  if (!core.ok()) {
    spdlog::error("service core: {}", core.status().ToString());
    return 1;
  }
  if (fault != nullptr) fault->Arm();
  edge::EdgeServerOptions options;
  options.listen = config->listen;
  options.metrics_listen = config->metrics_listen;
  options.stream_max_inflight = stream_max_inflight;
  options.shutdown_grace = absl::Seconds(grace_s);
  options.auth.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.auth.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.auth.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth.token_file = absl::GetFlag(FLAGS_token_file);
  options.auth.allow_insecure_remote = absl::GetFlag(FLAGS_allow_insecure_remote);
  options.allow_shm = absl::GetFlag(FLAGS_allow_shm);
  options.shm_socket = absl::GetFlag(FLAGS_shm_socket);
  options.copy_threads = absl::GetFlag(FLAGS_copy_threads);
  if (absl::GetFlag(FLAGS_max_pinned_bytes).empty()) {
    options.max_pinned_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                               static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) / 4;
  } else {
    absl::StatusOr<int64_t> pinned = ParseByteSize(absl::GetFlag(FLAGS_max_pinned_bytes));
    if (!pinned.ok()) {
      spdlog::error("--max_pinned_bytes: {}", pinned.status().ToString());
      return 1;
    }
    options.max_pinned_bytes = static_cast<uint64_t>(*pinned);
  }
  for (auto [flag, target] :
       {std::pair{&FLAGS_max_inflight_bytes, &options.max_inflight_bytes},
        std::pair{&FLAGS_tenant_max_inflight_bytes, &options.tenant_max_inflight_bytes},
        std::pair{&FLAGS_stream_max_inflight_bytes, &options.stream_max_inflight_bytes},
        std::pair{&FLAGS_inline_cache_bytes, &options.inline_cache_bytes}}) {
    absl::StatusOr<int64_t> bytes = ParseByteSize(absl::GetFlag(*flag));
    if (!bytes.ok() || *bytes <= 0) {
      spdlog::error("--{}: {}", std::string(absl::GetFlagReflectionHandle(*flag).Name()),
                    bytes.ok() ? "must be positive" : bytes.status().ToString());
      return 1;
    }
    *target = static_cast<uint64_t>(*bytes);
  }
  for (const std::string& arg : absl::GetFlag(FLAGS_grpc_arg)) {
    const size_t eq = arg.find('=');
    int value = 0;
    if (eq == std::string::npos || !absl::SimpleAtoi(arg.substr(eq + 1), &value)) {
      spdlog::error("--grpc_arg: '{}' is not NAME=INT", arg);
      return 1;
    }
    options.grpc_args.emplace_back(arg.substr(0, eq), value);
  }
  auto server = edge::EdgeServer::Start(core->get(), config->limits, options);
  if (!server.ok()) {
    spdlog::error("edge: {}", server.status().ToString());
    return 1;
  }
  const std::string host = edge::SplitHostPort(config->listen)->first;
  std::string metrics = "off";
  if (!config->metrics_listen.empty()) {
    metrics = absl::StrCat(edge::SplitHostPort(config->metrics_listen)->first, ":",
                           (*server)->metrics_port());
  }
  std::printf("smla-server listening on %s:%d (metrics %s, backend %s)\n", host.c_str(),
              (*server)->port(), metrics.c_str(),
              std::string(kernels::BackendKindName(device.kind)).c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  (*server)->Shutdown();
  server->reset();
  core->reset();
  spdlog::info("exiting");
  return 0;
}

}  // namespace
}  // namespace smla::server

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("smla-server: the sparse-MLA attention service");
  smla::server::CollectModelFlags(argc, argv);
  absl::ParseCommandLine(argc, argv);
  // Debian's abseil is built with its lock-order graph on, which every lock pays for
  // (docs/operations.md, "Debugging"). Off at start-up unless asked for.
  if (!absl::GetFlag(FLAGS_mutex_deadlock_checks)) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  return smla::server::Run();
}
