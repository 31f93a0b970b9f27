// smla-kbench: the sparse MLA kernels on the grid of docs/performance.md, one cell by name or the
// whole grid. Per cell: CUDA-event time of the attention launch(es) alone (median of >= 20 after
// warm-up, the L2 flushed before each run and index sets rotated), TFLOP/s, unique bytes and
// GB/s, and the ratios to three ceilings measured in the same run: a gather of whole rows over
// the same pool layout, a large bf16 GEMM, and the rate of the warp-level tensor product the
// kernels issue. For the bar cells, what a kernel would have to sustain to meet the bar. JSON
// output.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gpu/attend_launch.h"
#include "kbench/device_kernels.h"
#include "kbench/workload.h"
#include "nlohmann/json.hpp"
#include "smla/base/strings.h"
#include "smla/kernels/gpu/runtime.h"
#include "smla/kernels/gpu_backend.h"
#include "smla/models/grid.h"

// Cell filters: comma-separated lists; a cell runs when it matches every filter given.
ABSL_FLAG(std::vector<std::string>, model, {}, "model names, e.g. dsv4.1-flash,glm-5.3-flash");
ABSL_FLAG(std::vector<std::string>, format, {}, "KV formats, e.g. fp8_dsv4,bf16");
ABSL_FLAG(std::vector<std::string>, tp, {}, "TP degrees, e.g. 4,8");
ABSL_FLAG(std::vector<std::string>, shape, {},
          "shapes ('decode C=32') or kinds (decode, decode1, prefill)");
ABSL_FLAG(std::vector<std::string>, context, {}, "contexts, e.g. 128K,256K");
ABSL_FLAG(std::vector<std::string>, cell, {},
          "cells by name, off the grid too, e.g. 'dsv4-flash fp8_dsv4 TP1 decode C=8 128K' "
          "(comma-separated; replaces --grid, the filters and --bar)");
ABSL_FLAG(bool, grid, false, "every cell of the grid (filters still narrow it)");
ABSL_FLAG(bool, bar, false,
          "the bar cells (with --grid or a filter, those select instead); the default when "
          "nothing selects cells");
ABSL_FLAG(int, iters, 30, "timed runs per cell (at least 20)");
ABSL_FLAG(std::string, json, "kbench.json", "where the results go (JSON)");
ABSL_FLAG(std::string, md, "", "also write the results as a markdown table here");
ABSL_FLAG(std::string, out, "auto",
          "output format: auto (MXFP8 for rope_inside models, else bf16), bf16 or mxfp8");
ABSL_FLAG(int, splits, 0, "force the split count (0: the plan's)");
ABSL_FLAG(int, head_block, 0, "force the head block (0: the plan's)");
ABSL_FLAG(bool, gemm, true, "measure the bf16 GEMM ceiling (--nogemm skips it)");
ABSL_FLAG(bool, tile_kernel, false,
          "run the tile kernel even on fp8_dsv4 / fp8_per_tensor pools (A/B)");
ABSL_FLAG(std::string, wgmma, "auto",
          "the sm_90a warpgroup program for 64-head blocks on fp8 pools of width 512: auto (where "
          "the plan takes it), always (wherever the plan runs 64 heads) or never (A/B)");
ABSL_FLAG(bool, q_tensor_map, true,
          "the warpgroup program's queries by the tensor copy engine (TMA); --noq_tensor_map "
          "stages them by loads (A/B; AttendParams::wgmma_q_tensor_map)");
ABSL_FLAG(std::string, staged_rows, "auto",
          "the warpgroup program's final rows through shared memory: auto (prefill calls of "
          "one row or a pair a program), always or never (A/B; AttendParams::wgmma_staged_rows)");
ABSL_FLAG(double, redraw, smla::kbench::kDefaultRedraw,
          "the fraction of a request's row's chosen keys that its next row draws anew (the grid's "
          "tables use the default)");
ABSL_FLAG(bool, fold, true,
          "fold the fp8_dsv4 rescale (--nofold turns it off; it matters only on gfx950)");
ABSL_FLAG(std::string, pairs, "auto",
          "half pairs of rows: auto (the plan's), always (also 16-head multiples, A/B) or "
          "never");

