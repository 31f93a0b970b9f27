// One measured run of smla-bench: closed loop (each of N workers sends its next step as soon
// as the previous one is answered) or open loop (steps arrive at a target rate with
// exponential gaps, each taken by a free worker; latency counts from the scheduled arrival,
// so a queue in the client is not hidden), with a warm-up, for a duration or a number of
// steps, and the statistics ghz / perf_analyzer report.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench_workload.h"

namespace smla::bench {

struct RunOptions {
  int concurrency = 1;    // workers used (the first N)
  double rate = 0;        // open loop: steps per second (0 = closed loop)
  double warmup_s = 1;    // calls sent before this are not measured
  double duration_s = 5;  // measured time (when steps == 0)
  int64_t steps = 0;      // measured steps per run, failed ones included, instead of a duration
  double slo_ms = 0;      // latency objective of a step (0 = none)
  bool progress = false;  // a progress line on stderr
  uint64_t seed = 1;
};

struct Percentiles {
  double p50 = 0, p90 = 0, p95 = 0, p99 = 0, max = 0, mean = 0;
};

struct HistogramBin {
  double upper_ms = 0;
  int64_t count = 0;
};

struct RunStats {
  int concurrency = 0;
  double rate = 0;
  double seconds = 0;  // measured wall time
  int64_t calls = 0;   // successful measured calls
  int64_t steps = 0;   // successful measured steps (a step = one call per layer stepped)
  int64_t rows = 0;    // query rows of those calls
  double calls_per_s = 0, steps_per_s = 0, rows_per_s = 0;
  Percentiles call_ms;                    // end-to-end latency of one call
  Percentiles step_ms;                    // of one step (all its calls)
  std::vector<HistogramBin> histogram;    // of call latency
  std::map<std::string, int64_t> errors;  // status code name -> measured calls
  // Per call, from the server's timings: end-to-end = overhead + queue + kernel, where
  // overhead is transport, parsing and response building (client and server side). Overhead
  // splits into transport (end-to-end minus the server's own time: client, gRPC, network) and
  // service (the server's time outside queue and kernel: parsing, validation, the response).
  Percentiles overhead_ms, transport_ms, service_ms, queue_ms, kernel_ms, e2e_minus_kernel_ms;
  // Parts of service (streams only, zero for unary): the edge's parsing, admission (the
  // core's validation) and the executor's batch outside the kernel (page reservations, the
  // launch's host prep, commits); the rest of service is hand-offs between threads and building
  // the response.
  Percentiles parse_ms, admit_ms, batch_extra_ms;
  // Parts of the batch (any call): the launch's host work that its device work did not overlap
  // (inside batch_extra, since kernel is device time only) and the attention kernel alone
  // (inside kernel).
  Percentiles prep_ms, attend_ms;
  // Parts of kernel (device events): input copies, output copies (each with any wait for the
  // host's enqueueing).
  Percentiles copy_in_ms, copy_out_ms;
  double mean_batch_requests = 0;
  int64_t good_steps = 0;  // within the SLO
  double goodput_steps_per_s = 0, goodput_rows_per_s = 0;
  bool slo_met = true;  // step p99 within the SLO
};

RunStats RunOnce(const std::vector<Worker*>& workers, const RunOptions& options);

Percentiles Summarise(std::vector<double> values);

}  // namespace smla::bench
