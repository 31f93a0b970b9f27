// smla-bench output: a text summary (ghz-style), JSON (docs/results/README.md describes its
// fields) and a self-contained HTML report with inline SVG charts (latency and throughput
// against concurrency, the time breakdown of a call, the latency histogram) that opens
// offline: no scripts, no external CSS.
#pragma once

#include <string>
#include <vector>

#include "bench_runner.h"
#include "bench_workload.h"

namespace smla::bench {

struct Report {
  std::string cell;       // the workload's name
  std::string transport;  // "inline" | "shm"
  std::string mode;       // "stream" | "unary"
  std::string q_format;   // "bf16" | "mxfp8": how the queries travel
  std::string loop;       // "closed" | "open"
  std::vector<std::string> servers;
  int connections = 1;
  std::string device;  // the first server's device (backend and name)
  std::string date;    // UTC, ISO 8601
  double slo_ms = 0;
  std::string stop_reason;  // why a sweep ended
  std::vector<RunStats> runs;
  // Every call the bench made (set-up and warm-up included), for comparison with the server.
  int64_t total_unary_ok = 0, total_stream_ok = 0, total_rows_ok = 0, total_failed = 0;
};

std::string TextSummary(const RunStats& run);
std::string ToJson(const Report& report);
std::string ToHtml(const Report& report);

}  // namespace smla::bench
