// smla-bench: the load tester of smla-server (issue 5), modelled on ghz and perf_analyzer.
//   smla-bench --server 127.0.0.1:50051 --cell "dsv4.1-flash fp8_dsv4 TP4 decode C=32 128K"
//              --layer 2 --transport shm --mode stream --concurrency 1,2,4,8 --duration_s 10
//              --json out.json --html out.html
// docs/results/README.md describes the output.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench_report.h"
#include "bench_runner.h"
#include "bench_workload.h"
#include "smla/base/status_macros.h"
#include "smla/client/cluster.h"
#include "smla/models/grid.h"

ABSL_FLAG(std::vector<std::string>, server, {"127.0.0.1:50051"},
          "smla-server HOST:PORT, repeatable: workers are spread over the servers by the "
          "client's consistent-hash ring");
ABSL_FLAG(std::string, cell, "dsv4.1-flash fp8_dsv4 TP4 decode C=1 128K",
          "Workload cell of docs/performance.md: model [format] [TPn] decode C=N | decode1 C=N | "
          "prefill 8K, context (128K)");
ABSL_FLAG(std::string, layer, "all", "Layer to step, or 'all' for whole model steps");
ABSL_FLAG(int64_t, context, 0, "Override the cell's context (positions), e.g. small on CPU");
ABSL_FLAG(int32_t, prefill_chunk, 4096, "Rows per pre-fill call");
ABSL_FLAG(std::string, transport, "inline",
          "inline, shm (registered shared memory, one range per tensor kind for all spans), "
          "shm_spans (shared memory, each span's tensors named separately), ring (as shm, "
          "sent through a shared-memory step ring attached to the stream; --mode stream), gpu "
          "or gpu_ring (as shm or ring, with the tensors and outputs in a GPU region of the "
          "bench's: a CUDA or HIP build, on the server's node)");
ABSL_FLAG(bool, prefill_shm, true,
          "Pre-fill through a shared-memory region when the server allows it, whatever "
          "--transport (the pre-fill is set-up, not measured)");
ABSL_FLAG(std::string, mode, "stream", "stream (StepStream) or unary (Step)");
ABSL_FLAG(int64_t, ring_spin_us, 30,
          "--transport ring: microseconds a wait for a response spins before it sleeps on a "
          "futex (longer trades a client core for the wake-up latency)");
ABSL_FLAG(int32_t, connections, 1, "gRPC connections per server");
ABSL_FLAG(std::vector<std::string>, grpc_arg, {},
          "Extra gRPC channel arguments NAME=INT, comma-separated (docs/operations.md)");
ABSL_FLAG(int32_t, copy_threads, -1,
          "Threads that copy large responses' tensor bytes beside the reading thread "
          "(ClientOptions::copy_threads; -1: the client's default, 0: none)");
ABSL_FLAG(bool, keep_freed_memory, true,
          "Let malloc keep freed memory for reuse (ClientOptions::keep_freed_memory); false "
          "shows what a client without it pays");
ABSL_FLAG(std::string, concurrency, "1",
          "Workers (streams); a list (1,2,4,8) is a sweep that stops when rows/s stops "
          "growing or the SLO breaks");
ABSL_FLAG(double, sweep_min_gain, 0.05, "A sweep stops when rows/s grows less than this");
ABSL_FLAG(double, rate, 0, "Open loop: steps per second with Poisson arrivals (0 = closed)");
ABSL_FLAG(double, warmup_s, 1, "Warm-up seconds per run (not measured)");
ABSL_FLAG(double, duration_s, 5, "Measured seconds per run");
ABSL_FLAG(int64_t, steps, 0, "Measured steps per run (failed ones included) instead of a duration");
ABSL_FLAG(double, slo_ms, 0, "Latency objective of a step in ms (goodput, sweep stop)");
ABSL_FLAG(bool, allow_errors, false,
          "Exit 0 even when measured steps failed (overload and fault experiments); without it "
          "failed steps make the exit status 3");