namespace smla::kbench {
namespace {

namespace gpu = kernels::gpu;
using kernels::KvFormat;

constexpr int kRowsPerPage = 64;
constexpr int64_t kFlushBytes = 256ll << 20;  // > 4x the 60 MB L2
constexpr int kCosSinPositions = 65536;

struct Options {
  models::GridFilter filter;
  std::vector<std::string> cells;  // --cell: named cells instead of the grid's
  bool bar = false;
  int iters = 30;
  int warmup = 3;
  std::string json = "kbench.json";
  std::string markdown;  // optional results table
  std::string out = "auto";
  int force_splits = 0;
  int force_head_block = 0;
  bool tile_kernel = false;                            // AttendParams::force_tile_kernel (A/B)
  kernels::WgmmaUse wgmma = kernels::WgmmaUse::kAuto;  // AttendParams::wgmma (A/B)
  bool no_fold = false;                                // AttendParams::no_scale_fold (A/B)
  bool q_tensor_map = true;                            // AttendParams::wgmma_q_tensor_map (A/B)
  kernels::WgmmaStagedRows staged_rows = kernels::WgmmaStagedRows::kAuto;  // (A/B)
  kernels::RowPairs pairs = kernels::RowPairs::kAuto;  // AttendParams::row_pairs (A/B)
  double redraw = kDefaultRedraw;  // the index sets' redrawn fraction (MakeIndices)
  bool gemm = true;
};

// Device memory owned for the run.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0 && gpu::Malloc(&p_, bytes) != gpu::kSuccess) {
      std::fprintf(stderr, "cudaMalloc(%zu) failed\n", bytes);
      std::exit(1);
    }
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (p_ != nullptr) gpu::Free(p_);
  }
  template <typename T = uint8_t>
  T* get() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);
  }
}
void Check(gpu::Error e, const char* what) { Check(gpu::ToStatus(e, what), what); }

double Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Pools {
  PoolLayout main, extra;
  DeviceBuffer main_mem, extra_mem;
  double gather_gbps = 0;  // ceiling over the larger pool's layout
  int64_t gather_row_bytes = 0;
};

PoolLayout Layout(KvFormat f, kernels::Geometry g, int64_t slots, DeviceBuffer& mem) {
  PoolLayout p;
  p.format = f;
  p.geometry = g;
  p.rows_per_page = kRowsPerPage;
  p.num_pages = (slots + kRowsPerPage - 1) / kRowsPerPage;
  p.pitch = kernels::ServingPitch(f, g, kRowsPerPage);
  mem = DeviceBuffer(static_cast<size_t>(p.num_pages * p.pitch));
  p.base = mem.get();
  return p;
}

// Random whole-row gather over a pool: 4M distinct-enough slots, median of 10 flushed runs.
double GatherCeiling(const PoolLayout& pool, gpu::StreamHandle st, const DeviceBuffer& flush,
                     const DeviceBuffer& sink) {
  const int64_t slots = pool.num_pages * pool.rows_per_page;
  const int64_t n = std::min<int64_t>(slots, 4 << 20);
  std::vector<int32_t> ids(n);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> d(0, slots - 1);
  for (auto& id : ids) id = static_cast<int32_t>(d(rng));
  DeviceBuffer dev(n * 4);
  Check(gpu::MemcpyH2DAsync(dev.get(), ids.data(), n * 4, st), "upload gather ids");
  gpu::EventHandle e0, e1;
  gpu::EventCreate(&e0);
  gpu::EventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    Check(gpu::MemsetAsync(flush.get(), i, flush.bytes(), st), "flush");
    gpu::EventRecord(e0, st);
    Check(LaunchGather(pool, dev.get<int32_t>(), n, sink.get<uint32_t>(), st), "gather");
    gpu::EventRecord(e1, st);
    Check(gpu::EventSynchronize(e1), "gather sync");
    float t = 0;
    gpu::EventElapsedMs(&t, e0, e1);
    if (i >= 3) ms.push_back(t);
  }
  gpu::EventDestroy(e0);
  gpu::EventDestroy(e1);
  return n * double(GatherRowBytes(pool.format, pool.geometry)) / (Median(ms) * 1e-3) / 1e9;
}

