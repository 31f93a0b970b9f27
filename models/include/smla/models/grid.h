// The benchmark grid of docs/performance.md: a cell is a model profile, a KV format, a TP
// degree, a call shape and a context, named "dsv4.1-flash fp8_dsv4 TP4 decode C=32 128K".
// smla-kbench runs the grid's cells on the kernels, smla-bench one cell against a server and
// smla-cpu-bench a few on the CPU backend; all of them name and parse cells here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "smla/kernels/formats.h"
#include "smla/models/profile.h"

namespace smla::models {

// decode: each request's verify row and its 5 draft rows; decode1: one row per request;
// prefill: one chunk of P rows of one sequence.
enum class Shape : uint8_t { kDecode, kDecode1, kPrefill };

std::string_view ShapeKindName(Shape shape);  // "decode", "decode1", "prefill"

inline constexpr int kDecodeDrafts = 5;

struct Cell {
  const ModelProfile* model = nullptr;
  std::optional<kernels::KvFormat> format;  // unset: any (smla-bench takes the server's)
  int tp = 0;                               // 0: any (smla-bench takes the server's)
  Shape shape = Shape::kDecode;
  int requests = 1;          // C: requests per call (decode, decode1)
  int prefill_rows = 8192;   // P (prefill)
  int64_t context = 131072;  // positions before the call's rows

  int drafts() const { return shape == Shape::kDecode ? kDecodeDrafts : 0; }
  int rows_per_request() const { return shape == Shape::kPrefill ? prefill_rows : 1 + drafts(); }
  // Sequences one call steps: C, or the one a prefill chunk belongs to.
  int sequences() const { return shape == Shape::kPrefill ? 1 : requests; }
  int rows() const { return sequences() * rows_per_request(); }
  int heads() const { return model->num_heads / tp; }  // heads per rank; tp must be set
  // The layer a one-layer benchmark of the cell times: the model's most common one.
  const LayerSpec& layer() const { return model->most_common_layer(); }

  std::string ShapeName() const;  // "decode C=32", "decode1 C=1", "prefill 8K"
  // "dsv4.1-flash fp8_dsv4 TP4 decode C=32 128K"; format and TP only when set.
  std::string Name() const;
};

// Parses a cell name: a profile name, then in any order a KV format, "TP<n>", a shape
// ("decode C=32", "decode1 C=8", "prefill 8K"; C=1 and 8K when left out) and a context
// ("128K"). What is not given keeps Cell's defaults.
absl::StatusOr<Cell> ParseCell(std::string_view name);

// The results' layer column for a layer spec: "c<r>" with a 1/r compressed cache, "swa"
// without one, "glm" for chosen positions (only the GLM profiles have them).
std::string LayerLabel(const LayerSpec& layer);

// The grid, optionally narrowed: a cell is kept when it matches every non-empty list. Shapes
// match by name ("decode C=32") or kind ("decode"), contexts by name ("128K").
struct GridFilter {
  std::vector<std::string> models, formats, shapes, contexts;
  std::vector<int> tps;
};
std::vector<Cell> GridCells(const GridFilter& filter = {});

// The cells the kernels' bar is judged on (docs/performance.md).
bool IsBarCell(const Cell& cell);

}  // namespace smla::models