ABSL_FLAG(std::string, output, "bf16", "Output format: bf16 or mxfp8");
ABSL_FLAG(std::string, q_format, "bf16",
          "Query format on the wire, for every transport: bf16, or mxfp8 (e4m3 codes and a "
          "scale byte per 32 lanes, about half the bytes; the server expands them)");
ABSL_FLAG(bool, lse, false, "Ask for the LSE");
ABSL_FLAG(bool, inverse_rope, false, "Inverse RoPE in the epilogue (uploads a table)");
ABSL_FLAG(std::string, json, "", "Write the JSON report here");
ABSL_FLAG(std::string, html, "", "Write the HTML report here");
ABSL_FLAG(uint64_t, seed, 1, "Random seed");

namespace smla::bench {
namespace {

// absl keeps only the last --server; every occurrence counts.
std::vector<std::string>& ServerOccurrences() {
  static std::vector<std::string> s;
  return s;
}

void CollectServers(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    std::string v;
    if (a.rfind("--server=", 0) == 0) {
      v = a.substr(9);
    } else if (a == "--server" && i + 1 < argc) {
      v = argv[i + 1];
    } else {
      continue;
    }
    for (auto part : absl::StrSplit(v, ',', absl::SkipEmpty())) {
      ServerOccurrences().emplace_back(part);
    }
  }
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  return static_cast<bool>(f);
}

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "smla-bench: %s\n", st.ToString().c_str());
  return 1;
}

// Numeric flags out of their range are errors naming the flag, not values clamped or ignored.
absl::Status CheckNumericFlags() {
  struct Bound {
    const char* name;
    double value;
    double min;
  };
  for (const Bound& b : {Bound{"context", double(absl::GetFlag(FLAGS_context)), 0},
                         Bound{"prefill_chunk", double(absl::GetFlag(FLAGS_prefill_chunk)), 1},
                         Bound{"ring_spin_us", double(absl::GetFlag(FLAGS_ring_spin_us)), 0},
                         Bound{"connections", double(absl::GetFlag(FLAGS_connections)), 1},
                         Bound{"rate", absl::GetFlag(FLAGS_rate), 0},
                         Bound{"warmup_s", absl::GetFlag(FLAGS_warmup_s), 0},
                         Bound{"duration_s", absl::GetFlag(FLAGS_duration_s), 1e-3},
                         Bound{"steps", double(absl::GetFlag(FLAGS_steps)), 0},
                         Bound{"slo_ms", absl::GetFlag(FLAGS_slo_ms), 0}}) {
    if (!(b.value >= b.min)) {  // also catches NaN
      return absl::InvalidArgumentError(
          absl::StrCat("--", b.name, ": ", b.value, " is out of range (minimum ", b.min, ")"));
    }
  }
  return absl::OkStatus();
}

// What the flags ask for, checked.
struct Plan {
  WorkloadSpec spec;
  std::string transport_name;
  Transport transport = Transport::kInline;
  std::string mode;  // stream or unary
  std::string q_format;
  std::vector<int> levels;  // concurrency of each run
  std::vector<std::string> servers;
  int connections = 1;  // per server
};

absl::StatusOr<WorkloadSpec> SpecFromFlags() {
  SMLA_RETURN_IF_ERROR(CheckNumericFlags());
  absl::StatusOr<models::Cell> cell = models::ParseCell(absl::GetFlag(FLAGS_cell));
  if (!cell.ok())
    return absl::InvalidArgumentError(absl::StrCat("--cell: ", cell.status().message()));
  WorkloadSpec spec;
  spec.cell = *cell;
  if (absl::GetFlag(FLAGS_context) > 0) spec.cell.context = absl::GetFlag(FLAGS_context);
  const std::string layer = absl::GetFlag(FLAGS_layer);
  if (layer != "all" && (!absl::SimpleAtoi(layer, &spec.layer) || spec.layer < 0)) {
    return absl::InvalidArgumentError("--layer: a layer number or 'all'");
  }
  const std::string out = absl::GetFlag(FLAGS_output);
  if (out != "bf16" && out != "mxfp8") return absl::InvalidArgumentError("--output");
  spec.output_format = out == "mxfp8" ? v1::OUTPUT_FORMAT_MXFP8 : v1::OUTPUT_FORMAT_BF16;
  const std::string q_format = absl::GetFlag(FLAGS_q_format);
  if (q_format != "bf16" && q_format != "mxfp8") {
    return absl::InvalidArgumentError("--q_format: bf16 or mxfp8");
  }
  spec.mxfp8_q = q_format == "mxfp8";
  spec.want_lse = absl::GetFlag(FLAGS_lse);
  spec.inverse_rope = absl::GetFlag(FLAGS_inverse_rope);
  return spec;
}

