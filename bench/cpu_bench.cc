// smla-cpu-bench: the CPU backend on cells of the docs/performance.md grid (smla/models/grid.h),
// each on the layer its model has most of. Inputs are built here: pools written through
// WriteRows from random bf16 rows, SWA windows ending at each row's own position, top-k sets of
// distinct entries per row (each draft row's set drawn from its neighbour's with a quarter
// replaced, as indexers do).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "smla/kernels/backend.h"
#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/cpu_backend.h"
#include "smla/kernels/formats.h"
#include "smla/models/grid.h"

namespace smla::bench {
namespace {

using kernels::AttendParams;
using kernels::Backend;
using kernels::Buffer;
using kernels::CacheView;
using kernels::Geometry;
using kernels::KvFormat;
using kernels::OutputFormat;

constexpr int kPageRows = 64;

// What one benchmark runs: a grid cell's facts, and the pool sizes the CPU can afford.
struct CellSpec {
  Geometry geometry = Geometry::kRopeInside;
  KvFormat format = KvFormat::kFp8Dsv4;
  int requests = 1;
  int rows_per_request = 6;
  int heads = 16;
  int64_t context = 131072;         // position of each request's last row + 1
  bool swa = true;                  // main segment = SWA window (else: the top-k set)
  int window = 128;                 // SWA keys per row
  int topk = 512;                   // chosen entries per row
  int64_t compressed_rows = 32768;  // entries per request in the pool the top-k draws from
  bool sink = true;
  bool rope_epilogue = true;
  OutputFormat output = OutputFormat::kMxfp8;
  int threads = 0;  // CPU backend threads; 0 = one per hardware thread
};

// A pool plus its CSR, on the backend.
struct Pool {
  Buffer buffer;
  CacheView view;
};

class Cell {
 public:
  explicit Cell(const CellSpec& s) : spec_(s) {
    kernels::BackendOptions options;
    options.cpu_threads = s.threads;
    backend_ = *kernels::CreateCpuBackend(options);
    stream_ = *backend_->CreateStream();
    std::mt19937_64 rng(42);
    const int T = s.requests * s.rows_per_request;
    const int w = kernels::QkWidth(s.geometry);

    // Main segment: the SWA ring of each request (2 * window slots), or the top-k pool.
    const int64_t swa_slots_per_request = 2 * s.window;
    if (s.swa) {
      main_ = MakePool(s.requests * swa_slots_per_request, rng);
      extra_ = MakePool(s.requests * s.compressed_rows, rng);
    } else {
      main_ = MakePool(s.requests * s.compressed_rows, rng);
    }
    main_indptr_.push_back(0);
    extra_indptr_.push_back(0);
    for (int r = 0; r < s.requests; ++r) {
      std::vector<int32_t> chosen;
      for (int i = 0; i < s.rows_per_request; ++i) {
        const int64_t pos = s.context - s.rows_per_request + i;
        positions_.push_back(static_cast<int32_t>(pos % kRopePositions));
        std::vector<int32_t>& topk_indices = s.swa ? extra_indices_ : main_indices_;
        std::vector<int32_t>& topk_indptr = s.swa ? extra_indptr_ : main_indptr_;
        if (s.swa) {
          for (int64_t p = std::max<int64_t>(0, pos - s.window + 1); p <= pos; ++p) {
            main_indices_.push_back(
                static_cast<int32_t>(r * swa_slots_per_request + p % swa_slots_per_request));
          }
          main_indptr_.push_back(static_cast<int32_t>(main_indices_.size()));
        }
        chosen = NextTopk(chosen, s.topk, s.compressed_rows, rng);
        for (int32_t c : chosen) {
          topk_indices.push_back(static_cast<int32_t>(r * s.compressed_rows + c));
        }
        topk_indptr.push_back(static_cast<int32_t>(topk_indices.size()));
      }
    }

    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> q(static_cast<size_t>(T) * s.heads * w);
    for (uint16_t& v : q) v = kernels::F32ToBf16Bits(normal(rng));
    q_ = Upload(q.data(), q.size() * 2);
    for (int h = 0; h < s.heads; ++h) sink_.push_back(normal(rng));
    std::vector<float> cs(kRopePositions * 64);
    for (int p = 0; p < kRopePositions; ++p) {
      for (int k = 0; k < 32; ++k) {
        const double theta = p * std::pow(10000.0, -k / 32.0);
        cs[p * 64 + k] = static_cast<float>(std::cos(theta));
        cs[p * 64 + 32 + k] = static_cast<float>(std::sin(theta));
      }
    }
    cos_sin_ = Upload(cs.data(), cs.size() * 4);
    const size_t th = static_cast<size_t>(T) * s.heads;
    out_ = *backend_->Allocate(th * 512 * 2);
    mx_scales_ = *backend_->Allocate(th * 16);

    p_.num_rows = T;
    p_.num_heads = s.heads;
    p_.geometry = s.geometry;
    p_.q = q_.data();
    p_.softmax_scale = 1.0f / std::sqrt(static_cast<float>(w));
    p_.main = {main_.view, main_indptr_, main_indices_};
    p_.has_extra = s.swa;
    if (s.swa) p_.extra = {extra_.view, extra_indptr_, extra_indices_};
    if (s.sink) p_.sink = sink_;
    if (s.rope_epilogue) {
      p_.epilogue.positions = positions_;
      p_.epilogue.cos_sin = cos_sin_.as<float>();
      p_.epilogue.num_positions = kRopePositions;
    }
    p_.out.format = s.output;
    p_.out.bf16 = out_.data();
    p_.out.mx_data = out_.as<uint8_t>();
    p_.out.mx_scales = mx_scales_.as<uint8_t>();
  }

