#include "smla/models/profile.h"

#include <algorithm>
#include <cmath>

namespace smla::models {
namespace {

using kernels::Geometry;
using kernels::KvFormat;

constexpr int32_t kSwaWindow = 128;
constexpr int32_t kDsv4TopK = 512;
constexpr int32_t kGlmChosen = 2048;

std::vector<ModelProfile> BuildProfiles() {
  std::vector<ModelProfile> out;

  ModelProfile v4;
  v4.name = "dsv4-flash";
  v4.geometry = Geometry::kRopeInside;
  v4.default_format = KvFormat::kFp8Dsv4;
  v4.has_sink = true;
  v4.swa_window = kSwaWindow;
  v4.softmax_scale = 1.0f / std::sqrt(512.0f);
  v4.layers.assign(2, LayerSpec{LayerKind::kSwaOnly, 0, 0});
  for (int i = 0; i < 20; ++i) {
    v4.layers.push_back({LayerKind::kSwaTopK, 4, kDsv4TopK});
    v4.layers.push_back({LayerKind::kSwaDense, 128, 0});
  }
  v4.layers.push_back({LayerKind::kSwaTopK, 4, kDsv4TopK});
  out.push_back(v4);

  ModelProfile v41 = v4;
  v41.name = "dsv4.1-flash";
  v41.layers.assign(2, LayerSpec{LayerKind::kSwaOnly, 0, 0});
  for (int i = 0; i < 18; ++i) v41.layers.push_back({LayerKind::kSwaTopK, 2, kDsv4TopK});
  for (int i = 0; i < 20; ++i) v41.layers.push_back({LayerKind::kSwaTopK, 1, kDsv4TopK});
  out.push_back(v41);

  ModelProfile g52;
  g52.name = "glm-5.2";
  g52.geometry = Geometry::kRopeAppended;
  g52.default_format = KvFormat::kFp8PerTensor;
  g52.has_sink = false;
  g52.swa_window = 0;
  g52.softmax_scale = 1.0f / std::sqrt(192.0f);
  g52.layers.assign(78, LayerSpec{LayerKind::kChosen, 0, kGlmChosen});
  out.push_back(g52);

  ModelProfile g53 = g52;
  g53.name = "glm-5.3-flash";
  g53.geometry = Geometry::kRopeFree;
  g53.softmax_scale = 1.0f / std::sqrt(512.0f);
  g53.layers.assign(1, LayerSpec{LayerKind::kChosen, 0, kGlmChosen});
  out.push_back(g53);
  return out;
}

const std::vector<ModelProfile>& Profiles() {
  static const std::vector<ModelProfile>* profiles = new std::vector<ModelProfile>(BuildProfiles());
  return *profiles;
}

}  // namespace

std::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kSwaOnly:
      return "swa";
    case LayerKind::kSwaTopK:
      return "swa+topk";
    case LayerKind::kSwaDense:
      return "swa+dense";
    case LayerKind::kChosen:
      return "chosen";
  }
  return "?";
}

const LayerSpec& ModelProfile::most_common_layer() const {
  const LayerSpec* best = &layers.front();
  int best_count = 0;
  for (const LayerSpec& l : layers) {
    const int n = static_cast<int>(std::count(layers.begin(), layers.end(), l));
    if (n > best_count) {
      best = &l;
      best_count = n;
    }
  }
  return *best;
}

const ModelProfile* FindProfile(std::string_view name) {
  for (const ModelProfile& p : Profiles()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::span<const ModelProfile> AllProfiles() { return Profiles(); }

std::string ProfileNames() {
  std::string names;
  for (const ModelProfile& p : Profiles()) {
    if (!names.empty()) names += ", ";
    names += p.name;
  }
  return names;
}

}  // namespace smla::models