absl::StatusOr<Plan> PlanFromFlags() {
  Plan plan;
  SMLA_ASSIGN_OR_RETURN(plan.spec, SpecFromFlags());
  plan.q_format = absl::GetFlag(FLAGS_q_format);
  plan.transport_name = absl::GetFlag(FLAGS_transport);
  const std::string& t = plan.transport_name;
  static const absl::flat_hash_map<std::string, Transport> kTransports = {
      {"inline", Transport::kInline}, {"shm", Transport::kShm}, {"shm_spans", Transport::kShmSpans},
      {"ring", Transport::kRing},     {"gpu", Transport::kGpu}, {"gpu_ring", Transport::kGpuRing}};
  const auto known = kTransports.find(t);
  if (known == kTransports.end()) {
    return absl::InvalidArgumentError("--transport: inline, shm, shm_spans, ring, gpu or gpu_ring");
  }
  plan.transport = known->second;
  plan.mode = absl::GetFlag(FLAGS_mode);
  if (plan.mode != "stream" && plan.mode != "unary") {
    return absl::InvalidArgumentError("--mode: stream or unary");
  }
  if ((plan.transport == Transport::kRing || plan.transport == Transport::kGpuRing) &&
      plan.mode != "stream") {
    return absl::InvalidArgumentError("--transport ring and gpu_ring need --mode stream");
  }
  for (auto part : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n <= 0) {
      return absl::InvalidArgumentError("--concurrency: positive integers");
    }
    plan.levels.push_back(n);
  }
  if (plan.levels.empty()) return absl::InvalidArgumentError("--concurrency: empty");
  plan.servers = ServerOccurrences();
  if (plan.servers.empty()) plan.servers = absl::GetFlag(FLAGS_server);
  plan.connections = absl::GetFlag(FLAGS_connections);
  return plan;
}

// `connections` per server. Distinct channel arguments keep gRPC from folding them onto one
// TCP connection (it shares subchannels of identical channels).
using Connections = std::vector<std::vector<std::unique_ptr<Connection>>>;

absl::StatusOr<Connections> Connect(const Plan& plan) {
  Connections connections(plan.servers.size());
  for (size_t s = 0; s < plan.servers.size(); ++s) {
    for (int c = 0; c < plan.connections; ++c) {
      client::ClientOptions o;
      o.target = plan.servers[s];
      o.max_message_bytes = (1 << 30) - c;
      o.keep_freed_memory = absl::GetFlag(FLAGS_keep_freed_memory);
      o.copy_threads = absl::GetFlag(FLAGS_copy_threads);
      for (const std::string& arg : absl::GetFlag(FLAGS_grpc_arg)) {
        const size_t eq = arg.find('=');
        int value = 0;
        if (eq == std::string::npos || !absl::SimpleAtoi(arg.substr(eq + 1), &value)) {
          return absl::InvalidArgumentError(
              absl::StrCat("--grpc_arg: '", arg, "' is not NAME=INT"));
        }
        o.grpc_args.emplace_back(arg.substr(0, eq), value);
      }
      SMLA_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> cl, client::Client::Connect(o));
      connections[s].push_back(
          std::make_unique<Connection>(Connection{plan.servers[s], std::move(cl)}));
    }
  }
  return connections;
}

