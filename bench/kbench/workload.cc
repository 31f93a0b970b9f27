#include "kbench/workload.h"

#include <algorithm>
#include <random>
#include <unordered_set>

namespace smla::kbench {
namespace {

using models::LayerKind;
using models::LayerSpec;

int64_t NextPow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Distinct random entries of [0, n), `k` of them (all when n <= k), each row of a request
// redrawing a fraction `redraw` of its neighbour's set.
class ChosenSets {
 public:
  ChosenSets(std::mt19937_64& rng, double redraw) : rng_(rng), redraw_(redraw) {}

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
    const int redraw = static_cast<int>(want * redraw_);
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
  const double redraw_;
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

PoolShape PoolFor(const Cell& cell, int max_requests) {
  PoolShape p;
  const LayerSpec& layer = cell.layer();
  if (!layer.has_window()) {
    p.main_slots = int64_t{max_requests} * cell.context;
    return p;
  }
  p.ring = NextPow2(cell.rows_per_request() + cell.model->swa_window);
  p.main_slots = int64_t{max_requests} * p.ring;
  if (layer.has_compressed()) p.extra_slots = int64_t{max_requests} * cell.context / layer.ratio;
  return p;
}

CallIndices MakeIndices(const Cell& cell, const PoolShape& pools, uint64_t seed, double redraw) {
  std::mt19937_64 rng(seed);
  const LayerSpec& layer = cell.layer();
  const int window = cell.model->swa_window;
  CallIndices ci;
  ci.main_indptr.push_back(0);
  const bool extra = layer.has_compressed();
  if (extra) ci.extra_indptr.push_back(0);
  ChosenSets chosen(rng, redraw);
  const int64_t per_request_entries = extra ? cell.context / layer.ratio : cell.context;
  const int rows_per_request = cell.rows_per_request();
  for (int r = 0; r < cell.sequences(); ++r) {
    for (int i = 0; i < rows_per_request; ++i) {
      const int64_t pos = cell.context - rows_per_request + i;
      ci.positions.push_back(static_cast<int32_t>(pos % 65536));
      if (!layer.has_window()) {
        const auto& set = chosen.Next(pos + 1, layer.topk, i == 0);
        for (int32_t e : set) {
          ci.main_indices.push_back(static_cast<int32_t>(r * per_request_entries + e));
        }
        ci.main_indptr.push_back(static_cast<int32_t>(ci.main_indices.size()));
        continue;
      }
      for (int64_t p = std::max<int64_t>(0, pos - window + 1); p <= pos; ++p) {
        ci.main_indices.push_back(static_cast<int32_t>(r * pools.ring + p % pools.ring));
      }
      ci.main_indptr.push_back(static_cast<int32_t>(ci.main_indices.size()));
      if (!extra) continue;
      const int64_t visible = layer.visible(pos);
      const int k = layer.kind == LayerKind::kSwaDense ? static_cast<int>(visible) : layer.topk;
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
