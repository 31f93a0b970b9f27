#include "bench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace smla::bench {
namespace {

// Six significant digits, as measured timings carry no more; non-finite values become JSON
// null (nlohmann writes NaN and infinities as null).
double Sig6(double v) {
  if (!std::isfinite(v)) return v;
  return std::strtod(absl::StrFormat("%.6g", v).c_str(), nullptr);
}

// Keys in insertion order, so the report reads like the struct.
using Json = nlohmann::ordered_json;

Json JsonPercentiles(const Percentiles& p) {
  return Json{{"p50", Sig6(p.p50)}, {"p90", Sig6(p.p90)}, {"p95", Sig6(p.p95)},
              {"p99", Sig6(p.p99)}, {"max", Sig6(p.max)}, {"mean", Sig6(p.mean)}};
}

Json JsonRun(const RunStats& r) {
  Json j;
  j["concurrency"] = r.concurrency;
  j["rate"] = Sig6(r.rate);
  j["seconds"] = Sig6(r.seconds);
  j["calls"] = r.calls;
  j["steps"] = r.steps;
  j["rows"] = r.rows;
  j["calls_per_s"] = Sig6(r.calls_per_s);
  j["steps_per_s"] = Sig6(r.steps_per_s);
  j["rows_per_s"] = Sig6(r.rows_per_s);
  const std::pair<const char*, const Percentiles*> parts[] = {
      {"call_ms", &r.call_ms},
      {"step_ms", &r.step_ms},
      {"overhead_ms", &r.overhead_ms},
      {"transport_ms", &r.transport_ms},
      {"service_ms", &r.service_ms},
      {"queue_ms", &r.queue_ms},
      {"kernel_ms", &r.kernel_ms},
      {"e2e_minus_kernel_ms", &r.e2e_minus_kernel_ms},
      {"parse_ms", &r.parse_ms},
      {"admit_ms", &r.admit_ms},
      {"batch_extra_ms", &r.batch_extra_ms},
      {"prep_ms", &r.prep_ms},
      {"attend_ms", &r.attend_ms},
      {"copy_in_ms", &r.copy_in_ms},
      {"copy_out_ms", &r.copy_out_ms}};
  for (const auto& [name, p] : parts) j[name] = JsonPercentiles(*p);
  j["mean_batch_requests"] = Sig6(r.mean_batch_requests);
  j["good_steps"] = r.good_steps;
  j["goodput_steps_per_s"] = Sig6(r.goodput_steps_per_s);
  j["goodput_rows_per_s"] = Sig6(r.goodput_rows_per_s);
  j["slo_met"] = r.slo_met;
  Json errors = Json::object();
  for (const auto& [code, n] : r.errors) errors[code] = n;
  j["errors"] = std::move(errors);
  Json histogram = Json::array();
  for (const auto& bin : r.histogram) histogram.push_back(Json{Sig6(bin.upper_ms), bin.count});
  j["histogram"] = std::move(histogram);
  return j;
}

std::string Html(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') {
      o += "&lt;";
    } else if (c == '>') {
      o += "&gt;";
    } else if (c == '&') {
      o += "&amp;";
    } else if (c == '"') {
      o += "&quot;";
    } else {
      o += c;
    }
  }
  return o;
}

struct Series {
  std::string name, color;
  std::vector<double> y;
};