struct Result {
  std::string name;
  Cell cell;
  std::string plan;
  int head_block = 0, splits = 0;
  bool paired = false;  // rows of a unit in one program (AttendParams::row_pairs)
  int union_rows = 0;   // rows per paired unit
  std::string program;  // the attention program that ran: direct, tile or wgmma
  double median_us = 0, min_us = 0;
  int runs = 0;
  int64_t attended = 0, unique_main = 0, unique_extra = 0;
  double bytes = 0, flop = 0;
  double tflops = 0, gbps = 0, ratio_gather = 0, ratio_gemm = 0, ratio_mma = 0;
  // Products a request-union kernel would do: every row of a request times every key any of
  // its rows reads (requests read disjoint slots, so the call's unique keys are the unions').
  double union_flop = 0;
  double gather_gbps = 0;
  std::string output;
};

// The plan's row pairing after `sep`: "paired" (two rows a program), "N rows", or nothing.
std::string PairLabel(const Result& r, const char* sep) {
  if (!r.paired) return "";
  return r.union_rows > 2 ? absl::StrCat(sep, r.union_rows, " rows") : absl::StrCat(sep, "paired");
}

// Everything one prepared call needs on the device.
struct PreparedCall {
  CallIndices idx;
  gpu::AttendLaunch launch;
  DeviceBuffer workspace;
};

class Runner {
 public:
  Runner(const Options& o, const kernels::DeviceInfo& info) : opt_(o), info_(info) {
    Check(gpu::StreamCreate(&stream_), "stream");
    flush_ = DeviceBuffer(kFlushBytes);
    sink_mem_ = DeviceBuffer(256);
    cos_sin_ = DeviceBuffer(int64_t{kCosSinPositions} * 64 * 4);
    std::vector<float> cs(int64_t{kCosSinPositions} * 64);
    for (int p = 0; p < kCosSinPositions; ++p) {
      for (int k = 0; k < 32; ++k) {
        const double th = p * std::pow(10000.0, -k / 32.0);
        cs[p * 64 + k] = static_cast<float>(std::cos(th));
        cs[p * 64 + 32 + k] = static_cast<float>(std::sin(th));
      }
    }
    Check(gpu::MemcpyH2DAsync(cos_sin_.get(), cs.data(), cs.size() * 4, stream_), "cos_sin");
    Check(gpu::StreamSynchronize(stream_), "sync");
  }

  double MeasureGemm() {
    if (!opt_.gemm) return 0;
    absl::StatusOr<double> t = GemmTflops(8192, 10, stream_);
    if (!t.ok()) {
      std::fprintf(stderr, "gemm ceiling: %s\n", std::string(t.status().message()).c_str());
      return 0;
    }
    gemm_tflops_ = *t;
    return *t;
  }

  double MeasureMma() {
    absl::StatusOr<double> t = MmaTflops(info_.compute_units, 10, stream_);
    if (!t.ok()) {
      std::fprintf(stderr, "mma ceiling: %s\n", std::string(t.status().message()).c_str());
      return 0;
    }
    mma_tflops_ = *t;
    return *t;
  }

  std::vector<Result> RunAll(const std::vector<Cell>& cells) {
    std::vector<Result> results;
    // Cells sharing (model, format, context) share pools and index sets.
    std::map<std::string, std::vector<const Cell*>> groups;
    std::vector<std::string> order;
    for (const Cell& c : cells) {
      const std::string key =
          absl::StrCat(c.model->name, "/", Sv(kernels::KvFormatName(*c.format)), "/", c.context);
      if (!groups.count(key)) order.push_back(key);
      groups[key].push_back(&c);
    }
    for (const std::string& key : order) {
      const auto& group = groups[key];
      Pools pools = MakePools(group);
      std::map<std::string, std::vector<CallIndices>> index_cache;
      for (const Cell* c : group) {
        auto& sets = index_cache[c->ShapeName()];
        if (sets.empty()) {
          const int n_sets = c->rows_per_request() > 6 ? 2 : 4;
          for (int s = 0; s < n_sets; ++s) {
            sets.push_back(MakeIndices(*c, PoolFor(*c, c->requests), 1000 + s, opt_.redraw));
          }
        }
        Result r = RunCell(*c, pools, sets);
        std::fprintf(stderr, "%-52s %9.1f us %7.1f TF/s %7.0f GB/s (%.2f of gather) %s\n",
                     r.name.c_str(), r.median_us, r.tflops, r.gbps, r.ratio_gather, r.plan.c_str());
        results.push_back(std::move(r));
      }
    }
    return results;
  }

