// The index sets a grid cell's calls read (the grid is smla/models/grid.h), on the layer the
// cell times: SWA windows ending at each row's position, top-k entries of a compressed cache
// chosen at random among the visible ones (a request's rows draw overlapping sets), every
// entry of a 1/128 cache, or GLM's 2,048 chosen positions.
#pragma once

#include <cstdint>
#include <vector>

#include "smla/models/grid.h"

namespace smla::kbench {

using models::Cell;

inline constexpr double kDefaultRedraw = 0.25;

// One call's CSR segments. Slots: the SWA pool holds `ring` slots per request; the extra (or
// GLM) pool holds one slot per compressed entry per request.
struct CallIndices {
  std::vector<int32_t> main_indptr, main_indices;
  std::vector<int32_t> extra_indptr, extra_indices;  // empty without an extra segment
  std::vector<int32_t> positions;
  int64_t attended_keys = 0;  // non-sentinel keys over all rows and both segments
  int64_t unique_main = 0;    // distinct slots read
  int64_t unique_extra = 0;
};

struct PoolShape {
  int64_t main_slots = 0;   // requests * ring (SWA) or requests * context (GLM)
  int64_t extra_slots = 0;  // requests * context / ratio, 0 without an extra segment
  int64_t ring = 0;         // SWA slots per request
};

// Pools sized for `max_requests` requests of `rows_per_request` rows at `context`.
PoolShape PoolFor(const Cell& cell, int max_requests);
// The call's index sets; each row after a request's first redraws the fraction `redraw` of the
// row before's chosen set (a quarter by default: a pair's union is then 1.25 sets).
CallIndices MakeIndices(const Cell& cell, const PoolShape& pools, uint64_t seed,
                        double redraw = kDefaultRedraw);

}  // namespace smla::kbench
