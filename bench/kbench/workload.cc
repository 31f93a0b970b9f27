#include "kbench/workload.h"

#include <algorithm>
#include <random>
#include <unordered_set>

#include "absl/strings/str_cat.h"

namespace smla::kbench {
namespace {

constexpr int kWindow = 128;  // SWA keys per row
constexpr int kTopK = 512;    // chosen entries per row (DeepSeek)
constexpr int kGlmTopK = 2048;
constexpr double kRedraw = 0.25;  // fraction of a neighbour row's set that a draft row redraws

template <typename T>
bool Wanted(const std::vector<T>& filter, const T& v) {
  return filter.empty() || std::find(filter.begin(), filter.end(), v) != filter.end();
}

std::string ContextName(int64_t c) { return absl::StrCat(c / 1024, "K"); }

int64_t NextPow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Distinct random entries of [0, n), `k` of them (all when n <= k), each row of a request
// redrawing a quarter of its neighbour's set.
class ChosenSets {
 public:
  ChosenSets(std::mt19937_64& rng) : rng_(rng) {}

  const std::vector<int32_t>& Next(int64_t n, int k, bool first) {
    const int want = static_cast<int>(std::min<int64_t>(n, k));
    if (first || static_cast<int>(cur_.size()) != want || want == n) {
      cur_.clear();
      seen_.clear();
      if (want == n) {
        for (int64_t i = 0; i < n; ++i) cur_.push_back(static_cast<int32_t>(i));
        return cur_;
      }
      while (static_cast<int>(cur_.size()) < want) Add(n);
      return cur_;
    }
    std::uniform_int_distribution<size_t> pick(0, cur_.size() - 1);
    const int redraw = static_cast<int>(want * kRedraw);
    for (int i = 0; i < redraw; ++i) {
      const size_t at = pick(rng_);
      seen_.erase(cur_[at]);
      cur_[at] = cur_.back();
      cur_.pop_back();
      Add(n);
    }
    return cur_;
  }