// The served model the spec names, with the spec's format and TP filled in from it; sinks and
// the rope table uploaded to every server.
absl::StatusOr<v1::ModelInfo> ResolveModel(const v1::ServerInfo& info, const Connections& conns,
                                           WorkloadSpec* spec) {
  SMLA_ASSIGN_OR_RETURN(v1::ModelInfo model, FindModel(info, *spec));
  if (!spec->cell.format) spec->cell.format = kernels::ParseKvFormat(model.kv_format());
  if (spec->cell.tp == 0) spec->cell.tp = model.tp();
  if (spec->layer >= model.layers_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--layer ", spec->layer, ": the model has ", model.layers_size()));
  }
  for (const auto& server : conns) {
    SMLA_RETURN_IF_ERROR(
        PrepareModel(server[0]->client.get(), model, *spec, absl::GetFlag(FLAGS_seed)));
  }
  return model;
}

// The workers, created and set up on demand: worker i goes to the server the client's hash
// ring picks for "worker-i", on that server's connections in turn.
class WorkerPool {
 public:
  WorkerPool(const Plan& plan, const v1::ModelInfo& model, const Connections& connections)
      : plan_(plan), model_(model), connections_(connections), per_server_(plan.servers.size()) {
    for (const std::string& s : plan.servers) ring_.Add(s);
  }

  absl::Status Grow(int n) {
    while (static_cast<int>(workers_.size()) < n) {
      const int i = static_cast<int>(workers_.size());
      const std::string where = ring_.Find(absl::StrCat("worker-", i));
      size_t s = 0;
      while (plan_.servers[s] != where) ++s;
      Connection* c = connections_[s][per_server_[s]++ % plan_.connections].get();
      auto w = std::make_unique<Worker>(i, plan_.spec, model_, c, plan_.transport,
                                        plan_.mode == "stream", &totals_);
      w->set_ring_spin(absl::Microseconds(absl::GetFlag(FLAGS_ring_spin_us)));
      if (absl::Status st = w->Setup(absl::GetFlag(FLAGS_prefill_chunk), absl::GetFlag(FLAGS_seed),
                                     absl::GetFlag(FLAGS_prefill_shm));
          !st.ok()) {
        return absl::Status(st.code(), absl::StrCat("worker ", i, " set-up: ", st.message()));
      }
      workers_.push_back(std::move(w));
    }
    return absl::OkStatus();
  }

  std::vector<Worker*> First(int n) const {
    std::vector<Worker*> use;
    use.reserve(n);
    for (int i = 0; i < n; ++i) use.push_back(workers_[i].get());
    return use;
  }

  // Releases every worker's sequences and regions; the call totals go into the report.
  void Teardown(Report* report) {
    for (auto& w : workers_) w->Teardown();
    report->total_unary_ok = totals_.unary_ok.load();
    report->total_stream_ok = totals_.stream_ok.load();
    report->total_rows_ok = totals_.rows_ok.load();
    report->total_failed = totals_.failed.load();
  }