 private:
  Pools MakePools(const std::vector<const Cell*>& group) {
    Pools p;
    int64_t main_slots = 0, extra_slots = 0;
    for (const Cell* c : group) {
      const PoolShape s = PoolFor(*c, c->requests);
      main_slots = std::max(main_slots, s.main_slots);
      extra_slots = std::max(extra_slots, s.extra_slots);
    }
    const Cell& c = *group.front();
    p.main = Layout(*c.format, c.model->geometry, main_slots, p.main_mem);
    Check(FillPool(p.main, 11, stream_), "fill main");
    const PoolLayout* big = &p.main;
    if (extra_slots > 0) {
      p.extra = Layout(*c.format, c.model->geometry, extra_slots, p.extra_mem);
      Check(FillPool(p.extra, 12, stream_), "fill extra");
      big = &p.extra;
    }
    Check(gpu::StreamSynchronize(stream_), "fill sync");
    p.gather_gbps = GatherCeiling(*big, stream_, flush_, sink_mem_);
    p.gather_row_bytes = GatherRowBytes(*c.format, c.model->geometry);
    std::fprintf(stderr,
                 "pools %s %s %lldK: main %lld slots, extra %lld slots, gather ceiling %.0f GB/s\n",
                 c.model->name.c_str(), std::string(kernels::KvFormatName(*c.format)).c_str(),
                 static_cast<long long>(c.context / 1024), static_cast<long long>(main_slots),
                 static_cast<long long>(extra_slots), p.gather_gbps);
    return p;
  }

  Result RunCell(const Cell& c, const Pools& pools, const std::vector<CallIndices>& sets) {
    const int T = c.rows();
    const int H = c.heads();
    const KvFormat format = *c.format;
    const int qk = kernels::QkWidth(c.model->geometry);
    const bool rope = c.model->geometry == kernels::Geometry::kRopeInside;
    const bool mx = opt_.out == "mxfp8" || (opt_.out == "auto" && rope);
    DeviceBuffer q(int64_t{T} * H * qk * 2);
    Check(FillBf16(q.get<uint16_t>(), int64_t{T} * H * qk, 1.0f, 5, stream_), "fill q");
    DeviceBuffer out(mx ? int64_t{T} * H * 512 : int64_t{T} * H * 1024);
    DeviceBuffer scales(mx ? int64_t{T} * H * 16 : 16);
    DeviceBuffer lse(int64_t{T} * H * 4);
    std::vector<float> sink(H);
    for (int h = 0; h < H; ++h) sink[h] = 0.5f + 0.01f * h;

    std::vector<PreparedCall> calls(sets.size());
    for (size_t s = 0; s < sets.size(); ++s) {
      const CallIndices& ix = sets[s];
      kernels::AttendParams p;
      p.num_rows = T;
      p.num_heads = H;
      p.geometry = c.model->geometry;
      p.q = q.get();
      p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(qk));
      p.main.cache = {
          pools.main.base,  format, c.model->geometry, pools.main.num_pages, kRowsPerPage,
          pools.main.pitch, 1.0f};
      p.main.indptr = ix.main_indptr;
      p.main.indices = ix.main_indices;
      if (!ix.extra_indptr.empty()) {
        p.has_extra = true;
        p.extra.cache = {
            pools.extra.base,  format, c.model->geometry, pools.extra.num_pages, kRowsPerPage,
            pools.extra.pitch, 1.0f};
        p.extra.indptr = ix.extra_indptr;
        p.extra.indices = ix.extra_indices;
      }
      if (rope) {
        p.sink = sink;
        p.epilogue.positions = ix.positions;
        p.epilogue.cos_sin = cos_sin_.get<float>();
        p.epilogue.num_positions = kCosSinPositions;
      }
      p.out.format = mx ? kernels::OutputFormat::kMxfp8 : kernels::OutputFormat::kBf16;
      p.out.bf16 = out.get();
      p.out.mx_data = out.get();
      p.out.mx_scales = scales.get();
      p.out.lse = lse.get<float>();
      p.force_splits = opt_.force_splits;
      p.force_head_block = opt_.force_head_block;
      p.force_tile_kernel = opt_.tile_kernel;
      p.wgmma = opt_.wgmma;
      p.no_scale_fold = opt_.no_fold;
      p.wgmma_q_tensor_map = opt_.q_tensor_map;
      p.wgmma_staged_rows = opt_.staged_rows;
      // The rows come as requests of rows_per_request consecutive rows of one sequence.
      p.rows_per_group = c.rows_per_request();
      p.row_pairs = opt_.pairs;
      absl::StatusOr<gpu::AttendLaunch> l = gpu::PlanAttend(p, info_);
      Check(l.status(), "plan");
      calls[s].launch = *l;
      std::vector<uint8_t> host(l->staged_bytes);
      gpu::StageAttend(p, *l, host.data());
      calls[s].workspace = DeviceBuffer(std::max<int64_t>(l->workspace_bytes, 16));
      Check(gpu::MemcpyH2DAsync(calls[s].workspace.get(), host.data(), host.size(), stream_),
            "upload staging");
      gpu::BindAttend(calls[s].launch, calls[s].workspace.get());
      Check(gpu::StreamSynchronize(stream_), "staging sync");
    }