// A line chart of series against the runs' concurrency (category axis), y from 0.
std::string LineChart(const std::string& title, const std::string& y_label,
                      const std::vector<double>& x, const std::vector<Series>& series) {
  const double w = 560, h = 300, l = 70, r = 20, t = 30, b = 50;
  double ymax = 0;
  for (const auto& s : series)
    for (double v : s.y) ymax = std::max(ymax, v);
  if (ymax <= 0) ymax = 1;
  ymax *= 1.1;
  const size_t n = x.size();
  auto px = [&](size_t i) { return l + (n <= 1 ? (w - l - r) / 2 : (w - l - r) * i / (n - 1.0)); };
  auto py = [&](double v) { return t + (h - t - b) * (1 - v / ymax); };
  std::string o = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n",
      static_cast<int>(w), static_cast<int>(h), static_cast<int>(w), static_cast<int>(h));
  absl::StrAppendFormat(&o, "<text x=\"%g\" y=\"18\" font-size=\"13\">%s</text>\n", l, Html(title));
  absl::StrAppendFormat(&o,
                        "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#333\"/>\n"
                        "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#333\"/>\n",
                        l, t, l, h - b, l, h - b, w - r, h - b);
  for (int k = 0; k <= 4; ++k) {
    const double v = ymax * k / 4;
    absl::StrAppendFormat(&o,
                          "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%s</text>\n"
                          "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#ddd\"/>\n",
                          l - 4, py(v) + 4, Html(absl::StrFormat("%.3g", v)), l, py(v), w - r,
                          py(v));
  }
  for (size_t i = 0; i < n; ++i) {
    absl::StrAppendFormat(&o, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%s</text>\n", px(i),
                          h - b + 16, Html(absl::StrFormat("%g", x[i])));
  }
  absl::StrAppendFormat(&o, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">concurrency</text>\n",
                        (l + w - r) / 2, h - 12);
  absl::StrAppendFormat(&o,
                        "<text x=\"14\" y=\"%g\" transform=\"rotate(-90 14 %g)\" "
                        "text-anchor=\"middle\">%s</text>\n",
                        (t + h - b) / 2, (t + h - b) / 2, Html(y_label));
  int legend = 0;
  for (const auto& s : series) {
    std::string pts;
    for (size_t i = 0; i < n && i < s.y.size(); ++i) {
      absl::StrAppendFormat(&pts, "%s%.1f,%.1f", pts.empty() ? "" : " ", px(i), py(s.y[i]));
    }
    absl::StrAppendFormat(&o,
                          "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
                          "points=\"%s\"/>\n",
                          s.color, pts);
    for (size_t i = 0; i < n && i < s.y.size(); ++i) {
      absl::StrAppendFormat(&o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(i),
                            py(s.y[i]), s.color);
    }
    absl::StrAppendFormat(&o,
                          "<rect x=\"%g\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                          "<text x=\"%g\" y=\"%d\">%s</text>\n",
                          w - r - 130, 8 + 14 * legend, s.color, w - r - 116, 17 + 14 * legend,
                          Html(s.name));
    ++legend;
  }
  return o + "</svg>\n";
}

// Stacked bars per run: overhead outside the launch's host prep, queue, prep, kernel (device
// time) (p50 of each, ms).
std::string BreakdownChart(const std::vector<RunStats>& runs) {
  const double w = 560, h = 300, l = 70, r = 20, t = 30, b = 50;
  double ymax = 0;
  for (const auto& run : runs) {
    ymax = std::max(ymax, std::max(run.overhead_ms.p50, run.prep_ms.p50) + run.queue_ms.p50 +
                              run.kernel_ms.p50);
  }
  if (ymax <= 0) ymax = 1;
  ymax *= 1.1;
  std::string o = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n",
      static_cast<int>(w), static_cast<int>(h), static_cast<int>(w), static_cast<int>(h));
  absl::StrAppendFormat(&o,
                        "<text x=\"%g\" y=\"18\" font-size=\"13\">Time of a call (p50 of each "
                        "part, ms)</text>\n",
                        l);
  absl::StrAppendFormat(&o, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#333\"/>\n", l,
                        h - b, w - r, h - b);
  for (int k = 0; k <= 4; ++k) {
    const double v = ymax * k / 4;
    const double y = t + (h - t - b) * (1 - v / ymax);
    absl::StrAppendFormat(&o, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%s</text>\n", l - 4,
                          y + 4, Html(absl::StrFormat("%.3g", v)));
  }
  const size_t n = std::max<size_t>(runs.size(), 1);
  const double slot = (w - l - r) / static_cast<double>(n);
  const char* colors[4] = {"#e8a33d", "#7a7ad8", "#c45a8a", "#3aa45b"};
  const char* names[4] = {"transport + service overhead", "queue", "launch host prep",
                          "kernel (batch, device)"};
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunStats& run = runs[i];
    const double parts[4] = {std::max(0.0, run.overhead_ms.p50 - run.prep_ms.p50), run.queue_ms.p50,
                             run.prep_ms.p50, run.kernel_ms.p50};
    double base = 0;
    const double x = l + slot * i + slot * 0.2;
    for (int k = 0; k < 4; ++k) {
      const double y0 = t + (h - t - b) * (1 - base / ymax);
      const double y1 = t + (h - t - b) * (1 - (base + parts[k]) / ymax);
      absl::StrAppendFormat(&o,
                            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                            "fill=\"%s\"/>\n",
                            x, y1, slot * 0.6, std::max(0.0, y0 - y1), colors[k]);
      base += parts[k];
    }
    absl::StrAppendFormat(&o, "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">N=%d</text>\n",
                          x + slot * 0.3, h - b + 16, runs[i].concurrency);
  }
  for (int k = 0; k < 4; ++k) {
    absl::StrAppendFormat(&o,
                          "<rect x=\"%g\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                          "<text x=\"%g\" y=\"%d\">%s</text>\n",
                          w - r - 190, 8 + 14 * k, colors[k], w - r - 176, 17 + 14 * k, names[k]);
  }
  return o + "</svg>\n";
}