  absl::Status Run() { return backend_->Attend(p_, *stream_); }
  int rows() const { return p_.num_rows; }
  int64_t keys() const {
    return static_cast<int64_t>(main_indices_.size() + extra_indices_.size());
  }

 private:
  static constexpr int kRopePositions = 4096;

  Buffer Upload(const void* src, size_t bytes) {
    Buffer b = *backend_->Allocate(bytes);
    (void)backend_->CopyToDevice(b.data(), src, bytes, *stream_);
    return b;
  }

  Pool MakePool(int64_t slots, std::mt19937_64& rng) {
    Pool p;
    const int64_t pages = (slots + kPageRows - 1) / kPageRows;
    p.view.format = spec_.format;
    p.view.geometry = spec_.geometry;
    p.view.num_pages = pages;
    p.view.rows_per_page = kPageRows;
    p.view.pitch_bytes = kernels::ServingPitch(spec_.format, spec_.geometry, kPageRows);
    p.view.scale = spec_.format == KvFormat::kFp8PerTensor ? 0.01f : 1.0f;
    p.buffer = *backend_->Allocate(pages * p.view.pitch_bytes);
    p.view.base = p.buffer.data();
    const int w = kernels::QkWidth(spec_.geometry);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // Written in chunks so the staging rows stay small.
    const int64_t chunk = 4096;
    std::vector<uint16_t> rows(chunk * w);
    std::vector<int64_t> slot_ids;
    for (int64_t first = 0; first < pages * kPageRows; first += chunk) {
      const int64_t n = std::min(chunk, pages * kPageRows - first);
      for (int64_t i = 0; i < n * w; ++i) rows[i] = kernels::F32ToBf16Bits(normal(rng));
      slot_ids.resize(n);
      for (int64_t i = 0; i < n; ++i) slot_ids[i] = first + i;
      Buffer dev = Upload(rows.data(), n * w * 2);
      kernels::WriteRowsParams wp;
      wp.cache = {p.buffer.data(),      p.view.format,      p.view.geometry, p.view.num_pages,
                  p.view.rows_per_page, p.view.pitch_bytes, p.view.scale};
      wp.slots = slot_ids;
      wp.rows = dev.data();
      (void)backend_->WriteRows(wp, *stream_);
    }
    return p;
  }