    gpu::EventHandle e0, e1;
    gpu::EventCreate(&e0);
    gpu::EventCreate(&e1);
    std::vector<float> ms;
    for (int i = 0; i < opt_.warmup + opt_.iters; ++i) {
      const PreparedCall& call = calls[i % calls.size()];
      Check(gpu::MemsetAsync(flush_.get(), i, flush_.bytes(), stream_), "flush");
      gpu::EventRecord(e0, stream_);
      Check(gpu::RunAttend(call.launch, stream_), "attend");
      gpu::EventRecord(e1, stream_);
      Check(gpu::EventSynchronize(e1), "attend sync");
      Check(gpu::GetLastError(), "attend");
      float t = 0;
      gpu::EventElapsedMs(&t, e0, e1);
      if (i >= opt_.warmup) ms.push_back(t);
    }
    gpu::EventDestroy(e0);
    gpu::EventDestroy(e1);

    Result r;
    r.name = c.Name();
    r.cell = c;
    r.paired = calls[0].launch.paired != gpu::PairMode::kNone;
    r.union_rows = r.paired ? calls[0].launch.kernel.union_rows : 0;
    r.program = calls[0].launch.wgmma ? "wgmma" : calls[0].launch.direct ? "direct" : "tile";
    r.plan = calls[0].launch.plan.ToString() + PairLabel(r, " ");
    r.head_block = calls[0].launch.plan.head_block;
    r.splits = calls[0].launch.plan.splits;
    r.median_us = Median(ms) * 1e3;
    r.min_us = *std::min_element(ms.begin(), ms.end()) * 1e3;
    r.runs = static_cast<int>(ms.size());
    double attended = 0, um = 0, ue = 0;
    for (const CallIndices& ix : sets) {
      attended += ix.attended_keys;
      um += ix.unique_main;
      ue += ix.unique_extra;
    }
    const double n = static_cast<double>(sets.size());
    r.attended = static_cast<int64_t>(attended / n);
    r.unique_main = static_cast<int64_t>(um / n);
    r.unique_extra = static_cast<int64_t>(ue / n);
    const double row_bytes = static_cast<double>(kernels::RowBytes(format, c.model->geometry));
    const double q_bytes = double(T) * H * qk * 2;
    const double out_bytes = mx ? double(T) * H * (512 + 16) : double(T) * H * 1024;
    r.bytes = (r.unique_main + r.unique_extra) * row_bytes + q_bytes + out_bytes;
    r.flop = 2.0 * H * double(r.attended) * (qk + 512);
    const double s = r.median_us * 1e-6;
    r.tflops = r.flop / s / 1e12;
    r.gbps = r.bytes / s / 1e9;
    r.gather_gbps = pools.gather_gbps;
    r.ratio_gather = r.gbps / pools.gather_gbps;
    r.ratio_gemm = gemm_tflops_ > 0 ? r.tflops / gemm_tflops_ : 0;
    r.ratio_mma = mma_tflops_ > 0 ? r.tflops / mma_tflops_ : 0;
    r.union_flop =
        2.0 * H * c.rows_per_request() * double(r.unique_main + r.unique_extra) * (qk + 512);
    r.output = mx ? "mxfp8" : "bf16";
    return r;
  }

  Options opt_;
  kernels::DeviceInfo info_;
  gpu::StreamHandle stream_ = nullptr;
  DeviceBuffer flush_, sink_mem_, cos_sin_;
  double gemm_tflops_ = 0, mma_tflops_ = 0;
};

