// The served models' facts (docs/architecture.md, "Model profiles"): geometry, default KV
// format, heads, sink, SWA window, softmax scale and what each layer attends, so a frontend
// names "dsv4-flash, TP4, layer 7" instead of re-describing its caches. The server serves
// these profiles; the benchmarks build their cells (grid.h) from them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "smla/kernels/formats.h"

namespace smla::models {

// What one layer attends. The main segment is either a sliding window over the layer's own
// cache (DeepSeek-V4.x) or positions chosen by the client's indexer from the full cache (GLM).
enum class LayerKind : uint8_t {
  kSwaOnly = 0,   // main: SWA window; no extra segment
  kSwaTopK = 1,   // main: SWA window; extra: client-chosen entries of a 1/r compressed cache
  kSwaDense = 2,  // main: SWA window; extra: every visible entry of a 1/r compressed cache
  kChosen = 3,    // main: client-chosen positions of the full cache; no extra segment
};

std::string_view LayerKindName(LayerKind kind);

struct LayerSpec {
  LayerKind kind = LayerKind::kSwaOnly;
  int32_t ratio = 0;  // compression ratio r of the extra cache (kSwaTopK, kSwaDense), else 0
  int32_t topk = 0;   // most entries a row may choose (kSwaTopK, kChosen), else 0

  bool has_window() const { return kind != LayerKind::kChosen; }
  bool has_compressed() const {
    return kind == LayerKind::kSwaTopK || kind == LayerKind::kSwaDense;
  }
  bool client_chooses() const { return kind == LayerKind::kSwaTopK || kind == LayerKind::kChosen; }
  // Entries a row at `position` may see: compressed entries 0..floor((p+1)/r)-1 of the 1/r
  // cache where the layer has one, else positions 0..p of the main cache.
  int64_t visible(int64_t position) const {
    return has_compressed() ? (position + 1) / ratio : position + 1;
  }
  bool operator==(const LayerSpec&) const = default;
};

struct ModelProfile {
  std::string name;
  kernels::Geometry geometry = kernels::Geometry::kRopeInside;
  kernels::KvFormat default_format = kernels::KvFormat::kBf16;
  int32_t num_heads = 64;  // query heads of the whole model; heads per rank = num_heads / tp
  bool has_sink = false;
  int32_t swa_window = 0;  // W of the window layers (0 when no layer has one)
  // Default softmax scale: 1/sqrt(qk head dim of the model's training-time attention).
  float softmax_scale = 1.0f;
  std::vector<LayerSpec> layers;

  int32_t num_layers() const { return static_cast<int32_t>(layers.size()); }
  // The layer spec most of the model's layers have (the first such in layer order on a tie):
  // what a benchmark of one layer times.
  const LayerSpec& most_common_layer() const;
};

// The built-in profiles, by name ("dsv4-flash", "dsv4.1-flash", "glm-5.2", "glm-5.3-flash").
// Layer order:
// - dsv4-flash follows the checkpoint's compress_ratios [0,0] + [4,128] x 20 + [4]: layers 0-1
//   SWA-only, then c4 and c128 alternating (even layers c4), layer 42 c4.
// - dsv4.1-flash: the interleaving of its checkpoint is not recorded here, so the kinds are
//   listed as docs/architecture.md lists them: layers 0-1 SWA-only, 2-19 c2 (top-512), 20-39 c1.
// Softmax scales: DeepSeek-V4.x attend with head dim 512 (1/sqrt(512)); glm-5.2 keeps the
// DeepSeek-V3.2-style 128 + 64 qk head (1/sqrt(192), without the long-context mscale, which a
// frontend adds through ModelConfig::softmax_scale); glm-5.3-flash 1/sqrt(512).
const ModelProfile* FindProfile(std::string_view name);
std::span<const ModelProfile> AllProfiles();
// "dsv4-flash, dsv4.1-flash, ..." for messages that list what exists.
std::string ProfileNames();

}  // namespace smla::models
