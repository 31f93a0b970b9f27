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
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gpu/attend_launch.h"
#include "kbench/device_kernels.h"
#include "kbench/workload.h"
#include "smla/kernels/gpu/runtime.h"
#include "smla/kernels/gpu_backend.h"

namespace smla::kbench {
namespace {

namespace gpu = kernels::gpu;
using kernels::KvFormat;

constexpr int kRowsPerPage = 64;
constexpr int64_t kFlushBytes = 256ll << 20;  // > 4x the 60 MB L2
constexpr int kCosSinPositions = 65536;

struct Options {
  Filter filter;
  bool bar = false;
  int iters = 30;
  int warmup = 3;
  std::string json = "kbench.json";
  std::string markdown;  // optional results table
  std::string out = "auto";
  int force_splits = 0;
  int force_head_block = 0;
  bool tile_kernel = false;  // AttendParams::force_tile_kernel (A/B)
  bool no_fold = false;      // AttendParams::no_scale_fold (A/B)
  kernels::RowPairs pairs = kernels::RowPairs::kAuto;  // AttendParams::row_pairs (A/B)
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
  bool paired = false;  // rows 2i, 2i+1 in one program (AttendParams::row_pairs)
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
      const std::string key = absl::StrCat(c.model->name, "/", std::string(kernels::KvFormatName(c.format)), "/", c.context);
      if (!groups.count(key)) order.push_back(key);
      groups[key].push_back(&c);
    }
    for (const std::string& key : order) {
      const auto& group = groups[key];
      Pools pools = MakePools(group);
      std::map<std::string, std::vector<CallIndices>> index_cache;
      for (const Cell* c : group) {
        auto& sets = index_cache[c->shape];
        if (sets.empty()) {
          const int n_sets = c->rows_per_request > 6 ? 2 : 4;
          for (int s = 0; s < n_sets; ++s) {
            sets.push_back(MakeIndices(*c, PoolFor(*c, c->requests), 1000 + s));
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
    p.main = Layout(c.format, c.model->geometry, main_slots, p.main_mem);
    Check(FillPool(p.main, 11, stream_), "fill main");
    const PoolLayout* big = &p.main;
    if (extra_slots > 0) {
      p.extra = Layout(c.format, c.model->geometry, extra_slots, p.extra_mem);
      Check(FillPool(p.extra, 12, stream_), "fill extra");
      big = &p.extra;
    }
    Check(gpu::StreamSynchronize(stream_), "fill sync");
    p.gather_gbps = GatherCeiling(*big, stream_, flush_, sink_mem_);
    p.gather_row_bytes = GatherRowBytes(c.format, c.model->geometry);
    std::fprintf(stderr, "pools %s %s %lldK: main %lld slots, extra %lld slots, gather ceiling %.0f GB/s\n",
                 c.model->name.c_str(), std::string(kernels::KvFormatName(c.format)).c_str(),
                 static_cast<long long>(c.context / 1024), static_cast<long long>(main_slots),
                 static_cast<long long>(extra_slots), p.gather_gbps);
    return p;
  }

  Result RunCell(const Cell& c, const Pools& pools, const std::vector<CallIndices>& sets) {
    const int T = c.rows();
    const int H = c.heads;
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
      p.main.cache = {pools.main.base, c.format, c.model->geometry, pools.main.num_pages,
                      kRowsPerPage, pools.main.pitch, 1.0f};
      p.main.indptr = ix.main_indptr;
      p.main.indices = ix.main_indices;
      if (!ix.extra_indptr.empty()) {
        p.has_extra = true;
        p.extra.cache = {pools.extra.base, c.format, c.model->geometry, pools.extra.num_pages,
                         kRowsPerPage, pools.extra.pitch, 1.0f};
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
      p.no_scale_fold = opt_.no_fold;
      // The rows come as requests of rows_per_request consecutive rows of one sequence.
      p.rows_per_group = c.rows_per_request;
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
    r.plan = calls[0].launch.plan.ToString() + (r.paired ? " paired" : "");
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
    const double row_bytes = static_cast<double>(kernels::RowBytes(c.format, c.model->geometry));
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
        2.0 * H * c.rows_per_request * double(r.unique_main + r.unique_extra) * (qk + 512);
    r.output = mx ? "mxfp8" : "bf16";
    return r;
  }

  Options opt_;
  kernels::DeviceInfo info_;
  gpu::StreamHandle stream_ = nullptr;
  DeviceBuffer flush_, sink_mem_, cos_sin_;
  double gemm_tflops_ = 0, mma_tflops_ = 0;
};

std::vector<std::string> List(const char* v) { return absl::StrSplit(v, ',', absl::SkipEmpty()); }

bool IsBarCell(const Cell& c) {
  if (c.context != 131072) return false;
  if (c.model->name == "dsv4.1-flash" && c.format == KvFormat::kFp8Dsv4 &&
      (c.tp == 4 || c.tp == 2) && (c.shape == "decode C=32" || c.shape == "decode C=64")) {
    return true;
  }
  return c.model->name == "glm-5.3-flash" && c.tp == 4 && c.shape == "decode C=32";
}

int Main(int argc, char** argv) {
  Options o;
  bool any_filter = false, grid = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") {
      o.filter.models = List(val());
      any_filter = true;
    } else if (a == "--format") {
      o.filter.formats = List(val());
      any_filter = true;
    } else if (a == "--tp") {
      for (const std::string& t : List(val())) o.filter.tps.push_back(std::atoi(t.c_str()));
      any_filter = true;
    } else if (a == "--shape") {
      o.filter.shapes = List(val());
      any_filter = true;
    } else if (a == "--context") {
      o.filter.contexts = List(val());
      any_filter = true;
    } else if (a == "--grid") {
      grid = true;
    } else if (a == "--bar") {
      o.bar = true;
    } else if (a == "--iters") {
      o.iters = std::max(20, std::atoi(val()));
    } else if (a == "--json") {
      o.json = val();
    } else if (a == "--md") {
      o.markdown = val();
    } else if (a == "--out") {
      o.out = val();
    } else if (a == "--splits") {
      o.force_splits = std::atoi(val());
    } else if (a == "--head-block") {
      o.force_head_block = std::atoi(val());
    } else if (a == "--no-gemm") {
      o.gemm = false;
    } else if (a == "--tile-kernel") {
      o.tile_kernel = true;
    } else if (a == "--no-fold") {
      o.no_fold = true;
    } else if (a == "--pairs") {
      o.pairs = kernels::RowPairs::kAlways;
    } else if (a == "--no-pairs") {
      o.pairs = kernels::RowPairs::kNever;
    } else {
      std::fprintf(
          stderr,
          "usage: smla-kbench [--grid | --bar | --model M,.. --format F,.. --tp N,.. "
          "--shape 'decode C=32',.. --context 128K,..] [--iters N>=20] [--json PATH] [--md PATH] "
          "[--out auto|bf16|mxfp8] [--splits N] [--head-block N] [--no-gemm] [--tile-kernel] "
          "[--no-fold] [--pairs | --no-pairs]\n");
      return 2;
    }
  }
  if (!grid && !any_filter && !o.bar) o.bar = true;
  std::vector<Cell> cells = GridCells(o.filter);
  if (o.bar && !grid && !any_filter) {
    std::vector<Cell> bar;
    for (const Cell& c : cells) {
      if (IsBarCell(c)) bar.push_back(c);
    }
    cells = bar;
  }
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

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  FILE* f = std::fopen(o.json.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", o.json.c_str());
    return 1;
  }
  std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"arch\": \"%s\",\n  \"sms\": %d,\n  \"date\": \"%s\",\n",
               info.name.c_str(), info.arch.c_str(), info.compute_units, date);
  std::fprintf(f,
               "  \"gemm_bf16_tflops\": %.1f,\n  \"mma_f16_tflops\": %.1f,\n  \"iterations\": %d,\n"
               "  \"cases\": [\n",
               gemm, mma, o.iters);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::fprintf(
        f,
        "    {\"name\": \"%s\", \"model\": \"%s\", \"format\": \"%s\", \"tp\": %d, \"heads\": %d, "
        "\"shape\": \"%s\", \"context\": %lld, \"rows\": %d, \"layer\": \"%s\", "
        "\"output\": \"%s\", \"head_block\": %d, \"splits\": %d, \"paired\": %s, "
        "\"median_us\": %.2f, \"min_us\": %.2f, \"runs\": %d, "
        "\"attended_keys\": %lld, \"unique_rows_main\": %lld, \"unique_rows_extra\": %lld, "
        "\"bytes\": %.0f, \"flop\": %.0f, \"tflops\": %.2f, \"gbps\": %.1f, "
        "\"gather_ceiling_gbps\": %.1f, \"ratio_gather\": %.3f, \"ratio_gemm\": %.3f, "
        "\"ratio_mma\": %.3f, \"union_flop\": %.0f}%s\n",
        r.name.c_str(), r.cell.model->name.c_str(),
        std::string(kernels::KvFormatName(r.cell.format)).c_str(), r.cell.tp, r.cell.heads,
        r.cell.shape.c_str(), static_cast<long long>(r.cell.context), r.cell.rows(),
        r.cell.model->layer_name.c_str(), r.output.c_str(), r.head_block, r.splits,
        r.paired ? "true" : "false", r.median_us, r.min_us, r.runs,
        static_cast<long long>(r.attended), static_cast<long long>(r.unique_main),
        static_cast<long long>(r.unique_extra), r.bytes, r.flop, r.tflops, r.gbps, r.gather_gbps,
        r.ratio_gather, r.ratio_gemm, r.ratio_mma, r.union_flop, i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);

  if (!o.markdown.empty()) {
    FILE* md = std::fopen(o.markdown.c_str(), "w");
    if (md == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", o.markdown.c_str());
      return 1;
    }
    std::fprintf(
        md,
        "| cell | layer | out | plan (head block, splits[, paired]) | median us | TFLOP/s | unique "
        "MB | GB/s | of gather | of GEMM | of mma |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const Result& r : results) {
      std::fprintf(md,
                   "| %s | %s | %s | %d, %d%s | %.1f | %.1f | %.1f | %.0f | %.2f | %.2f | %.2f |\n",
                   r.name.c_str(), r.cell.model->layer_name.c_str(), r.output.c_str(), r.head_block,
                   r.splits, r.paired ? ", paired" : "", r.median_us, r.tflops, r.bytes / 1e6,
                   r.gbps, r.ratio_gather, r.ratio_gemm, r.ratio_mma);
    }
    std::fclose(md);
  }
  std::printf("%-50s %10s %8s %8s %6s %6s  %s\n", "cell", "us", "TFLOP/s", "GB/s", "gath", "gemm",
              "plan");
  int bar_fail = 0, bar_cells = 0;
  for (const Result& r : results) {
    std::string mark;
    if (IsBarCell(r.cell)) {
      ++bar_cells;
      const bool ok = r.ratio_gather >= 0.5;
      bar_fail += ok ? 0 : 1;
      mark = ok ? "  [bar: pass]" : "  [bar: FAIL]";
    }
    std::printf("%-50s %10.1f %8.1f %8.0f %6.2f %6.2f  hb=%d splits=%d%s%s\n", r.name.c_str(),
                r.median_us, r.tflops, r.gbps, r.ratio_gather, r.ratio_gemm, r.head_block, r.splits,
                r.paired ? " paired" : "", mark.c_str());
  }
  if (bar_cells > 0) {
    std::printf("bar cells: %d, below 50%% of the gather ceiling: %d\n", bar_cells, bar_fail);
    // The bar as a compute rate: its time is the cell's bytes at half the gather ceiling, so a
    // kernel meeting it does the cell's products in that time, per row (the useful products)
    // or as request unions (more products, each key read once), on the ceilings above.
    std::printf("%-50s %8s %9s %7s %9s %7s %7s\n", "at the bar", "us", "row TF/s", "of mma",
                "union TF/s", "of mma", "of GEMM");
    for (const Result& r : results) {
      if (!IsBarCell(r.cell)) continue;
      const double bar_s = r.bytes / (0.5 * r.gather_gbps * 1e9);
      const double row_tf = r.flop / bar_s / 1e12, union_tf = r.union_flop / bar_s / 1e12;
      std::printf("%-50s %8.1f %9.0f %7.2f %9.0f %7.2f %7.2f\n", r.name.c_str(), bar_s * 1e6,
                  row_tf, mma > 0 ? row_tf / mma : 0, union_tf, mma > 0 ? union_tf / mma : 0,
                  gemm > 0 ? union_tf / gemm : 0);
    }
  }
  return 0;
}

}  // namespace
}  // namespace smla::kbench

int main(int argc, char** argv) { return smla::kbench::Main(argc, argv); }
