// KV-cache formats, geometries and output formats of docs/operator.md sections 2-3, with the
// byte arithmetic every backend and the KV store share.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "smla/base/align.h"
#include "smla/kernels/hd.h"

namespace smla::kernels {

enum class Geometry : uint8_t {
  kRopeInside = 0,    // 512-wide rows, 448 NoPE + 64 roped (last); QK and V over all 512
  kRopeAppended = 1,  // 576-wide rows, 512 latent + 64 rope; QK over 576, V the first 512
  kRopeFree = 2,      // 512-wide rows, no rope
};

enum class KvFormat : uint8_t {
  kBf16 = 0,          // R bf16 values per row
  kFp8PerTensor = 1,  // R e4m3 bytes per row, one f32 scale per cache
  kFp8DsMla = 2,      // 656 B: 512 e4m3, 4 f32 scales (per 128), 64 bf16 rope
  kFp8Dsv4 = 3,       // 576 B data row (448 e4m3 + 64 bf16 rope) + 8 B scale record in a trailer
};

enum class QType : uint8_t { kBf16 = 0, kFp8 = 1 };

enum class OutputFormat : uint8_t {
  kBf16 = 0,   // [T, H, 512] bf16
  kMxfp8 = 1,  // e4m3 [T, H*512] + E8M0 scales [T, H*16]
};

inline constexpr int kValueWidth = 512;  // V and output width, every geometry
inline constexpr int kRopeWidth = 64;    // roped lanes of rope_inside / rope_appended
inline constexpr int kNopeWidth = 448;   // rope_inside NoPE lanes
inline constexpr int kMxGroup = 32;      // MXFP8 lanes per scale
inline constexpr int kMxGroupsPerHead = kValueWidth / kMxGroup;  // 16
inline constexpr int kDsv4DataBytes = 576;                       // 448 e4m3 + 64 bf16
inline constexpr int kDsv4ScaleBytes = 8;                        // 7 UE8M0 + 1 pad
inline constexpr int kDsv4Groups = 7;                            // one scale per 64 NoPE values
inline constexpr int kDsMlaRowBytes = 656;                       // 512 e4m3 + 4 f32 + 64 bf16
inline constexpr int kDsMlaGroups = 4;                           // one scale per 128 latent values
inline constexpr int kMaxHeads = 128;

// The accepted range of KV values (docs/promises.md, "Numerical range of the inputs"): every
// bf16 value a caller writes into a pool has |x| <= 2^kKvMaxLog2 (the service refuses rows past
// it at admission). Within it every backend's staged values and accumulators are finite: the
// fp8 group scales are at most 2^56 (fp8_dsv4 bytes <= 183), staged values at most 2^64 (times
// the cache scale for fp8_per_tensor), and a row's sum of P-weighted values (P <= 1) over up
// to 2^31 keys stays below 2^96. Past it a backend's result is not defined (a value near
// 3.4e38 can decode to 2^128 in fp8_dsv4, and near-equal weights sum past f32's range).
inline constexpr int kKvMaxLog2 = 64;

// Width of a KV row and of q for a geometry (576 for rope_appended, else 512).
SMLA_HD_INLINE constexpr int QkWidth(Geometry g) {
  return g == Geometry::kRopeAppended ? 576 : 512;
}

// Whether a format can store rows of a geometry (docs/operator.md section 2).
SMLA_HD_INLINE constexpr bool FormatSupports(KvFormat f, Geometry g) {
  switch (f) {
    case KvFormat::kBf16:
    case KvFormat::kFp8PerTensor:
      return true;
    case KvFormat::kFp8DsMla:
      return g == Geometry::kRopeAppended;
    case KvFormat::kFp8Dsv4:
      return g == Geometry::kRopeInside;
  }
  return false;
}

// Bytes one row needs inside a page (for fp8_dsv4: data row plus its scale record).
SMLA_HD_INLINE constexpr int64_t RowBytes(KvFormat f, Geometry g) {
  switch (f) {
    case KvFormat::kBf16:
      return 2 * QkWidth(g);
    case KvFormat::kFp8PerTensor:
      return QkWidth(g);
    case KvFormat::kFp8DsMla:
      return kDsMlaRowBytes;
    case KvFormat::kFp8Dsv4:
      return kDsv4DataBytes + kDsv4ScaleBytes;
  }
  return 0;
}

// Smallest legal pitch: what B rows need, rounded up to 16 bytes.
SMLA_HD_INLINE constexpr int64_t MinPitch(KvFormat f, Geometry g, int64_t rows_per_page) {
  return AlignUp(RowBytes(f, g) * rows_per_page, 16);
}

// The pitch the serving stacks use: fp8_dsv4 pads to a multiple of 576 bytes
// (ceil(B*584/576)*576), every other format packs rows and rounds to 16.
SMLA_HD_INLINE constexpr int64_t ServingPitch(KvFormat f, Geometry g, int64_t rows_per_page) {
  if (f == KvFormat::kFp8Dsv4) {
    return AlignUp(AlignUp(RowBytes(f, g) * rows_per_page, kDsv4DataBytes), 16);
  }
  return MinPitch(f, g, rows_per_page);
}

std::string_view GeometryName(Geometry g);
std::string_view KvFormatName(KvFormat f);
std::string_view OutputFormatName(OutputFormat f);
std::optional<Geometry> ParseGeometry(std::string_view name);
std::optional<KvFormat> ParseKvFormat(std::string_view name);
std::optional<OutputFormat> ParseOutputFormat(std::string_view name);

}  // namespace smla::kernels
