#include "bench_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "absl/status/status.h"

namespace smla::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct CallSample {
  double e2e_ms, server_ms, queue_ms, kernel_ms;
  int batch_requests;
  double parse_ms, admit_ms, batch_ms;
  double prep_ms, attend_ms, copy_in_ms, copy_out_ms;
  bool phases;  // attend_ms and copy_out_ms were measured (StepTimings.phases_measured)
};

struct StepSample {
  double ms;
  int64_t rows;
  std::vector<CallSample> calls;
};

// What the workers collect, merged at the end.
struct Collected {
  std::mutex mu;
  std::vector<StepSample> steps;
  std::map<std::string, int64_t> errors;
};

}  // namespace

Percentiles Summarise(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
    return v[std::min(i, v.size() - 1)];
  };
  p.p50 = at(0.50);
  p.p90 = at(0.90);
  p.p95 = at(0.95);
  p.p99 = at(0.99);
  p.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  return p;
}

namespace {

// Log-spaced bins (x1.25) from 10 µs, enough to cover the slowest call.
std::vector<HistogramBin> Histogram(std::vector<double> call_ms) {
  std::vector<HistogramBin> bins;
  if (!call_ms.empty()) {
    double upper = 0.01;
    std::vector<double> sorted = std::move(call_ms);
    std::sort(sorted.begin(), sorted.end());
    size_t i = 0;
    while (i < sorted.size()) {
      HistogramBin b{upper, 0};
      while (i < sorted.size() && sorted[i] <= upper) {
        ++b.count;
        ++i;
      }
      if (b.count > 0 || !bins.empty()) bins.push_back(b);
      upper *= 1.25;
    }
  }
  return bins;
}

// The run's statistics from what the workers collected: `measured` is the measured window,
// `until_end` the time from its start to the last worker's end (used for a fixed step count).
RunStats Aggregate(const Collected& out, const RunOptions& options, Clock::duration measured,
                   Clock::duration until_end) {
  RunStats r;
  r.concurrency = options.concurrency;
  r.rate = options.rate;
  r.seconds = std::chrono::duration<double>(options.steps > 0 ? until_end : measured).count();
  r.seconds = std::max(r.seconds, 1e-9);
  r.errors = out.errors;
  std::vector<double> call_ms, step_ms, overhead, transport, service, queue, kernel,
      e2e_minus_kernel, parse, admit, batch_extra, prep, attend, copy_in, copy_out;
  double batch_sum = 0;
  int64_t good_rows = 0;
  for (const StepSample& s : out.steps) {
    r.steps++;
    r.rows += s.rows;
    step_ms.push_back(s.ms);
    const bool good = options.slo_ms <= 0 || s.ms <= options.slo_ms;
    if (good) {
      r.good_steps++;
      good_rows += s.rows;
    }
    for (const CallSample& c : s.calls) {
      r.calls++;
      call_ms.push_back(c.e2e_ms);
      queue.push_back(c.queue_ms);
      kernel.push_back(c.kernel_ms);
      overhead.push_back(std::max(0.0, c.e2e_ms - c.queue_ms - c.kernel_ms));
      transport.push_back(std::max(0.0, c.e2e_ms - c.server_ms));
      service.push_back(std::max(0.0, c.server_ms - c.queue_ms - c.kernel_ms));
      e2e_minus_kernel.push_back(c.e2e_ms - c.kernel_ms);
      parse.push_back(c.parse_ms);
      admit.push_back(c.admit_ms);
      batch_extra.push_back(std::max(0.0, c.batch_ms - c.kernel_ms));
      prep.push_back(c.prep_ms);
      copy_in.push_back(c.copy_in_ms);
      if (c.phases) {
        attend.push_back(c.attend_ms);
        copy_out.push_back(c.copy_out_ms);
      }
      batch_sum += c.batch_requests;
    }
  }
  r.calls_per_s = static_cast<double>(r.calls) / r.seconds;
  r.steps_per_s = static_cast<double>(r.steps) / r.seconds;
  r.rows_per_s = static_cast<double>(r.rows) / r.seconds;
  r.goodput_steps_per_s = static_cast<double>(r.good_steps) / r.seconds;
  r.goodput_rows_per_s = static_cast<double>(good_rows) / r.seconds;
  r.mean_batch_requests = r.calls > 0 ? batch_sum / static_cast<double>(r.calls) : 0;
  r.call_ms = Summarise(call_ms);
  r.step_ms = Summarise(step_ms);
  r.overhead_ms = Summarise(overhead);
  r.transport_ms = Summarise(transport);
  r.service_ms = Summarise(service);
  r.queue_ms = Summarise(queue);
  r.kernel_ms = Summarise(kernel);
  r.e2e_minus_kernel_ms = Summarise(e2e_minus_kernel);
  r.parse_ms = Summarise(parse);
  r.admit_ms = Summarise(admit);
  r.batch_extra_ms = Summarise(batch_extra);
  r.prep_ms = Summarise(prep);
  r.attend_ms = Summarise(attend);
  r.copy_in_ms = Summarise(copy_in);
  r.copy_out_ms = Summarise(copy_out);
  r.slo_met = options.slo_ms <= 0 || r.step_ms.p99 <= options.slo_ms;
  r.histogram = Histogram(std::move(call_ms));
  return r;
}

}  // namespace