 private:
  void Add(int64_t n) {
    std::uniform_int_distribution<int64_t> d(0, n - 1);
    for (;;) {
      const int32_t v = static_cast<int32_t>(d(rng_));
      if (seen_.insert(v).second) {
        cur_.push_back(v);
        return;
      }
    }
  }
  std::mt19937_64& rng_;
  std::vector<int32_t> cur_;
  std::unordered_set<int32_t> seen_;
};

int64_t CountUnique(const std::vector<int32_t>& ids, int64_t slots) {
  std::vector<bool> seen(static_cast<size_t>(slots), false);
  int64_t n = 0;
  for (int32_t id : ids) {
    if (id < 0 || id >= slots || seen[id]) continue;
    seen[id] = true;
    ++n;
  }
  return n;
}

}  // namespace

const std::vector<Model>& Models() {
  static const std::vector<Model> models = {
      // dsv4.1-flash: 2 SWA-only + 18 c2 + 20 c1 layers; c1 is the most frequent.
      {"dsv4.1-flash",
       Geometry::kRopeInside,
       {KvFormat::kFp8Dsv4, KvFormat::kBf16},
       LayerKind::kTopK,
       1,
       "c1"},
      // dsv4-flash: 2 SWA-only + 21 c4 + 20 c128.
      {"dsv4-flash", Geometry::kRopeInside, {KvFormat::kFp8Dsv4}, LayerKind::kTopK, 4, "c4"},
      {"glm-5.2", Geometry::kRopeAppended, {KvFormat::kFp8PerTensor}, LayerKind::kGlm, 1, "glm"},
      {"glm-5.3-flash", Geometry::kRopeFree, {KvFormat::kFp8PerTensor}, LayerKind::kGlm, 1, "glm"},
  };
  return models;
}

const Model* FindModel(const std::string& name) {
  for (const Model& m : Models()) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

std::string Cell::Name() const {
  return absl::StrCat(model->name, " ", std::string(kernels::KvFormatName(format)), " TP", tp, " ",
                      shape, " ", ContextName(context));
}

std::vector<Cell> GridCells(const Filter& f) {
  struct Shape {
    std::string name, kind;
    int requests, rows;
  };
  std::vector<Shape> shapes;
  for (int c : {1, 16, 32, 64, 128})
    shapes.push_back({absl::StrCat("decode C=", c), "decode", c, 6});
  for (int c : {1, 16, 32, 64}) shapes.push_back({absl::StrCat("decode1 C=", c), "decode1", c, 1});
  shapes.push_back({"prefill 8K", "prefill", 1, 8192});
  shapes.push_back({"prefill 16K", "prefill", 1, 16384});
  std::vector<Cell> cells;
  for (const Model& m : Models()) {
    if (!Wanted(f.models, m.name)) continue;
    for (KvFormat fmt : m.formats) {
      if (!Wanted(f.formats, std::string(kernels::KvFormatName(fmt)))) continue;
      for (int64_t ctx : {int64_t{131072}, int64_t{262144}}) {
        if (!Wanted(f.contexts, ContextName(ctx))) continue;
        for (int tp : {8, 4, 2, 1}) {
          if (!Wanted(f.tps, tp)) continue;
          for (const Shape& s : shapes) {
            if (!Wanted(f.shapes, s.name) && !Wanted(f.shapes, s.kind)) continue;
            Cell c;
            c.model = &m;
            c.format = fmt;
            c.tp = tp;
            c.heads = 64 / tp;
            c.shape = s.name;
            c.requests = s.requests;
            c.rows_per_request = s.rows;
            c.context = ctx;
            cells.push_back(c);
          }
        }
      }
    }
  }
  return cells;
}

PoolShape PoolFor(const Cell& cell, int max_requests) {
  PoolShape p;
  const Model& m = *cell.model;
  if (m.layer == LayerKind::kGlm) {
    p.main_slots = int64_t{max_requests} * cell.context;
    return p;
  }
  p.ring = NextPow2(cell.rows_per_request + kWindow);
  p.main_slots = int64_t{max_requests} * p.ring;
  if (m.layer != LayerKind::kSwaOnly)
    p.extra_slots = int64_t{max_requests} * cell.context / m.ratio;
  return p;
}

CallIndices MakeIndices(const Cell& cell, const PoolShape& pools, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Model& m = *cell.model;
  CallIndices ci;
  ci.main_indptr.push_back(0);
  const bool extra = m.layer == LayerKind::kTopK || m.layer == LayerKind::kAllEntries;
  if (extra) ci.extra_indptr.push_back(0);
  ChosenSets chosen(rng);
  const int64_t per_request_entries =
      m.layer == LayerKind::kGlm ? cell.context : cell.context / m.ratio;
  for (int r = 0; r < cell.requests; ++r) {
    for (int i = 0; i < cell.rows_per_request; ++i) {
      const int64_t pos = cell.context - cell.rows_per_request + i;
      ci.positions.push_back(static_cast<int32_t>(pos % 65536));
      if (m.layer == LayerKind::kGlm) {
        const auto& set = chosen.Next(pos + 1, kGlmTopK, i == 0);
        for (int32_t e : set) {
          ci.main_indices.push_back(static_cast<int32_t>(r * per_request_entries + e));
        }
        ci.main_indptr.push_back(static_cast<int32_t>(ci.main_indices.size()));
        continue;
      }
      for (int64_t p = std::max<int64_t>(0, pos - kWindow + 1); p <= pos; ++p) {
        ci.main_indices.push_back(static_cast<int32_t>(r * pools.ring + p % pools.ring));
      }
      ci.main_indptr.push_back(static_cast<int32_t>(ci.main_indices.size()));
      if (!extra) continue;
      const int64_t visible = (pos + 1) / m.ratio;
      const int k = m.layer == LayerKind::kAllEntries ? static_cast<int>(visible) : kTopK;
      const auto& set = chosen.Next(visible, k, i == 0);
      for (int32_t e : set) {
        ci.extra_indices.push_back(static_cast<int32_t>(r * per_request_entries + e));
      }
      ci.extra_indptr.push_back(static_cast<int32_t>(ci.extra_indices.size()));
    }
  }
  ci.attended_keys = static_cast<int64_t>(ci.main_indices.size() + ci.extra_indices.size());
  ci.unique_main = CountUnique(ci.main_indices, pools.main_slots);
  if (extra) ci.unique_extra = CountUnique(ci.extra_indices, pools.extra_slots);
  return ci;
}

}  // namespace smla::kbench