  // Distinct entries in [0, n): fresh, or the previous row's set with a quarter replaced.
  static std::vector<int32_t> NextTopk(const std::vector<int32_t>& prev, int k, int64_t n,
                                       std::mt19937_64& rng) {
    const int count = static_cast<int>(std::min<int64_t>(k, n));
    std::uniform_int_distribution<int64_t> pick(0, n - 1);
    std::vector<int32_t> out(prev);
    std::shuffle(out.begin(), out.end(), rng);
    if (!out.empty()) out.resize(out.size() - out.size() / 4);
    std::unordered_set<int32_t> seen(out.begin(), out.end());
    while (static_cast<int>(out.size()) < count) {
      const int32_t c = static_cast<int32_t>(pick(rng));
      if (seen.insert(c).second) out.push_back(c);
    }
    return out;
  }

  CellSpec spec_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<kernels::Stream> stream_;
  Pool main_, extra_;
  std::vector<int32_t> main_indptr_, main_indices_, extra_indptr_, extra_indices_;
  std::vector<int32_t> positions_;
  std::vector<float> sink_;
  Buffer q_, cos_sin_, out_, mx_scales_;
  AttendParams p_;
};

void RunCell(benchmark::State& state, const CellSpec& spec) {
  Cell cell(spec);
  if (absl::Status s = cell.Run(); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return;
  }
  for (auto _ : state) {
    absl::Status s = cell.Run();
    benchmark::DoNotOptimize(s);
  }
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(cell.rows()),
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["rows"] = cell.rows();
  state.counters["keys/row"] = static_cast<double>(cell.keys()) / cell.rows();
}

// A grid cell on its model's most common layer. The top-k draws from a pool of 32,768 entries
// per request (8,192 past C=1, as many requests share the memory budget) rather than the
// context's: the time per row depends on the keys attended, not on the pool they lie in.
CellSpec SpecFor(const models::Cell& cell) {
  const models::LayerSpec& layer = cell.layer();
  CellSpec s;
  s.geometry = cell.model->geometry;
  s.format = cell.format.value_or(cell.model->default_format);
  s.requests = cell.sequences();
  s.rows_per_request = cell.rows_per_request();
  s.heads = cell.heads();
  s.context = cell.context;
  s.swa = layer.has_window();
  s.window = cell.model->swa_window;
  s.topk = layer.topk;
  s.compressed_rows = s.swa && s.requests > 1 ? 8192 : 32768;
  s.sink = cell.model->has_sink;
  s.rope_epilogue = cell.model->geometry == Geometry::kRopeInside;
  s.output = s.rope_epilogue ? OutputFormat::kMxfp8 : OutputFormat::kBf16;
  return s;
}

// Registers the grid cell `name` (the benchmark's name), with `threads` CPU backend threads
// (0: one per hardware thread) named in a suffix when given.
void Register(const std::string& name, int threads = 0) {
  absl::StatusOr<models::Cell> cell = models::ParseCell(name);
  if (!cell.ok() || !cell->format || cell->tp == 0) {
    std::fprintf(stderr, "smla-cpu-bench: '%s' is not a full grid cell\n", name.c_str());
    std::exit(2);
  }
  CellSpec spec = SpecFor(*cell);
  spec.threads = threads;
  const std::string full = threads > 0 ? absl::StrCat(name, "/threads=", threads) : name;
  benchmark::RegisterBenchmark(full.c_str(), [spec](benchmark::State& st) { RunCell(st, spec); })
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->MinTime(1.0);
}

}  // namespace
}  // namespace smla::bench

int main(int argc, char** argv) {
  using smla::bench::Register;
  Register("dsv4.1-flash fp8_dsv4 TP4 decode C=1 128K");
  Register("dsv4.1-flash fp8_dsv4 TP4 decode C=16 128K");
  Register("dsv4.1-flash fp8_dsv4 TP1 decode C=1 128K");
  Register("dsv4.1-flash fp8_dsv4 TP4 decode1 C=1 128K");
  Register("glm-5.3-flash fp8_per_tensor TP4 decode C=1 128K");
  // One thread: the cost per call in CPU time, less sensitive to other load on the machine.
  Register("dsv4.1-flash fp8_dsv4 TP4 decode C=1 128K", 1);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
