// Split-K combine (docs/operator.md section 5) with the epilogue fused into its store: one program
// per (row, head), 128 threads of 4 output lanes each.
#include <cstdint>

#include "gpu/grid_order.h"
#include "gpu/kernel_params.h"
#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/mxfp8.h"
#include "smla/kernels/epilogue.h"
#include "smla/kernels/gpu/primitives.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kCombineThreads = kValueWidth / 4;
static_assert(kMxGroup / 4 == 8, "an MXFP8 group spans 8 threads of the combine");

__global__ void __launch_bounds__(kCombineThreads)
    CombineKernel(const __grid_constant__ CombineKernelParams p) {
  EnterGrid();                    // grid_order.h: before any access to memory
  const int64_t rh = blockIdx.x;  // row * H + head
  const int row = static_cast<int>(rh / p.num_heads);
  const int head = static_cast<int>(rh % p.num_heads);
  const int col = 4 * threadIdx.x;
  const float* ml = p.part_ml + rh * p.splits * 2;
  const float* acc = p.part_acc + rh * p.splits * kValueWidth;

  const bool has_sink = p.sink != nullptr;
  const float sink2 = has_sink ? p.sink[head] * kLog2e : -INFINITY;
  float m = has_sink ? sink2 : -INFINITY;
  for (int s = 0; s < p.splits; ++s) m = fmaxf(m, ml[2 * s]);
  float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float lse = -INFINITY;
  if (m != -INFINITY) {
    float z = has_sink ? exp2f(sink2 - m) : 0.0f;
    for (int s = 0; s < p.splits; ++s) {
      if (ml[2 * s] == -INFINITY) continue;
      const float w = exp2f(ml[2 * s] - m);
      z += ml[2 * s + 1] * w;
      const float4 a = *reinterpret_cast<const float4*>(acc + s * kValueWidth + col);
      x[0] += a.x * w;
      x[1] += a.y * w;
      x[2] += a.z * w;
      x[3] += a.w * w;
    }
    const float inv = 1.0f / z;
    for (int i = 0; i < 4; ++i) x[i] = x[i] * inv + 0.0f;
    lse = (m + log2f(z)) * kLn2;
  }
  for (int i = 0; i < 4; ++i) x[i] = RoundToBf16Fast(x[i]);
  if (p.positions != nullptr && col >= kNopeWidth) {
    const float* cs = p.cos_sin + int64_t{p.positions[row]} * 64;
    for (int i = 0; i < 4; i += 2) {
      const int k = (col + i - kNopeWidth) / 2;
      const float c = cs[k], sn = cs[32 + k];
      const float e = x[i], o = x[i + 1];
      // + 0 turns the -0 a rotation of zeros can give into +0 (empty rows are exactly +0).
      x[i] = (e * c + o * sn) + 0.0f;
      x[i + 1] = (o * c - e * sn) + 0.0f;
    }
  }
  if (!p.out_mxfp8) {
    uint2 v = make_uint2(PackBf16(x[0], x[1]), PackBf16(x[2], x[3]));
    *reinterpret_cast<uint2*>(p.out_bf16 + rh * kValueWidth + col) = v;
  } else {
    float amax = fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3])));
    amax = WarpXorMax(amax, 1);
    amax = WarpXorMax(amax, 2);
    amax = WarpXorMax(amax, 4);
    const uint8_t sb = MxScaleByte(amax);
    const float inv_scale = Pow2(127 - static_cast<int>(sb));
    const uint32_t codes = MxEncodePair(x[0], x[1], inv_scale) |
                           (static_cast<uint32_t>(MxEncodePair(x[2], x[3], inv_scale)) << 16);
    *reinterpret_cast<uint32_t*>(p.mx_data + rh * kValueWidth + col) = codes;
    if (threadIdx.x % 8 == 0) p.mx_scales[rh * kMxGroupsPerHead + col / kMxGroup] = sb;
  }
  if (threadIdx.x == 0 && p.lse != nullptr) p.lse[rh] = lse;
}

}  // namespace

absl::Status LaunchCombine(const CombineKernelParams& p, StreamHandle stream) {
  const int64_t blocks = int64_t{p.num_rows} * p.num_heads;
  if (blocks == 0) return absl::OkStatus();
  return ToStatus(Launch(CombineKernel, dim3(static_cast<unsigned>(blocks)), dim3(kCombineThreads),
                         0, stream, p),
                  "combine kernel launch");
}

}  // namespace smla::kernels::gpu
