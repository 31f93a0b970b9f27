// A strict parser of the Prometheus text exposition format (0.0.4), written for the tests:
// every sample must belong to a family declared with # TYPE, names and labels must be
// well-formed, values must parse, and histograms must be consistent.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace smla::testing {

struct Sample {
  std::string name;  // with _bucket/_sum/_count suffixes
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Exposition {
  std::map<std::string, std::string> types;  // family -> counter|gauge|histogram|...
  std::vector<Sample> samples;

  // Sum of the values of samples named `name` whose labels include `match`.
  double Sum(const std::string& name, const std::map<std::string, std::string>& match = {}) const;
  bool Has(const std::string& name) const;
};

absl::StatusOr<Exposition> ParsePrometheusText(const std::string& text);

}  // namespace smla::testing
