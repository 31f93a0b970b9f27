// smla-bench against the real smla-server: what the bench says it did matches the server's
// own metrics exactly (calls by method, rows), its reports are produced and well-formed, and a
// run of a step count ends when the server refuses every step.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "harness.h"
#include "nlohmann/json.hpp"
#include "prometheus_text.h"

namespace smla::testing {
namespace {

struct Counts {
  double stream_ok = 0, unary_ok = 0, rows = 0;
};

Counts Scrape(const ServerProcess& server) {
  Counts c;
  auto text = server.ScrapeMetrics();
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return c;
  auto e = ParsePrometheusText(*text);
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return c;
  c.stream_ok = e->Sum("smla_requests_total", {{"method", "StepStream"}, {"code", "OK"}});
  c.unary_ok = e->Sum("smla_requests_total", {{"method", "Step"}, {"code", "OK"}});
  c.rows = e->Sum("smla_step_rows_total");
  return c;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Runs smla-bench with `args`; returns its exit status and its stdout in `out`. The binary is
// the build's, or $SMLA_BENCH_BINARY (a bundle carried to a GPU machine, like the server's).
// With `timeout_s`, a bench still running then is killed (exit status 124).
int RunBench(const std::vector<std::string>& args, std::string* out, int timeout_s = 0) {
  // Per process: ctest runs these tests side by side, and TempDir is shared.
  const std::string log = absl::StrCat(::testing::TempDir(), "/bench_stdout_", getpid(), ".txt");
  const char* binary = std::getenv("SMLA_BENCH_BINARY");
  std::string cmd = timeout_s > 0 ? absl::StrCat("timeout ", timeout_s, " ") : "";
  cmd += binary != nullptr ? binary : SMLA_BENCH_BINARY;
  for (const std::string& a : args) absl::StrAppend(&cmd, " '", a, "'");
  absl::StrAppend(&cmd, " > '", log, "' 2>&1");
  const int rc = std::system(cmd.c_str());
  *out = ReadAll(log);
  std::remove(log.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

void CheckAgainstServer(const std::vector<std::string>& bench_args, const std::string& tag,
                        const std::string& q_format = "bf16") {
  auto server = ServerProcess::Start({kDsv41, "--allow_shm"});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string json_path = ::testing::TempDir() + "/bench_" + tag + ".json";
  const std::string html_path = ::testing::TempDir() + "/bench_" + tag + ".html";
  std::remove(json_path.c_str());
  std::remove(html_path.c_str());
  const Counts before = Scrape(**server);
  std::vector<std::string> args = {"--server=" + (*server)->target(), "--json=" + json_path,
                                   "--html=" + html_path};
  args.insert(args.end(), bench_args.begin(), bench_args.end());
  if (q_format != "bf16") args.push_back("--q_format=" + q_format);
  std::string out;
  ASSERT_EQ(RunBench(args, &out), 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr(q_format + " queries")) << out;
  const Counts after = Scrape(**server);
  const std::string json = ReadAll(json_path);
  ASSERT_FALSE(json.empty()) << out;
  const auto report = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(report.is_discarded()) << "not JSON: " << json;
  EXPECT_EQ(report.value("tool", ""), "smla-bench") << json;
  EXPECT_EQ(report.value("q_format", ""), q_format) << json;

  const nlohmann::json totals = report.value("totals", nlohmann::json::object());
  const int64_t stream_ok = totals.value("stream_ok", int64_t{-1});
  const int64_t unary_ok = totals.value("unary_ok", int64_t{-1});
  const int64_t rows_ok = totals.value("rows_ok", int64_t{-1});
  EXPECT_EQ(totals.value("failed", int64_t{-1}), 0) << json;
  EXPECT_EQ(after.stream_ok - before.stream_ok, stream_ok) << json;
  EXPECT_EQ(after.unary_ok - before.unary_ok, unary_ok) << json;
  EXPECT_EQ(after.rows - before.rows, rows_ok) << json;
  EXPECT_GT(rows_ok, 0);
  const nlohmann::json runs = report.value("runs", nlohmann::json::array());
  ASSERT_FALSE(runs.empty()) << json;
  for (const nlohmann::json& run : runs) {
    const int64_t calls = run.value("calls", int64_t{-1});
    EXPECT_GT(calls, 0) << json;
    // Every run's calls are among the calls the server counted.
    EXPECT_LE(calls, stream_ok + unary_ok);
    EXPECT_TRUE(run.contains("call_ms") && run["call_ms"].contains("p99")) << json;
  }

  const std::string html = ReadAll(html_path);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  EXPECT_GE(Count(html, "<svg"), 3u);
  EXPECT_EQ(Count(html, "<svg"), Count(html, "</svg>"));
  EXPECT_EQ(Count(html, "<table"), Count(html, "</table>"));
  EXPECT_EQ(Count(html, "<tr>"), Count(html, "</tr>"));
  EXPECT_EQ(html.find("<script"), std::string::npos) << "the report must open offline";
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"))
      << "no external resources besides the SVG namespace";
  EXPECT_EQ((*server)->Terminate(), 0);
}

TEST(BenchTest, ShmStreamSweepMatchesServerMetrics) {
  CheckAgainstServer({"--cell=dsv4.1-flash decode C=2", "--context=128", "--layer=2",
                      "--prefill_chunk=64", "--transport=shm", "--mode=stream", "--concurrency=1,2",
                      "--sweep_min_gain=-1", "--warmup_s=0.2", "--steps=15"},
                     "shm");
}

TEST(BenchTest, RingStreamMatchesServerMetrics) {
  CheckAgainstServer(
      {"--cell=dsv4.1-flash decode C=2", "--context=128", "--layer=2", "--prefill_chunk=64",
       "--transport=ring", "--mode=stream", "--concurrency=2", "--warmup_s=0.2", "--steps=15"},
      "ring");
}

TEST(BenchTest, InlineUnaryModelStepsOpenLoopMatchServerMetrics) {
  CheckAgainstServer({"--cell=dsv4.1-flash decode1 C=1", "--context=16", "--layer=all",
                      "--transport=inline", "--mode=unary", "--concurrency=2", "--rate=20",
                      "--warmup_s=0.1", "--duration_s=1", "--slo_ms=10000"},
                     "unary");
}

// MXFP8 queries on every transport: each call is accepted (the server rejects malformed
// query tensors), and the report names the format.
TEST(BenchTest, Mxfp8QueriesOnEveryTransport) {
  for (const std::string transport : {"inline", "shm", "shm_spans", "ring"}) {
    SCOPED_TRACE(transport);
    CheckAgainstServer({"--cell=dsv4.1-flash decode C=2", "--context=64", "--layer=2",
                        "--prefill_chunk=64", "--transport=" + transport, "--mode=stream",
                        "--concurrency=1", "--warmup_s=0.1", "--steps=5"},
                       "mxfp8_" + transport, "mxfp8");
  }
}

// Out-of-range numbers stop the bench before it connects, naming the flag.
// GPU-region transports: on a GPU host (SMLA_TEST_BACKEND=cuda with a CUDA smla-bench) every
// call is accepted and counted by the server; a build without a GPU runtime refuses them.
TEST(BenchTest, GpuTransports) {
  const char* backend = std::getenv("SMLA_TEST_BACKEND");
  const std::vector<std::string> base = {"--cell=dsv4.1-flash decode C=2",
                                         "--context=128",
                                         "--layer=2",
                                         "--prefill_chunk=64",
                                         "--mode=stream",
                                         "--concurrency=1",
                                         "--warmup_s=0.2",
                                         "--steps=15"};
  if (backend != nullptr && std::string(backend) == "cuda") {
    for (const std::string transport : {"gpu", "gpu_ring"}) {
      SCOPED_TRACE(transport);
      std::vector<std::string> args = base;
      args.push_back("--transport=" + transport);
      CheckAgainstServer(args, transport);
    }
    return;
  }
  auto server = ServerProcess::Start({kDsv41, "--allow_shm"});
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::string> args = base;
  args.push_back("--server=" + (*server)->target());
  args.push_back("--transport=gpu");
  std::string out;
  EXPECT_EQ(RunBench(args, &out), 1) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("GPU-region transports need a CUDA or HIP build")) << out;
  EXPECT_EQ((*server)->Terminate(), 0);
}

// A run of --steps ends even when the server refuses every step (here each decode step names
// two spans, one more than the server takes), reports the errors and exits 3, or 0 with
// --allow_errors.
TEST(BenchTest, StepCountedRunEndsWhenEveryStepFails) {
  auto server = ServerProcess::Start({kDsv41, "--max_spans_per_step=1"});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::vector<std::string> args = {"--server=" + (*server)->target(),
                                         "--cell=dsv4.1-flash decode C=2",
                                         "--context=64",
                                         "--layer=2",
                                         "--prefill_chunk=64",
                                         "--mode=stream",
                                         "--warmup_s=0.1",
                                         "--steps=5"};
  std::string out;
  EXPECT_EQ(RunBench(args, &out, 60), 3) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("errors: INVALID_ARGUMENT=5")) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("5 measured step(s) failed")) << out;
  std::vector<std::string> allowed = args;
  allowed.push_back("--allow_errors");
  EXPECT_EQ(RunBench(allowed, &out, 60), 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("errors: INVALID_ARGUMENT=5")) << out;
  EXPECT_EQ((*server)->Terminate(), 0);
}

TEST(BenchTest, OutOfRangeFlagsAreRefused) {
  for (const std::string flag : {"--duration_s=0", "--prefill_chunk=0", "--connections=0",
                                 "--rate=-1", "--warmup_s=nan", "--steps=-3"}) {
    SCOPED_TRACE(flag);
    std::string out;
    EXPECT_EQ(RunBench({"--server=127.0.0.1:1", flag}, &out), 1) << out;
    EXPECT_THAT(out, ::testing::HasSubstr(flag.substr(0, flag.find('=')) + ": ")) << out;
  }
}

}  // namespace
}  // namespace smla::testing
