#include "prometheus_text.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace smla::testing {
namespace {

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool ValidName(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != ':') return false;
  }
  return true;
}

bool ParseValue(const std::string& s, double* v) {
  if (s == "+Inf") {
    *v = std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == "-Inf") {
    *v = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == "NaN") {
    *v = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

// The family a sample belongs to (histogram suffixes stripped when the base is a histogram).
std::string FamilyOf(const std::string& name, const std::map<std::string, std::string>& types) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string sfx = suffix;
    if (name.size() > sfx.size() && name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0) {
      const std::string base = name.substr(0, name.size() - sfx.size());
      auto it = types.find(base);
      if (it != types.end() && (it->second == "histogram" || it->second == "summary")) return base;
    }
  }
  return name;
}

}  // namespace

double Exposition::Sum(const std::string& name,
                       const std::map<std::string, std::string>& match) const {
  double total = 0;
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool ok = true;
    for (const auto& [k, v] : match) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) ok = false;
    }
    if (ok) total += s.value;
  }
  return total;
}

bool Exposition::Has(const std::string& name) const {
  for (const Sample& s : samples) {
    if (s.name == name) return true;
  }
  return false;
}

absl::StatusOr<Exposition> ParsePrometheusText(const std::string& text) {
  Exposition e;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const std::string where = absl::StrCat("line ", n, " '", line, "': ");
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::istringstream ls(line);
      std::string hash, kind, name, rest;
      ls >> hash >> kind >> name;
      if (kind == "TYPE") {
        ls >> rest;
        static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary",
                                                     "untyped"};
        if (!ValidName(name) || !kTypes.count(rest)) {
          return absl::InvalidArgumentError(where + "bad TYPE line");
        }
        if (e.types.count(name)) return absl::InvalidArgumentError(where + "second TYPE");
        e.types[name] = rest;
      } else if (kind == "HELP") {
        if (!ValidName(name)) return absl::InvalidArgumentError(where + "bad HELP line");
      }
      continue;
    }
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    if (!ValidName(s.name)) return absl::InvalidArgumentError(where + "bad metric name");
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        size_t eq = line.find('=', i);
        if (eq == std::string::npos) return absl::InvalidArgumentError(where + "bad label");
        const std::string key = line.substr(i, eq - i);
        if (!ValidName(key) || eq + 1 >= line.size() || line[eq + 1] != '"') {
          return absl::InvalidArgumentError(where + "bad label name");
        }
        std::string value;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\' && j + 1 < line.size()) {
            ++j;
            value += line[j] == 'n' ? '\n' : line[j];
          } else {
            value += line[j];
          }
        }
        if (j >= line.size()) return absl::InvalidArgumentError(where + "unterminated label");
        if (s.labels.count(key)) return absl::InvalidArgumentError(where + "repeated label");
        s.labels[key] = value;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) return absl::InvalidArgumentError(where + "unterminated labels");
      ++i;
    }
    if (i >= line.size() || line[i] != ' ') return absl::InvalidArgumentError(where + "no value");
    std::istringstream vs(line.substr(i + 1));
    std::string value, timestamp;
    vs >> value >> timestamp;
    if (!ParseValue(value, &s.value)) return absl::InvalidArgumentError(where + "bad value");
    const std::string family = FamilyOf(s.name, e.types);
    if (!e.types.count(family)) {
      return absl::InvalidArgumentError(where + "sample before its # TYPE line");
    }
    if (e.types[family] == "counter" && !(s.value >= 0)) {
      return absl::InvalidArgumentError(where + "negative counter");
    }
    e.samples.push_back(std::move(s));
  }
  // Histograms: buckets cumulative, a +Inf bucket equal to _count, per label set.
  for (const auto& [family, type] : e.types) {
    if (type != "histogram") continue;
    std::map<std::map<std::string, std::string>, std::vector<std::pair<double, double>>> buckets;
    std::map<std::map<std::string, std::string>, double> counts;
    for (const Sample& s : e.samples) {
      auto labels = s.labels;
      if (s.name == family + "_bucket") {
        auto le = labels.find("le");
        double bound;
        if (le == labels.end() || !ParseValue(le->second, &bound)) {
          return absl::InvalidArgumentError(absl::StrCat(family, ": bucket without le"));
        }
        labels.erase(le);
        buckets[labels].push_back({bound, s.value});
      } else if (s.name == family + "_count") {
        counts[labels] = s.value;
      }
    }
    for (const auto& [labels, bs] : buckets) {
      for (size_t k = 1; k < bs.size(); ++k) {
        if (!(bs[k].first > bs[k - 1].first) || bs[k].second < bs[k - 1].second) {
          return absl::InvalidArgumentError(absl::StrCat(family, ": buckets not cumulative"));
        }
      }
      if (bs.empty() || !std::isinf(bs.back().first) || !counts.count(labels) ||
          counts[labels] != bs.back().second) {
        return absl::InvalidArgumentError(absl::StrCat(family, ": +Inf bucket != _count"));
      }
    }
  }
  return e;
}

}  // namespace smla::testing