RunStats RunOnce(const std::vector<Worker*>& workers, const RunOptions& options) {
  Collected out;
  const auto t0 = Clock::now();
  const auto measure_from = t0 + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(options.warmup_s));
  const auto measure_until =
      options.steps > 0 ? Clock::time_point::max()
                        : measure_from + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(options.duration_s));
  std::atomic<int64_t> measured_steps{0};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> progress_calls{0};
  // Open loop: arrival k is claimed by one worker; arrivals are generated in order.
  std::mutex arrivals_mu;
  std::mt19937_64 arrivals_rng(options.seed);
  std::exponential_distribution<double> gap(options.rate > 0 ? options.rate : 1.0);
  double next_arrival_s = 0.0;

  auto worker_loop = [&](Worker* w) {
    std::vector<StepSample> local;
    std::map<std::string, int64_t> errors;
    v1::StepResponse resp;
    while (!stop.load()) {
      Clock::time_point scheduled;
      if (options.rate > 0) {
        {
          std::lock_guard<std::mutex> lock(arrivals_mu);
          scheduled = t0 + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(next_arrival_s));
          next_arrival_s += gap(arrivals_rng);
        }
        if (scheduled >= measure_until) break;
        std::this_thread::sleep_until(scheduled);
      } else {
        scheduled = Clock::now();
      }
      if (scheduled >= measure_until) break;
      const bool measured = scheduled >= measure_from;
      StepSample step{0, 0, {}};
      bool failed = false;
      Clock::time_point call_start = scheduled;
      for (size_t slot = 0; slot < w->Layers().size(); ++slot) {
        // Not cleared between calls: every transport's reply replaces it, and the inline one
        // then writes its outputs into the strings of the call before (DecodeStepResponse).
        absl::Status st = w->Call(slot, &resp);
        const auto now = Clock::now();
        progress_calls++;
        if (!st.ok()) {
          if (measured) errors[std::string(absl::StatusCodeToString(st.code()))]++;
          failed = true;
          break;
        }
        const auto& tm = resp.timings();
        step.calls.push_back(CallSample{
            Ms(now - call_start), tm.server_us() / 1e3, tm.queued_us() / 1e3, tm.kernel_us() / 1e3,
            tm.batch_requests(), tm.parse_us() / 1e3, tm.admit_us() / 1e3, tm.batch_us() / 1e3,
            tm.prep_us() / 1e3, tm.attend_us() / 1e3, tm.copy_in_us() / 1e3, tm.copy_out_us() / 1e3,
            // A server older than phases_measured measured every batch's phases.
            tm.phases_measured() || tm.attend_us() > 0});
        step.rows += resp.out().shape_size() > 0 ? resp.out().shape(0) : 0;
        call_start = now;
      }
      step.ms = Ms(Clock::now() - scheduled);
      if (failed && w->broken()) break;  // its stream is gone: nothing more to send
      if (measured && !failed) local.push_back(std::move(step));
      // A failed step counts too: a server that refuses every step ends the run, with its errors.
      if (measured && options.steps > 0 && measured_steps.fetch_add(1) + 1 >= options.steps) {
        stop = true;
      }
    }
    std::lock_guard<std::mutex> lock(out.mu);
    for (auto& s : local) out.steps.push_back(std::move(s));
    for (auto& [k, v] : errors) out.errors[k] += v;
  };

  std::vector<std::thread> threads;
  threads.reserve(workers.size());
  for (Worker* w : workers) threads.emplace_back(worker_loop, w);
  std::thread progress;
  std::atomic<bool> progress_stop{false};
  if (options.progress) {
    progress = std::thread([&] {
      while (!progress_stop.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        std::fprintf(stderr, "\r  N=%d %s %.1fs: %lld calls (%.0f calls/s)   ", options.concurrency,
                     s < options.warmup_s ? "warm-up" : "measuring", s,
                     static_cast<long long>(progress_calls.load()),
                     static_cast<double>(progress_calls.load()) / std::max(s, 1e-3));
        std::fflush(stderr);
      }
      std::fprintf(stderr, "\r%*s\r", 70, "");
    });
  }
  if (options.steps == 0) {
    std::this_thread::sleep_until(measure_until);
    stop = true;
  }
  for (auto& t : threads) t.join();
  const auto t_end = Clock::now();
  progress_stop = true;
  if (progress.joinable()) progress.join();

  return Aggregate(out, options, std::min(t_end, measure_until) - measure_from,
                   t_end - measure_from);
}

}  // namespace smla::bench