// An A/B switch spelled auto, always or never (kernels::RowPairs, kernels::WgmmaUse); anything
// else ends the run with exit code 2.
template <class Choice>
Choice AutoAlwaysNever(const char* flag, const std::string& v) {
  if (v == "auto") return Choice::kAuto;
  if (v == "always") return Choice::kAlways;
  if (v == "never") return Choice::kNever;
  std::fprintf(stderr, "--%s must be auto, always or never, not '%s'\n", flag, v.c_str());
  std::exit(2);
}

// Options from the flags; exits with a usage error for a bad value.
Options ParseOptions(bool* grid, bool* any_filter) {
  Options o;
  o.filter.models = absl::GetFlag(FLAGS_model);
  o.filter.formats = absl::GetFlag(FLAGS_format);
  o.filter.shapes = absl::GetFlag(FLAGS_shape);
  o.filter.contexts = absl::GetFlag(FLAGS_context);
  for (const std::string& t : absl::GetFlag(FLAGS_tp)) {
    int tp = 0;
    if (!absl::SimpleAtoi(t, &tp) || tp <= 0) {
      std::fprintf(stderr, "--tp: '%s' is not a positive integer\n", t.c_str());
      std::exit(2);
    }
    o.filter.tps.push_back(tp);
  }
  *any_filter = !o.filter.models.empty() || !o.filter.formats.empty() || !o.filter.shapes.empty() ||
                !o.filter.contexts.empty() || !o.filter.tps.empty();
  *grid = absl::GetFlag(FLAGS_grid);
  o.cells = absl::GetFlag(FLAGS_cell);
  o.bar = absl::GetFlag(FLAGS_bar);
  o.iters = std::max(20, absl::GetFlag(FLAGS_iters));
  o.json = absl::GetFlag(FLAGS_json);
  o.markdown = absl::GetFlag(FLAGS_md);
  o.out = absl::GetFlag(FLAGS_out);
  o.force_splits = absl::GetFlag(FLAGS_splits);
  o.force_head_block = absl::GetFlag(FLAGS_head_block);
  o.gemm = absl::GetFlag(FLAGS_gemm);
  o.tile_kernel = absl::GetFlag(FLAGS_tile_kernel);
  o.no_fold = !absl::GetFlag(FLAGS_fold);
  o.q_tensor_map = absl::GetFlag(FLAGS_q_tensor_map);
  o.pairs = AutoAlwaysNever<kernels::RowPairs>("pairs", absl::GetFlag(FLAGS_pairs));
  o.wgmma = AutoAlwaysNever<kernels::WgmmaUse>("wgmma", absl::GetFlag(FLAGS_wgmma));
  o.staged_rows =
      AutoAlwaysNever<kernels::WgmmaStagedRows>("staged_rows", absl::GetFlag(FLAGS_staged_rows));
  if (o.out != "auto" && o.out != "bf16" && o.out != "mxfp8") {
    std::fprintf(stderr, "--out must be auto, bf16 or mxfp8, not '%s'\n", o.out.c_str());
    std::exit(2);
  }
  o.redraw = absl::GetFlag(FLAGS_redraw);
  if (!(o.redraw >= 0 && o.redraw <= 1)) {  // NaN fails both
    std::fprintf(stderr, "--redraw must be a fraction from 0 to 1, not '%g'\n", o.redraw);
    std::exit(2);
  }
  return o;
}

// Rounded to `digits` decimals: the report carries no more precision than the timing has.
double Round(double v, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(v * scale) / scale;
}

