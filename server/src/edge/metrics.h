// A small Prometheus metrics registry: counters, gauges and fixed-bucket histograms with
// labels, rendered in the text exposition format (version 0.0.4).
//
// Why not prometheus-cpp: Debian 12 and Ubuntu 24.04 both ship it (prometheus-cpp-dev), but
// - several counters (smla_batches_total, ...) are totals the executor keeps and are copied in
//   at scrape time; prometheus::Counter can only be incremented, so each would need a
//   hand-written Collectable anyway;
// - the service serves /metrics through cpp-httplib, so only the core library's serializer
//   would be used, yet prometheus-cpp-dev and its CMake config pull in civetweb and libcurl
//   development packages for the pull and push exporters;
// - this file is small, covered by tests, and its output format is fixed by them.
//
// Thread-safety: every metric is safe to update from any thread; references returned by the
// registry stay valid for the registry's lifetime.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace smla::server::edge {

// Label name/value pairs, in the order they are rendered.
using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Inc(double v = 1.0);
  // For totals kept elsewhere (copied in at scrape time); must never decrease.
  void Set(double v) { bits_.store(ToBits(v), std::memory_order_relaxed); }
  double value() const { return FromBits(bits_.load(std::memory_order_relaxed)); }

 private:
  static uint64_t ToBits(double v);
  static double FromBits(uint64_t b);
  std::atomic<uint64_t> bits_{0};
};

class Gauge {
 public:
  void Set(double v) { bits_.store(ToBits(v), std::memory_order_relaxed); }
  void Add(double v);
  double value() const { return FromBits(bits_.load(std::memory_order_relaxed)); }

 private:
  static uint64_t ToBits(double v);
  static double FromBits(uint64_t b);
  std::atomic<uint64_t> bits_{0};
};

class Histogram {
 public:
  // `bounds`: strictly increasing upper bounds; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // [bounds.size() + 1], the last is the count
    double sum = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket, not cumulative
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// Exponential bucket bounds: start, start*factor, ... (count values).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

class Registry {
 public:
  Counter& GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& bounds, const Labels& labels = {});

  // Runs before every render, to copy values kept elsewhere into gauges and counters.
  void AddCollector(std::function<void()> collect);

  // The text exposition of every metric, families in name order.
  std::string Render() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type;
    std::string help;
    std::map<std::string, Labels> label_sets;  // rendered label key -> labels
    std::map<std::string, std::unique_ptr<Counter>> counters;
    std::map<std::string, std::unique_ptr<Gauge>> gauges;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
  };
  Family& GetFamily(const std::string& name, Type type, const std::string& help)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace smla::server::edge
