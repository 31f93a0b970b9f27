// The benchmark grid of docs/performance.md as named cells, and the index sets a cell's calls read:
// SWA windows ending at each row's position, top-k entries of a compressed cache chosen at
// random among the visible ones (a request's rows draw overlapping sets), every entry of a
// 1/128 cache, or GLM's 2,048 chosen positions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "smla/kernels/formats.h"

namespace smla::kbench {

using kernels::Geometry;
using kernels::KvFormat;

// A layer kind: what the main (SWA) and extra segments of a call hold.
enum class LayerKind { kSwaOnly, kTopK, kAllEntries, kGlm };

struct Model {
  std::string name;
  Geometry geometry;
  std::vector<KvFormat> formats;
  LayerKind layer;  // the layer kind a cell times (the model's most frequent one)
  int ratio;        // compression of the extra cache (c1, c2, c4, c128)
  std::string layer_name;
};

struct Cell {
  const Model* model = nullptr;
  KvFormat format = KvFormat::kFp8Dsv4;
  int tp = 4;
  int heads = 16;     // 64 / TP
  std::string shape;  // "decode C=32", "decode1 C=16", "prefill 8K"
  int requests = 1;
  int rows_per_request = 1;  // 6 for decode (5 drafts + 1), 1 for decode1, 8192/16384 for prefill
  int64_t context = 131072;

  std::string Name() const;  // "dsv4.1-flash fp8_dsv4 TP4 decode C=32 128K"
  int rows() const { return requests * rows_per_request; }
};

const std::vector<Model>& Models();
const Model* FindModel(const std::string& name);

// Every cell of the grid, optionally filtered (empty filter = all): models, formats, TP
// degrees, shapes ("decode C=32" or "decode"), contexts ("128K").
struct Filter {
  std::vector<std::string> models, formats, shapes, contexts;
  std::vector<int> tps;
};
std::vector<Cell> GridCells(const Filter& filter);

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
CallIndices MakeIndices(const Cell& cell, const PoolShape& pools, uint64_t seed);

}  // namespace smla::kbench