// The results file: device, ceilings, and per cell plan, times, key counts, bytes, rates.
bool WriteJson(const Options& o, const kernels::DeviceInfo& info, double gemm, double mma,
               const std::vector<Result>& results) {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  using Json = nlohmann::ordered_json;  // keys in the order written
  Json j;
  j["device"] = info.name;
  j["arch"] = info.arch;
  j["sms"] = info.compute_units;
  j["date"] = date;
  j["gemm_bf16_tflops"] = Round(gemm, 1);
  j["mma_f16_tflops"] = Round(mma, 1);
  j["iterations"] = o.iters;
  j["redraw"] = o.redraw;
  Json cases = Json::array();
  for (const Result& r : results) {
    Json c;
    c["name"] = r.name;
    c["model"] = r.cell.model->name;
    c["format"] = std::string(kernels::KvFormatName(*r.cell.format));
    c["tp"] = r.cell.tp;
    c["heads"] = r.cell.heads();
    c["shape"] = r.cell.ShapeName();
    c["context"] = r.cell.context;
    c["rows"] = r.cell.rows();
    c["layer"] = models::LayerLabel(r.cell.layer());
    c["output"] = r.output;
    c["head_block"] = r.head_block;
    c["splits"] = r.splits;
    c["paired"] = r.paired;
    c["union_rows"] = r.union_rows;
    c["program"] = r.program;
    c["median_us"] = Round(r.median_us, 2);
    c["min_us"] = Round(r.min_us, 2);
    c["runs"] = r.runs;
    c["attended_keys"] = r.attended;
    c["unique_rows_main"] = r.unique_main;
    c["unique_rows_extra"] = r.unique_extra;
    c["bytes"] = std::llround(r.bytes);
    c["flop"] = std::llround(r.flop);
    c["tflops"] = Round(r.tflops, 2);
    c["gbps"] = Round(r.gbps, 1);
    c["gather_ceiling_gbps"] = Round(r.gather_gbps, 1);
    c["ratio_gather"] = Round(r.ratio_gather, 3);
    c["ratio_gemm"] = Round(r.ratio_gemm, 3);
    c["ratio_mma"] = Round(r.ratio_mma, 3);
    c["union_flop"] = std::llround(r.union_flop);
    cases.push_back(std::move(c));
  }
  j["cases"] = std::move(cases);
  std::ofstream f(o.json);
  f << j.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
  f.close();
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", o.json.c_str());
    return false;
  }
  return true;
}

// --help lists this file's flags (abseil matches flags to the program by file name).
void SetUsage() {
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "kbench/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "the sparse MLA kernels on the workload grid. With neither --grid nor a filter "
      "(--model, --format, --tp, --shape, --context), the bar cells; --cell names cells, off "
      "the grid too.\n"
      "  smla-kbench --grid --iters=20 --json=kbench.json --md=table.md\n"
      "  smla-kbench --cell='dsv4-flash fp8_dsv4 TP1 decode C=8 128K'\n"
      "  smla-kbench --model=dsv4.1-flash --format=fp8_dsv4 --tp=4 "
      "--shape='decode C=32' --context=128K");
}

// The cells to run: the named ones (--cell; a name that does not parse ends the run with exit
// code 2), else the grid narrowed by the filters, or the bar cells when nothing else selects
// (and with --bar alone). Sets o->bar when it defaults to the bar cells.
std::vector<Cell> SelectCells(bool grid, bool any_filter, Options* o) {
  if (!o->cells.empty()) {
    o->bar = false;
    std::vector<Cell> named;
    for (const std::string& name : o->cells) {
      absl::StatusOr<Cell> c = models::ParseCell(name);
      if (!c.ok()) {
        std::fprintf(stderr, "--cell: %s\n", std::string(c.status().message()).c_str());
        std::exit(2);
      }
      if (c->tp <= 0) {
        std::fprintf(stderr, "--cell: '%s' names no TP degree (TP1, TP2, ...)\n", name.c_str());
        std::exit(2);
      }
      if (!c->format) c->format = c->model->default_format;
      named.push_back(*c);
    }
    return named;
  }
  if (!grid && !any_filter && !o->bar) o->bar = true;
  std::vector<Cell> cells = models::GridCells(o->filter);
  if (o->bar && !grid && !any_filter) {
    std::vector<Cell> bar;
    for (const Cell& c : cells) {
      if (models::IsBarCell(c)) bar.push_back(c);
    }
    cells = bar;
  }
  return cells;
}

