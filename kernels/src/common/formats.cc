#include "smla/kernels/formats.h"

#include <array>
#include <utility>

#include "smla/kernels/backend.h"
#include "smla/kernels/device_info.h"

namespace smla::kernels {
namespace {

constexpr std::array<std::pair<Geometry, std::string_view>, 3> kGeometryNames = {{
    {Geometry::kRopeInside, "rope_inside"},
    {Geometry::kRopeAppended, "rope_appended"},
    {Geometry::kRopeFree, "rope_free"},
}};
constexpr std::array<std::pair<KvFormat, std::string_view>, 4> kFormatNames = {{
    {KvFormat::kBf16, "bf16"},
    {KvFormat::kFp8PerTensor, "fp8_per_tensor"},
    {KvFormat::kFp8DsMla, "fp8_ds_mla"},
    {KvFormat::kFp8Dsv4, "fp8_dsv4"},
}};
constexpr std::array<std::pair<OutputFormat, std::string_view>, 2> kOutputNames = {{
    {OutputFormat::kBf16, "bf16"},
    {OutputFormat::kMxfp8, "mxfp8"},
}};
constexpr std::array<std::pair<BackendChoice, std::string_view>, 4> kBackendNames = {{
    {BackendChoice::kAuto, "auto"},
    {BackendChoice::kCpu, "cpu"},
    {BackendChoice::kCuda, "cuda"},
    {BackendChoice::kHip, "hip"},
}};

template <typename E, size_t N>
std::string_view NameOf(const std::array<std::pair<E, std::string_view>, N>& table, E value) {
  for (const auto& [v, name] : table) {
    if (v == value) return name;
  }
  return "unknown";
}

template <typename E, size_t N>
std::optional<E> Parse(const std::array<std::pair<E, std::string_view>, N>& table,
                       std::string_view name) {
  for (const auto& [v, n] : table) {
    if (n == name) return v;
  }
  return std::nullopt;
}

}  // namespace

std::string_view GeometryName(Geometry g) { return NameOf(kGeometryNames, g); }
std::string_view KvFormatName(KvFormat f) { return NameOf(kFormatNames, f); }
std::string_view OutputFormatName(OutputFormat f) { return NameOf(kOutputNames, f); }
std::optional<Geometry> ParseGeometry(std::string_view n) { return Parse(kGeometryNames, n); }
std::optional<KvFormat> ParseKvFormat(std::string_view n) { return Parse(kFormatNames, n); }
std::optional<OutputFormat> ParseOutputFormat(std::string_view n) { return Parse(kOutputNames, n); }
std::optional<BackendChoice> ParseBackendChoice(std::string_view n) {
  return Parse(kBackendNames, n);
}

std::string_view BackendKindName(BackendKind k) {
  switch (k) {
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kCuda:
      return "cuda";
    case BackendKind::kHip:
      return "hip";
  }
  return "unknown";
}

}  // namespace smla::kernels
