// The one list of compiled attention variants: it drives the instantiations and the run-time
// lookup; a miss is Unimplemented naming the combination. Formats are chosen per tile at run
// time (both segments may differ), so a variant is (QK width, head block), and for the direct
// kernel whether its 16 head slots hold two rows' 8 heads (PairMode::kHalves).
#include <array>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "gpu/attend_direct_kernel.cuh"
#include "gpu/attend_kernel.cuh"
#include "gpu/attend_wgmma_kernel.cuh"
#include "gpu/kernel_params.h"

namespace smla::kernels::gpu {
namespace {

using KernelFn = void (*)(AttendKernelParams);

struct Variant {
  int qk_width;
  int head_block;
  KernelFn fn;
  int threads;
  int keys;
};

template <int kQk, int kHb, int kW, bool kQInRegs, int kKeys, int kMinBlocks>
constexpr Variant MakeVariant() {
  using C = AttendConfig<kQk, kHb, kW, kQInRegs, kKeys, kMinBlocks>;
  return {kQk, kHb, &SparseMlaAttendKernel<C>, C::kThreads, kKeys};
}

// All on 64-key tiles, one program per SM (measured on the H200: 32-key tiles with two
// programs per SM were slower). 16 heads: 8 warps with Q in registers (256 threads, up to 255
// registers each); 4 warps were 20-30 % slower. 32 and 64 heads: 4 warps per 16 heads, Q read
// from shared memory (at 32 heads 3-10 % faster than 8 warps per 16 heads). A 16-key MFMA
// n-tile allows at most 4 wavefronts per 16 heads on gfx950 (not measured there).
inline constexpr int kW16 = kWarpSize == 32 ? 8 : 4;
constexpr std::array kVariants = {
    MakeVariant<512, 16, kW16, true, 64, 1>(), MakeVariant<512, 32, 4, false, 64, 1>(),
    MakeVariant<512, 64, 4, false, 64, 1>(),   MakeVariant<576, 16, kW16, true, 64, 1>(),
    MakeVariant<576, 32, 4, false, 64, 1>(),   MakeVariant<576, 64, 4, false, 64, 1>(),
};

// Direct kernels (fp8_dsv4 and fp8_per_tensor segments). 16-head programs are register-capped
// for two programs per SM (measured on the H200: one program per SM with more stages was 34 %
// slower); 32-head programs need one SM each (about 125 KB of shared memory).
struct DirectVariant {
  int qk_width;
  int head_block;
  int blocks;
  bool half_pairs;  // PairMode::kHalves programs
  KernelFn fn;
};

template <int kQk, int kHb, int kBlocks, bool kHalfPairs = false>
constexpr DirectVariant MakeDirect() {
  using C = DirectConfig<kQk, kHb, kBlocks, kHalfPairs>;
  static_assert(C::kThreads == 256, "the launch below assumes 256 threads");
  return {kQk, kHb, kBlocks, kHalfPairs, &SparseMlaAttendDirectKernel<C>};
}

constexpr std::array kDirectVariants = {
    MakeDirect<512, 16, 2>(), MakeDirect<576, 16, 2>(),       MakeDirect<512, 32, 1>(),
    MakeDirect<576, 32, 1>(), MakeDirect<512, 16, 2, true>(), MakeDirect<576, 16, 2, true>()};

const DirectVariant* FindDirect(int qk_width, int head_block, bool half_pairs = false) {
  for (const DirectVariant& v : kDirectVariants) {
    if (v.qk_width == qk_width && v.head_block == head_block && v.half_pairs == half_pairs) {
      return &v;
    }
  }
  return nullptr;
}

const Variant* Find(int qk_width, int head_block) {
  for (const Variant& v : kVariants) {
    if (v.qk_width == qk_width && v.head_block == head_block) return &v;
  }
  return nullptr;
}

}  // namespace

int32_t StageBytes(KvFormat format, int qk_width, int keys) {
  switch (format) {
    case KvFormat::kBf16:
      return keys * (qk_width + 8) * 2;
    case KvFormat::kFp8PerTensor:
      return keys * qk_width;
    case KvFormat::kFp8DsMla:
      return keys * kDsMlaRowBytes;
    case KvFormat::kFp8Dsv4:
      return keys * (kDsv4DataBytes + kDsv4ScaleBytes);
  }
  return 0;
}

int64_t AttendSharedBytes(int qk_width, int head_block, int stage_bytes, int num_stages,
                          bool use_tile, int keys) {
  const int64_t q = int64_t{head_block} * (qk_width + 8) * 2;
  const int64_t pm = int64_t{head_block} * (keys + 8) * 2;
  const int64_t red = int64_t{head_block} * kMaxWarpsPer16Heads * 4 * 2;
  const int64_t valid = int64_t{kMaxStages} * keys * 4;
  const int64_t tile = use_tile ? int64_t{keys} * (qk_width + 8) * 2 : 0;
  return q + pm + red + valid + num_stages * int64_t{stage_bytes} + tile;
}

bool DirectFormat(KvFormat format) {
  return format == KvFormat::kFp8Dsv4 || format == KvFormat::kFp8PerTensor;
}

int32_t DirectStageBytes(KvFormat format, int qk_width) {
  const int keys = kTileKeys;
  const int32_t rows = keys * DirectRowStride(static_cast<int>(format), qk_width);
  return format == KvFormat::kFp8Dsv4 ? rows + keys * kDsv4ScaleBytes : rows;
}

int64_t DirectSharedBytes(int qk_width, int head_block, int stage_bytes, int num_stages) {
  const auto bytes = [&]<class C>() {
    return int64_t{DirectSmem<C>::kStages} + int64_t{num_stages} * stage_bytes;
  };
  if (qk_width == 512) {
    return head_block == 16 ? bytes.operator()<DirectConfig<512, 16, 1>>()
                            : bytes.operator()<DirectConfig<512, 32, 1>>();
  }
  return head_block == 16 ? bytes.operator()<DirectConfig<576, 16, 1>>()
                          : bytes.operator()<DirectConfig<576, 32, 1>>();
}

int DirectVariantBlocks(int qk_width, int head_block) {
  const DirectVariant* v = FindDirect(qk_width, head_block);
  return v == nullptr ? 0 : v->blocks;
}

absl::Status LaunchAttendDirect(const AttendKernelParams& p, int qk_width, int head_block,
                                int64_t shared_bytes, StreamHandle stream) {
  const bool half_pairs = p.paired == static_cast<int32_t>(PairMode::kHalves);
  const DirectVariant* v = FindDirect(qk_width, head_block, half_pairs);
  if (v == nullptr) {
    return absl::UnimplementedError(absl::StrCat("no direct attention kernel for QK width ",
                                                 qk_width, " with ", head_block, "-head programs",
                                                 half_pairs ? " of paired 8-head rows" : ""));
  }
  if (p.paired != 0 && p.union_rows != 2) {
    return absl::InternalError("the direct kernel's paired programs hold two rows");
  }
  const int64_t programs = ProgramUnits(p) * p.head_blocks * p.splits;
  if (programs == 0) return absl::OkStatus();
  return ToStatus(Launch(v->fn, dim3(static_cast<unsigned>(programs)), dim3(256),
                         static_cast<size_t>(shared_bytes), stream, p),
                  "direct attention kernel launch");
}

int AttendVariantKeys(int qk_width, int head_block) {
  const Variant* v = Find(qk_width, head_block);
  return v == nullptr ? 0 : v->keys;
}

bool AttendVariantExists(int qk_width, int head_block) {
  return Find(qk_width, head_block) != nullptr;
}

bool WgmmaProgramSupported() {
#if defined(SMLA_GPU_CUDA)
  return true;
#else
  return false;
#endif
}

// The largest of the program's builds (the tensor-map ones stage cos / sin rows too).
int64_t WgmmaSharedBytes() { return WgmmaSmem<WgmmaConfig<512, false, true>>::kBytes; }

#if defined(SMLA_GPU_CUDA)
namespace {
// The warpgroup program's builds, kWgmmaPrograms[staged][mapped][grouped]: one row per program,
// or row groups (PairMode::kRowGroups); Q staged by loads, or by its tensor map
// (AttendKernelParams::q_tensor_map); final rows straight out, or through shared memory
// (AttendKernelParams::staged_rows).
using WgmmaRows = WgmmaConfig<512>;
using WgmmaRowsMapped = WgmmaConfig<512, false, true>;
static_assert(WgmmaSmem<WgmmaRows>::kBytes == WgmmaSmem<WgmmaConfig<512, true>>::kBytes &&
                  WgmmaSmem<WgmmaRowsMapped>::kBytes ==
                      WgmmaSmem<WgmmaConfig<512, true, true, true>>::kBytes &&
                  WgmmaSmem<WgmmaRows>::kBytes <= WgmmaSmem<WgmmaRowsMapped>::kBytes,
              "WgmmaSharedBytes covers every build");
using WgmmaKernel = void (*)(AttendKernelParams, QueryTensorMap);
// Each build named where its address is taken, outside any template, so that the device pass
// instantiates it.
template <bool kMapped, bool kGrouped, bool kStaged>
using Wgmma = WgmmaConfig<512, kGrouped, kMapped, kStaged>;
const WgmmaKernel kWgmmaPrograms[2][2][2] = {
    {{&SparseMlaAttendWgmmaKernel<Wgmma<false, false, false>>,
      &SparseMlaAttendWgmmaKernel<Wgmma<false, true, false>>},
     {&SparseMlaAttendWgmmaKernel<Wgmma<true, false, false>>,
      &SparseMlaAttendWgmmaKernel<Wgmma<true, true, false>>}},
    {{&SparseMlaAttendWgmmaKernel<Wgmma<false, false, true>>,
      &SparseMlaAttendWgmmaKernel<Wgmma<false, true, true>>},
     {&SparseMlaAttendWgmmaKernel<Wgmma<true, false, true>>,
      &SparseMlaAttendWgmmaKernel<Wgmma<true, true, true>>}}};
}  // namespace
#endif

absl::Status LaunchAttendWgmma(const AttendKernelParams& p, int64_t shared_bytes,
                               StreamHandle stream) {
#if defined(SMLA_GPU_CUDA)
  const bool grouped = p.paired == static_cast<int32_t>(PairMode::kRowGroups);
  if (p.paired != 0 && !grouped) {
    return absl::InternalError("the warpgroup program groups rows only as PairMode::kRowGroups");
  }
  if (grouped && (p.union_rows < 2 || (p.union_rows << p.row_heads_log2) > 64)) {
    return absl::InternalError("the warpgroup program's row group exceeds its 64 product rows");
  }
  const int64_t units = ProgramUnits(p);
  const int64_t programs = p.whole_units + (units - p.whole_units) * p.head_blocks * p.splits;
  if (programs == 0) return absl::OkStatus();
  // bf16 queries the map can describe come by the tensor copy engine (unless asked not to).
  QueryTensorMap q_map;
  const bool mapped =
      p.q_tensor_map != 0 && p.q_fp8 == 0 &&
      EncodeQueryTensorMap(p.q, int64_t{p.num_rows} * p.num_heads, WgmmaRows::kQkWidth, &q_map);
  const WgmmaKernel kernel = kWgmmaPrograms[p.staged_rows != 0][mapped][grouped];
  return ToStatus(Launch(kernel, dim3(static_cast<unsigned>(programs)), dim3(WgmmaRows::kThreads),
                         static_cast<size_t>(shared_bytes), stream, p, q_map),
                  "warpgroup attention kernel launch");
#else
  return absl::UnimplementedError("no warpgroup attention program in this build");
#endif
}

absl::Status PrepareAttendVariants(int64_t max_bytes) {
  for (const Variant& v : kVariants) {
    SMLA_GPU_RETURN_IF_ERROR(
        SetMaxDynamicSharedBytes(reinterpret_cast<const void*>(v.fn), static_cast<int>(max_bytes)));
  }
#if defined(SMLA_GPU_CUDA)
  for (const auto& by_map : kWgmmaPrograms) {
    for (const auto& pair : by_map) {
      for (const WgmmaKernel fn : pair) {
        SMLA_GPU_RETURN_IF_ERROR(SetMaxDynamicSharedBytes(reinterpret_cast<const void*>(fn),
                                                          static_cast<int>(max_bytes)));
      }
    }
  }
#endif
  for (const DirectVariant& v : kDirectVariants) {
    SMLA_GPU_RETURN_IF_ERROR(
        SetMaxDynamicSharedBytes(reinterpret_cast<const void*>(v.fn), static_cast<int>(max_bytes)));
  }
  return PrepareRowUnion(max_bytes);
}

absl::Status LaunchAttend(const AttendKernelParams& p, int qk_width, int head_block,
                          int64_t shared_bytes, StreamHandle stream) {
  const Variant* v = Find(qk_width, head_block);
  if (v == nullptr) {
    return absl::UnimplementedError(absl::StrCat("no attention kernel for QK width ", qk_width,
                                                 " with ", head_block, "-head programs"));
  }
  const int64_t programs = int64_t{p.num_rows} * p.head_blocks * p.splits;
  if (programs == 0) return absl::OkStatus();
  return ToStatus(Launch(v->fn, dim3(static_cast<unsigned>(programs)), dim3(v->threads),
                         static_cast<size_t>(shared_bytes), stream, p),
                  "attention kernel launch");
}

}  // namespace smla::kernels::gpu