 private:
  const Plan& plan_;
  const v1::ModelInfo& model_;
  const Connections& connections_;
  client::HashRing ring_;
  std::vector<int> per_server_;
  CallTotals totals_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

// The report's description of the run, printed as its first line.
Report StartReport(const Plan& plan, const v1::ServerInfo& info) {
  Report report;
  report.cell = plan.spec.Name();
  report.transport = plan.transport_name;
  report.mode = plan.mode;
  report.q_format = plan.q_format;
  report.loop = absl::GetFlag(FLAGS_rate) > 0 ? "open" : "closed";
  report.servers = plan.servers;
  report.connections = plan.connections;
  report.device = absl::StrCat(info.device().backend(), " ", info.device().name());
  report.date = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  report.slo_ms = absl::GetFlag(FLAGS_slo_ms);
  std::printf(
      "smla-bench: %s, %s %s, %s queries, %s loop, %zu server(s) x %d connection(s), device %s\n",
      report.cell.c_str(), plan.transport_name.c_str(), plan.mode.c_str(), plan.q_format.c_str(),
      report.loop.c_str(), plan.servers.size(), plan.connections, report.device.c_str());
  std::fflush(stdout);
  return report;
}

// One run per concurrency level; a sweep (several levels) stops when the SLO breaks or rows/s
// stops growing. Returns the exit code: 1 when a level's workers could not be set up.
int Sweep(const Plan& plan, WorkerPool& pool, Report* report) {
  RunOptions ro;
  ro.rate = absl::GetFlag(FLAGS_rate);
  ro.warmup_s = absl::GetFlag(FLAGS_warmup_s);
  ro.duration_s = absl::GetFlag(FLAGS_duration_s);
  ro.steps = absl::GetFlag(FLAGS_steps);
  ro.slo_ms = report->slo_ms;
  ro.progress = isatty(STDOUT_FILENO) != 0;
  ro.seed = absl::GetFlag(FLAGS_seed);
  const std::vector<int>& levels = plan.levels;
  double best_rows = 0;
  for (size_t k = 0; k < levels.size(); ++k) {
    if (absl::Status st = pool.Grow(levels[k]); !st.ok()) {
      Fail(st);
      return 1;
    }
    ro.concurrency = levels[k];
    RunStats r = RunOnce(pool.First(levels[k]), ro);
    std::printf("%s", TextSummary(r).c_str());
    std::fflush(stdout);
    report->runs.push_back(r);
    if (levels.size() > 1) {
      if (!r.slo_met) {
        report->stop_reason = absl::StrCat("step p99 ", r.step_ms.p99, " ms broke the SLO of ",
                                           report->slo_ms, " ms at N=", levels[k]);
        break;
      }
      if (k > 0 && r.rows_per_s < best_rows * (1 + absl::GetFlag(FLAGS_sweep_min_gain))) {
        report->stop_reason = absl::StrCat("rows/s stopped growing at N=", levels[k]);
        break;
      }
    }
    best_rows = std::max(best_rows, r.rows_per_s);
  }
  return 0;
}

absl::Status WriteReports(const Report& report) {
  if (!absl::GetFlag(FLAGS_json).empty() && !WriteFile(absl::GetFlag(FLAGS_json), ToJson(report))) {
    return absl::InternalError("cannot write --json");
  }
  if (!absl::GetFlag(FLAGS_html).empty() && !WriteFile(absl::GetFlag(FLAGS_html), ToHtml(report))) {
    return absl::InternalError("cannot write --html");
  }
  return absl::OkStatus();
}

int Run() {
  absl::StatusOr<Plan> plan = PlanFromFlags();
  if (!plan.ok()) return Fail(plan.status());
  absl::StatusOr<Connections> connections = Connect(*plan);
  if (!connections.ok()) return Fail(connections.status());
  absl::StatusOr<v1::ServerInfo> info = (*connections)[0][0]->client->Info();
  if (!info.ok()) return Fail(info.status());
  absl::StatusOr<v1::ModelInfo> model = ResolveModel(*info, *connections, &plan->spec);
  if (!model.ok()) return Fail(model.status());

  WorkerPool pool(*plan, *model, *connections);
  Report report = StartReport(*plan, *info);
  const int exit_code = Sweep(*plan, pool, &report);
  pool.Teardown(&report);
  if (!report.stop_reason.empty()) std::printf("sweep ended: %s\n", report.stop_reason.c_str());
  if (absl::Status st = WriteReports(report); !st.ok()) return Fail(st);
  if (exit_code != 0) return exit_code;
  // A run whose steps failed measured something other than what was asked: say so in the exit
  // status, so that a script does not take its numbers (the reports are written all the same).
  int64_t failed = 0;
  for (const RunStats& r : report.runs) {
    for (const auto& [code, n] : r.errors) failed += n;
  }
  if (failed > 0 && !absl::GetFlag(FLAGS_allow_errors)) {
    std::fprintf(stderr,
                 "smla-bench: %lld measured step(s) failed (the errors lines above); exit status "
                 "3 (--allow_errors accepts them)\n",
                 static_cast<long long>(failed));
    return 3;
  }
  return 0;
}

}  // namespace
}  // namespace smla::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("smla-bench: load tester of smla-server");
  smla::bench::CollectServers(argc, argv);
  absl::ParseCommandLine(argc, argv);
  // As in smla-server: the client's locks without abseil's lock-order graph, as a frontend
  // built without it would run them.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return smla::bench::Run();
}