// The results as a markdown table.
bool WriteMarkdown(const std::string& path, const std::vector<Result>& results) {
  FILE* md = std::fopen(path.c_str(), "w");
  if (md == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  std::fprintf(
      md,
      "| cell | layer | out | plan (head block, splits[, paired]) | median us | TFLOP/s | unique "
      "MB | GB/s | of gather | of GEMM | of mma |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Result& r : results) {
    std::fprintf(md,
                 "| %s | %s | %s | %d, %d%s | %.1f | %.1f | %.1f | %.0f | %.2f | %.2f | %.2f |\n",
                 r.name.c_str(), models::LayerLabel(r.cell.layer()).c_str(), r.output.c_str(),
                 r.head_block, r.splits, PairLabel(r, ", ").c_str(), r.median_us, r.tflops,
                 r.bytes / 1e6, r.gbps, r.ratio_gather, r.ratio_gemm, r.ratio_mma);
  }
  std::fclose(md);
  return true;
}

// One line per cell on stdout, the bar cells marked pass or FAIL (half the gather ceiling).
void PrintResults(const std::vector<Result>& results) {
  std::printf("%-50s %10s %8s %8s %6s %6s  %s\n", "cell", "us", "TFLOP/s", "GB/s", "gath", "gemm",
              "plan");
  int bar_fail = 0, bar_cells = 0;
  for (const Result& r : results) {
    std::string mark;
    if (models::IsBarCell(r.cell)) {
      ++bar_cells;
      const bool ok = r.ratio_gather >= 0.5;
      bar_fail += ok ? 0 : 1;
      mark = ok ? "  [bar: pass]" : "  [bar: FAIL]";
    }
    std::printf("%-50s %10.1f %8.1f %8.0f %6.2f %6.2f  %s hb=%d splits=%d%s%s\n", r.name.c_str(),
                r.median_us, r.tflops, r.gbps, r.ratio_gather, r.ratio_gemm, r.program.c_str(),
                r.head_block, r.splits, PairLabel(r, " ").c_str(), mark.c_str());
  }
  if (bar_cells > 0) {
    std::printf("bar cells: %d, below 50%% of the gather ceiling: %d\n", bar_cells, bar_fail);
  }
}

// The bar as a compute rate: its time is the cell's bytes at half the gather ceiling, so a
// kernel meeting it does the cell's products in that time, per row (the useful products) or as
// request unions (more products, each key read once), on the ceilings measured.
void PrintBarRates(const std::vector<Result>& results, double gemm, double mma) {
  std::printf("%-50s %8s %9s %7s %9s %7s %7s\n", "at the bar", "us", "row TF/s", "of mma",
              "union TF/s", "of mma", "of GEMM");
  for (const Result& r : results) {
    if (!models::IsBarCell(r.cell)) continue;
    const double bar_s = r.bytes / (0.5 * r.gather_gbps * 1e9);
    const double row_tf = r.flop / bar_s / 1e12, union_tf = r.union_flop / bar_s / 1e12;
    std::printf("%-50s %8.1f %9.0f %7.2f %9.0f %7.2f %7.2f\n", r.name.c_str(), bar_s * 1e6, row_tf,
                mma > 0 ? row_tf / mma : 0, union_tf, mma > 0 ? union_tf / mma : 0,
                gemm > 0 ? union_tf / gemm : 0);
  }
}

int Main(int argc, char** argv) {
  SetUsage();
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "unexpected argument '%s' (see --help)\n", rest[1]);
    return 2;
  }
  bool grid = false, any_filter = false;
  Options o = ParseOptions(&grid, &any_filter);
  const std::vector<Cell> cells = SelectCells(grid, any_filter, &o);
  if (cells.empty()) {
    std::fprintf(stderr, "no cell matches\n");
    return 2;
  }

  absl::StatusOr<std::unique_ptr<kernels::Backend>> backend = kernels::CreateGpuBackend();
  Check(backend.status(), "GPU backend");
  const kernels::DeviceInfo info = (*backend)->device();
  Runner runner(o, info);
  const double gemm = runner.MeasureGemm();
  const double mma = runner.MeasureMma();
  std::fprintf(stderr,
               "device %s, %d SMs; bf16 GEMM 8192^3 ceiling %.0f TFLOP/s; mma.sync m16n8k16 f16 "
               "ceiling %.0f TFLOP/s\n",
               info.name.c_str(), info.compute_units, gemm, mma);
  const std::vector<Result> results = runner.RunAll(cells);

  if (!WriteJson(o, info, gemm, mma, results)) return 1;
  if (!o.markdown.empty() && !WriteMarkdown(o.markdown, results)) return 1;
  PrintResults(results);
  if (std::any_of(results.begin(), results.end(),
                  [](const Result& r) { return models::IsBarCell(r.cell); })) {
    PrintBarRates(results, gemm, mma);
  }
  return 0;
}

}  // namespace
}  // namespace smla::kbench

int main(int argc, char** argv) { return smla::kbench::Main(argc, argv); }
