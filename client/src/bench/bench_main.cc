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

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench_report.h"
#include "bench_runner.h"
#include "bench_workload.h"
#include "smla/client/cluster.h"

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
          "shm_spans (shared memory, each span's tensors named separately) or ring (as shm, "
          "sent through a shared-memory step ring attached to the stream; --mode stream)");
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
ABSL_FLAG(int64_t, steps, 0, "Measured steps per run instead of a duration");
ABSL_FLAG(double, slo_ms, 0, "Latency objective of a step in ms (goodput, sweep stop)");
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

// Flag checks, set-up and the runs in one: split it into phases before it grows.
int Run() {  // NOLINT(readability-function-size)
  if (absl::Status st = CheckNumericFlags(); !st.ok()) return Fail(st);
  auto spec_or = ParseCell(absl::GetFlag(FLAGS_cell));
  if (!spec_or.ok()) return Fail(spec_or.status());
  WorkloadSpec spec = *spec_or;
  if (absl::GetFlag(FLAGS_context) > 0) spec.context = absl::GetFlag(FLAGS_context);
  const std::string layer = absl::GetFlag(FLAGS_layer);
  if (layer != "all" && (!absl::SimpleAtoi(layer, &spec.layer) || spec.layer < 0)) {
    return Fail(absl::InvalidArgumentError("--layer: a layer number or 'all'"));
  }
  const std::string out = absl::GetFlag(FLAGS_output);
  if (out != "bf16" && out != "mxfp8") return Fail(absl::InvalidArgumentError("--output"));
  spec.output_format = out == "mxfp8" ? v1::OUTPUT_FORMAT_MXFP8 : v1::OUTPUT_FORMAT_BF16;
  const std::string q_format = absl::GetFlag(FLAGS_q_format);
  if (q_format != "bf16" && q_format != "mxfp8") {
    return Fail(absl::InvalidArgumentError("--q_format: bf16 or mxfp8"));
  }
  spec.mxfp8_q = q_format == "mxfp8";
  spec.want_lse = absl::GetFlag(FLAGS_lse);
  spec.inverse_rope = absl::GetFlag(FLAGS_inverse_rope);
  const std::string transport_name = absl::GetFlag(FLAGS_transport);
  if (transport_name != "inline" && transport_name != "shm" && transport_name != "shm_spans" &&
      transport_name != "ring") {
    return Fail(absl::InvalidArgumentError("--transport: inline, shm, shm_spans or ring"));
  }
  const Transport transport = transport_name == "shm"         ? Transport::kShm
                              : transport_name == "shm_spans" ? Transport::kShmSpans
                              : transport_name == "ring"      ? Transport::kRing
                                                              : Transport::kInline;
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "stream" && mode != "unary") {
    return Fail(absl::InvalidArgumentError("--mode: stream or unary"));
  }
  if (transport == Transport::kRing && mode != "stream") {
    return Fail(absl::InvalidArgumentError("--transport ring needs --mode stream"));
  }
  std::vector<int> levels;
  for (auto part : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n <= 0) {
      return Fail(absl::InvalidArgumentError("--concurrency: positive integers"));
    }
    levels.push_back(n);
  }
  if (levels.empty()) return Fail(absl::InvalidArgumentError("--concurrency: empty"));
  std::vector<std::string> servers = ServerOccurrences();
  if (servers.empty()) servers = absl::GetFlag(FLAGS_server);

  // Connections: `connections` per server. Distinct channel arguments keep gRPC from
  // folding them onto one TCP connection (it shares subchannels of identical channels).
  const int conns = absl::GetFlag(FLAGS_connections);
  std::vector<std::vector<std::unique_ptr<Connection>>> connections(servers.size());
  client::HashRing ring;
  for (size_t s = 0; s < servers.size(); ++s) {
    ring.Add(servers[s]);
    for (int c = 0; c < conns; ++c) {
      client::ClientOptions o;
      o.target = servers[s];
      o.max_message_bytes = (1 << 30) - c;
      o.keep_freed_memory = absl::GetFlag(FLAGS_keep_freed_memory);
      o.copy_threads = absl::GetFlag(FLAGS_copy_threads);
      for (const std::string& arg : absl::GetFlag(FLAGS_grpc_arg)) {
        const size_t eq = arg.find('=');
        int value = 0;
        if (eq == std::string::npos || !absl::SimpleAtoi(arg.substr(eq + 1), &value)) {
          return Fail(
              absl::InvalidArgumentError(absl::StrCat("--grpc_arg: '", arg, "' is not NAME=INT")));
        }
        o.grpc_args.emplace_back(arg.substr(0, eq), value);
      }
      auto cl = client::Client::Connect(o);
      if (!cl.ok()) return Fail(cl.status());
      connections[s].push_back(
          std::make_unique<Connection>(Connection{servers[s], *std::move(cl)}));
    }
  }
  auto info = connections[0][0]->client->Info();
  if (!info.ok()) return Fail(info.status());
  auto model = FindModel(*info, spec);
  if (!model.ok()) return Fail(model.status());
  if (spec.format.empty()) spec.format = model->kv_format();
  if (spec.tp == 0) spec.tp = model->tp();
  if (spec.layer >= model->layers_size()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--layer ", spec.layer, ": the model has ", model->layers_size())));
  }
  for (size_t s = 0; s < servers.size(); ++s) {
    if (absl::Status st =
            PrepareModel(connections[s][0]->client.get(), *model, spec, absl::GetFlag(FLAGS_seed));
        !st.ok()) {
      return Fail(st);
    }
  }

  CallTotals totals;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<int> per_server(servers.size(), 0);
  auto grow = [&](int n) -> absl::Status {
    while (static_cast<int>(workers.size()) < n) {
      const int i = static_cast<int>(workers.size());
      const std::string where = ring.Find(absl::StrCat("worker-", i));
      size_t s = 0;
      while (servers[s] != where) ++s;
      Connection* c = connections[s][per_server[s]++ % conns].get();
      auto w = std::make_unique<Worker>(i, spec, *model, c, transport, mode == "stream", &totals);
      w->set_ring_spin(absl::Microseconds(absl::GetFlag(FLAGS_ring_spin_us)));
      if (absl::Status st = w->Setup(absl::GetFlag(FLAGS_prefill_chunk), absl::GetFlag(FLAGS_seed),
                                     absl::GetFlag(FLAGS_prefill_shm));
          !st.ok()) {
        return absl::Status(st.code(), absl::StrCat("worker ", i, " set-up: ", st.message()));
      }
      workers.push_back(std::move(w));
    }
    return absl::OkStatus();
  };

  Report report;
  report.cell = spec.Name();
  report.transport = transport_name;
  report.mode = mode;
  report.q_format = q_format;
  report.loop = absl::GetFlag(FLAGS_rate) > 0 ? "open" : "closed";
  report.servers = servers;
  report.connections = conns;
  report.device = absl::StrCat(info->device().backend(), " ", info->device().name());
  report.date = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  report.slo_ms = absl::GetFlag(FLAGS_slo_ms);
  std::printf(
      "smla-bench: %s, %s %s, %s queries, %s loop, %zu server(s) x %d connection(s), device %s\n",
      report.cell.c_str(), transport_name.c_str(), mode.c_str(), q_format.c_str(),
      report.loop.c_str(), servers.size(), conns, report.device.c_str());
  std::fflush(stdout);

  RunOptions ro;
  ro.rate = absl::GetFlag(FLAGS_rate);
  ro.warmup_s = absl::GetFlag(FLAGS_warmup_s);
  ro.duration_s = absl::GetFlag(FLAGS_duration_s);
  ro.steps = absl::GetFlag(FLAGS_steps);
  ro.slo_ms = report.slo_ms;
  ro.progress = isatty(STDOUT_FILENO) != 0;
  ro.seed = absl::GetFlag(FLAGS_seed);
  double best_rows = 0;
  int exit_code = 0;
  for (size_t k = 0; k < levels.size(); ++k) {
    if (absl::Status st = grow(levels[k]); !st.ok()) {
      Fail(st);
      exit_code = 1;
      break;
    }
    ro.concurrency = levels[k];
    std::vector<Worker*> use;
    use.reserve(levels[k]);
    for (int i = 0; i < levels[k]; ++i) use.push_back(workers[i].get());
    RunStats r = RunOnce(use, ro);
    std::printf("%s", TextSummary(r).c_str());
    std::fflush(stdout);
    report.runs.push_back(r);
    if (levels.size() > 1) {
      if (!r.slo_met) {
        report.stop_reason = absl::StrCat("step p99 ", r.step_ms.p99, " ms broke the SLO of ",
                                          report.slo_ms, " ms at N=", levels[k]);
        break;
      }
      if (k > 0 && r.rows_per_s < best_rows * (1 + absl::GetFlag(FLAGS_sweep_min_gain))) {
        report.stop_reason = absl::StrCat("rows/s stopped growing at N=", levels[k]);
        break;
      }
    }
    best_rows = std::max(best_rows, r.rows_per_s);
  }
  for (auto& w : workers) w->Teardown();
  report.total_unary_ok = totals.unary_ok.load();
  report.total_stream_ok = totals.stream_ok.load();
  report.total_rows_ok = totals.rows_ok.load();
  report.total_failed = totals.failed.load();
  if (!report.stop_reason.empty()) std::printf("sweep ended: %s\n", report.stop_reason.c_str());
  if (!absl::GetFlag(FLAGS_json).empty() && !WriteFile(absl::GetFlag(FLAGS_json), ToJson(report))) {
    return Fail(absl::InternalError("cannot write --json"));
  }
  if (!absl::GetFlag(FLAGS_html).empty() && !WriteFile(absl::GetFlag(FLAGS_html), ToHtml(report))) {
    return Fail(absl::InternalError("cannot write --html"));
  }
  return exit_code;
}

}  // namespace
}  // namespace smla::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("smla-bench: load tester of smla-server");
  smla::bench::CollectServers(argc, argv);
  absl::ParseCommandLine(argc, argv);
  return smla::bench::Run();
}
