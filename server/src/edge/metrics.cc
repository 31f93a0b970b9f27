#include "metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace smla::server::edge {
namespace {

uint64_t DoubleBits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
double BitsDouble(uint64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

void AtomicAdd(std::atomic<uint64_t>& bits, double v) {
  uint64_t old = bits.load(std::memory_order_relaxed);
  while (!bits.compare_exchange_weak(old, DoubleBits(BitsDouble(old) + v),
                                     std::memory_order_relaxed)) {
  }
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.12g", v);
}

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// `{a="x",b="y"}` with an optional extra label (the histogram's `le`); empty when none.
std::string RenderLabels(const Labels& labels, const std::string& extra_name = "",
                         const std::string& extra_value = "") {
  std::vector<std::string> parts;
  for (const auto& [k, v] : labels)
    parts.push_back(absl::StrCat(k, "=\"", EscapeLabelValue(v), "\""));
  if (!extra_name.empty()) parts.push_back(absl::StrCat(extra_name, "=\"", extra_value, "\""));
  if (parts.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < parts.size(); ++i) absl::StrAppend(&out, i ? "," : "", parts[i]);
  return out + "}";
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Registration mistakes are programming errors, not runtime conditions.
[[noreturn]] void Die(const char* what, const std::string& name) {
  std::fprintf(stderr, "metrics: %s%s\n", what, name.c_str());
  std::abort();
}

}  // namespace

void Counter::Inc(double v) { AtomicAdd(bits_, v); }
uint64_t Counter::ToBits(double v) { return DoubleBits(v); }
double Counter::FromBits(uint64_t b) { return BitsDouble(b); }

void Gauge::Add(double v) { AtomicAdd(bits_, v); }
uint64_t Gauge::ToBits(double v) { return DoubleBits(v); }
double Gauge::FromBits(uint64_t b) { return BitsDouble(b); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  if (!std::is_sorted(bounds_.begin(), bounds_.end()) ||
      std::adjacent_find(bounds_.begin(), bounds_.end()) != bounds_.end()) {
    Die("histogram bounds must increase strictly", "");
  }
}

void Histogram::Observe(double v) {
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();  // le semantics
  absl::MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += v;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.bounds = bounds_;
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (uint64_t c : counts_) {
    total += c;
    s.cumulative.push_back(total);
  }
  s.sum = sum_;
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

Registry::Family& Registry::GetFamily(const std::string& name, Type type, const std::string& help) {
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.type = type;
    it->second.help = help;
  }
  if (it->second.type != type) Die("metric registered with two types: ", name);
  return it->second;
}

Counter& Registry::GetCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Family& f = GetFamily(name, Type::kCounter, help);
  const std::string key = RenderLabels(labels);
  auto& slot = f.counters[key];
  if (!slot) {
    slot = std::make_unique<Counter>();
    f.label_sets[key] = labels;
  }
  return *slot;
}

Gauge& Registry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Family& f = GetFamily(name, Type::kGauge, help);
  const std::string key = RenderLabels(labels);
  auto& slot = f.gauges[key];
  if (!slot) {
    slot = std::make_unique<Gauge>();
    f.label_sets[key] = labels;
  }
  return *slot;
}

Histogram& Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const std::vector<double>& bounds, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Family& f = GetFamily(name, Type::kHistogram, help);
  const std::string key = RenderLabels(labels);
  auto& slot = f.histograms[key];
  if (!slot) {
    slot = std::make_unique<Histogram>(bounds);
    f.label_sets[key] = labels;
  }
  return *slot;
}

void Registry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string Registry::Render() const {
  std::vector<std::function<void()>> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  // Collectors register and set metrics themselves, so they run without the lock.
  for (const auto& c : collectors) c();

  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    const char* type = f.type == Type::kCounter ? "counter"
                       : f.type == Type::kGauge ? "gauge"
                                                : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(f.help), "\n# TYPE ", name, " ", type,
                    "\n");
    for (const auto& [key, labels] : f.label_sets) {
      switch (f.type) {
        case Type::kCounter:
          absl::StrAppend(&out, name, key, " ", FormatValue(f.counters.at(key)->value()), "\n");
          break;
        case Type::kGauge:
          absl::StrAppend(&out, name, key, " ", FormatValue(f.gauges.at(key)->value()), "\n");
          break;
        case Type::kHistogram: {
          const Histogram::Snapshot s = f.histograms.at(key)->Read();
          for (size_t i = 0; i <= s.bounds.size(); ++i) {
            const std::string le = i < s.bounds.size() ? FormatValue(s.bounds[i]) : "+Inf";
            absl::StrAppend(&out, name, "_bucket", RenderLabels(labels, "le", le), " ",
                            s.cumulative[i], "\n");
          }
          absl::StrAppend(&out, name, "_sum", key, " ", FormatValue(s.sum), "\n");
          absl::StrAppend(&out, name, "_count", key, " ", s.cumulative.back(), "\n");
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace smla::server::edge