std::string HistogramChart(const RunStats& run) {
  const double w = 560, h = 240, l = 50, r = 20, t = 30, b = 40;
  int64_t most = 1;
  for (const auto& bin : run.histogram) most = std::max(most, bin.count);
  std::string o = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n",
      static_cast<int>(w), static_cast<int>(h), static_cast<int>(w), static_cast<int>(h));
  absl::StrAppendFormat(&o,
                        "<text x=\"%g\" y=\"18\" font-size=\"13\">Call latency histogram, "
                        "N=%d (bins of x1.25, upper bound in ms)</text>\n",
                        l, run.concurrency);
  const size_t n = std::max<size_t>(run.histogram.size(), 1);
  const double slot = (w - l - r) / static_cast<double>(n);
  for (size_t i = 0; i < run.histogram.size(); ++i) {
    const auto& bin = run.histogram[i];
    const double bh = (h - t - b) * static_cast<double>(bin.count) / static_cast<double>(most);
    absl::StrAppendFormat(&o,
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                          "fill=\"#4a7fc1\"><title>&lt;= %.4g ms: %d</title></rect>\n",
                          l + slot * i, h - b - bh, std::max(1.0, slot - 1), bh, bin.upper_ms,
                          static_cast<int>(bin.count));
    if (i % std::max<size_t>(1, n / 6) == 0) {
      absl::StrAppendFormat(&o, "<text x=\"%.1f\" y=\"%g\">%.3g</text>\n", l + slot * i, h - b + 14,
                            bin.upper_ms);
    }
  }
  absl::StrAppendFormat(&o, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#333\"/>\n", l,
                        h - b, w - r, h - b);
  return o + "</svg>\n";
}

}  // namespace

std::string TextSummary(const RunStats& r) {
  std::string o = absl::StrFormat(
      "N=%d%s: %.2fs, %lld calls, %lld steps, %.1f calls/s, %.2f steps/s, %.0f rows/s\n"
      "  call latency ms: p50 %.3f p90 %.3f p95 %.3f p99 %.3f max %.3f mean %.3f\n"
      "  step latency ms: p50 %.3f p99 %.3f\n"
      "  per call p50 ms: overhead %.3f (transport %.3f, service %.3f), queue %.3f, kernel %.3f; "
      "e2e-kernel %.3f; mean batch %.2f requests\n",
      r.concurrency, r.rate > 0 ? absl::StrFormat(" rate %.1f/s", r.rate) : "", r.seconds,
      static_cast<long long>(r.calls), static_cast<long long>(r.steps), r.calls_per_s,
      r.steps_per_s, r.rows_per_s, r.call_ms.p50, r.call_ms.p90, r.call_ms.p95, r.call_ms.p99,
      r.call_ms.max, r.call_ms.mean, r.step_ms.p50, r.step_ms.p99, r.overhead_ms.p50,
      r.transport_ms.p50, r.service_ms.p50, r.queue_ms.p50, r.kernel_ms.p50,
      r.e2e_minus_kernel_ms.p50, r.mean_batch_requests);
  absl::StrAppendFormat(&o, "  service p50 ms: parse %.3f, admit %.3f, batch outside kernel %.3f\n",
                        r.parse_ms.p50, r.admit_ms.p50, r.batch_extra_ms.p50);
  absl::StrAppendFormat(&o,
                        "  batch p50 ms: launch host prep %.3f (p99 %.3f), kernel (device) %.3f, "
                        "attend %.3f, copy in %.3f, copy out %.3f\n",
                        r.prep_ms.p50, r.prep_ms.p99, r.kernel_ms.p50, r.attend_ms.p50,
                        r.copy_in_ms.p50, r.copy_out_ms.p50);
  absl::StrAppendFormat(&o, "  goodput: %.2f steps/s, %.0f rows/s%s\n", r.goodput_steps_per_s,
                        r.goodput_rows_per_s, r.slo_met ? "" : " (SLO broken)");
  if (!r.errors.empty()) {
    o += "  errors:";
    for (const auto& [code, n] : r.errors) absl::StrAppend(&o, " ", code, "=", n);
    o += "\n";
  }
  return o;
}

std::string ToJson(const Report& rep) {
  Json j;
  j["tool"] = "smla-bench";
  j["cell"] = rep.cell;
  j["transport"] = rep.transport;
  j["mode"] = rep.mode;
  j["q_format"] = rep.q_format;
  j["loop"] = rep.loop;
  j["device"] = rep.device;
  j["date"] = rep.date;
  j["servers"] = rep.servers;
  j["connections"] = rep.connections;
  j["slo_ms"] = Sig6(rep.slo_ms);
  j["stop_reason"] = rep.stop_reason;
  j["totals"] = Json{{"unary_ok", rep.total_unary_ok},
                     {"stream_ok", rep.total_stream_ok},
                     {"rows_ok", rep.total_rows_ok},
                     {"failed", rep.total_failed}};
  Json runs = Json::array();
  for (const RunStats& r : rep.runs) runs.push_back(JsonRun(r));
  j["runs"] = std::move(runs);
  // Invalid UTF-8 in a string (a cell name from the command line) is replaced, not thrown.
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

std::string ToHtml(const Report& rep) {
  std::string o =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>smla-bench: " +
      Html(rep.cell) +
      "</title>\n<style>\nbody { font-family: sans-serif; margin: 24px; }\n"
      "table { border-collapse: collapse; font-size: 13px; }\n"
      "td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }\n"
      "th { background: #f0f0f0; }\n</style>\n</head>\n<body>\n";
  absl::StrAppend(&o, "<h1>smla-bench</h1>\n<p>", Html(rep.cell), "<br>\ntransport ",
                  Html(rep.transport), ", ", Html(rep.mode), ", ", Html(rep.q_format), " queries, ",
                  Html(rep.loop), " loop, device ", Html(rep.device), ", ", rep.connections,
                  " connection(s) per server, ", Html(rep.date), "</p>\n");
  if (!rep.stop_reason.empty()) {
    absl::StrAppend(&o, "<p>Sweep ended: ", Html(rep.stop_reason), "</p>\n");
  }
  o += "<table>\n<tr><th>N</th><th>rate</th><th>calls</th><th>calls/s</th><th>steps/s</th>"
       "<th>rows/s</th><th>p50 ms</th><th>p90 ms</th><th>p95 ms</th><th>p99 ms</th>"
       "<th>max ms</th><th>overhead p50</th><th>queue p50</th><th>prep p50</th>"
       "<th>kernel p50</th><th>attend p50</th><th>e2e-kernel p50</th><th>goodput rows/s</th>"
       "<th>errors</th></tr>\n";
  for (const RunStats& r : rep.runs) {
    std::string errors;
    for (const auto& [code, n] : r.errors) absl::StrAppend(&errors, code, "=", n, " ");
    absl::StrAppendFormat(&o,
                          "<tr><td>%d</td><td>%.4g</td><td>%lld</td><td>%.4g</td><td>%.4g</td>"
                          "<td>%.4g</td><td>%.4g</td><td>%.4g</td><td>%.4g</td><td>%.4g</td>"
                          "<td>%.4g</td><td>%.4g</td><td>%.4g</td><td>%.4g</td><td>%.4g</td>"
                          "<td>%.4g</td><td>%.4g</td><td>%.4g</td><td>%s</td></tr>\n",
                          r.concurrency, r.rate, static_cast<long long>(r.calls), r.calls_per_s,
                          r.steps_per_s, r.rows_per_s, r.call_ms.p50, r.call_ms.p90, r.call_ms.p95,
                          r.call_ms.p99, r.call_ms.max, r.overhead_ms.p50, r.queue_ms.p50,
                          r.prep_ms.p50, r.kernel_ms.p50, r.attend_ms.p50,
                          r.e2e_minus_kernel_ms.p50, r.goodput_rows_per_s, Html(errors));
  }
  o += "</table>\n";
  std::vector<double> x;
  Series p50{"call p50 ms", "#3a6fc4", {}}, p99{"call p99 ms", "#c43a3a", {}};
  Series rows{"rows/s", "#3aa45b", {}}, good{"goodput rows/s", "#e8a33d", {}};
  for (const RunStats& r : rep.runs) {
    x.push_back(r.concurrency);
    p50.y.push_back(r.call_ms.p50);
    p99.y.push_back(r.call_ms.p99);
    rows.y.push_back(r.rows_per_s);
    good.y.push_back(r.goodput_rows_per_s);
  }
  o += "<div>\n";
  o += LineChart("Latency against concurrency", "ms", x, {p50, p99});
  o += LineChart("Throughput against concurrency", "rows/s", x, {rows, good});
  o += BreakdownChart(rep.runs);
  if (!rep.runs.empty()) o += HistogramChart(rep.runs.back());
  o += "</div>\n</body>\n</html>\n";
  return o;
}

}  // namespace smla::bench
