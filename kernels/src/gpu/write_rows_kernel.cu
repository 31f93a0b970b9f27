// Row writers (docs/operator.md section 3, "Writing rows"): one block of kRowThreads threads
// quantises one bf16 row into the pool. Each scale group's amax is reduced across the block (a
// maximum, so the order does not change it) and every value is encoded with the same helpers
// EncodeRow uses on the CPU, so both backends write identical bytes. A thread per row (the
// earlier form) read its row one value at a time and left the GPU idle for most of a batch.
#include <cstdint>
#include <cstring>

#include "gpu/kernel_params.h"
#include "smla/kernels/codec/row_codec.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kRowThreads = 64;
static_assert((kRowThreads & (kRowThreads - 1)) == 0, "the amax reduction halves kRowThreads");

// The larger of two partial maxima; neither is NaN (each starts at EncodeRow's floor and skips
// NaN the way its serial loop does).
__device__ __forceinline__ float Larger(float a, float b) { return b > a ? b : a; }

__global__ void __launch_bounds__(kRowThreads)
    WriteRowsKernel(const __grid_constant__ WriteRowsKernelParams p) {
  __shared__ float amax_s[kRowThreads];
  const int t = threadIdx.x;
  const auto f = static_cast<KvFormat>(p.format);
  const auto g = static_cast<Geometry>(p.geometry);
  const int width = QkWidth(g);
  // The format is the same for every block, so every thread takes the same branches and
  // reaches the same barriers.
  for (int64_t r = blockIdx.x; r < p.num_rows; r += gridDim.x) {
    if (p.groups != nullptr && p.group_flags[p.groups[r]] != 0) continue;  // the block alike
    const int64_t slot = p.slots[r];
    const uint16_t* in = p.rows + r * width;
    uint8_t* data = p.base + SlotDataOffset(f, g, slot, p.rows_per_page, p.pitch);
    if (f == KvFormat::kBf16) {
      uint16_t* out = reinterpret_cast<uint16_t*>(data);
      for (int i = t; i < width; i += kRowThreads) out[i] = in[i];
      continue;
    }
    if (f == KvFormat::kFp8PerTensor) {
      for (int i = t; i < width; i += kRowThreads) {
        float v = Bf16BitsToF32(in[i]) / p.scale;
        v = v > kE4m3Max ? kE4m3Max : (v < -kE4m3Max ? -kE4m3Max : v);
        data[i] = EncodeE4m3(v);
      }
      continue;
    }
    const bool dsv4 = f == KvFormat::kFp8Dsv4;
    uint8_t* rec = dsv4 ? p.base + SlotScaleOffset(slot, p.rows_per_page, p.pitch) : nullptr;
    const int group = dsv4 ? 64 : 128;
    const int groups = dsv4 ? kDsv4Groups : kDsMlaGroups;
    const int quantised = group * groups;  // 448 or 512
    for (int gi = 0; gi < groups; ++gi) {
      const uint16_t* gin = in + gi * group;
      float a = 1e-4f;
      for (int i = t; i < group; i += kRowThreads) a = Larger(a, AbsF(Bf16BitsToF32(gin[i])));
      amax_s[t] = a;
      __syncthreads();
      for (int s = kRowThreads / 2; s > 0; s >>= 1) {
        if (t < s) amax_s[t] = Larger(amax_s[t], amax_s[t + s]);
        __syncthreads();
      }
      const float amax = amax_s[0];
      __syncthreads();  // amax_s is rewritten by the next group
      const int e = CeilLog2Over448(amax);
      const float inv = Pow2(-e);
      for (int i = t; i < group; i += kRowThreads) {
        float v = Bf16BitsToF32(gin[i]) * inv;
        v = v > kE4m3Max ? kE4m3Max : (v < -kE4m3Max ? -kE4m3Max : v);
        data[gi * group + i] = EncodeE4m3(v);
      }
      if (t == 0) {
        if (dsv4) {
          rec[gi] = E8m0FromExponent(e);
        } else {
          const float s = Pow2(e);
          memcpy(data + 512 + 4 * gi, &s, 4);
        }
      }
    }
    if (dsv4 && t == 0) rec[7] = 0;
    // The 64 rope values are copied as bf16 after the quantised part (at 448 or 528 bytes).
    uint8_t* rope = data + (dsv4 ? kNopeWidth : 512 + 16);
    for (int i = t; i < kRopeWidth; i += kRowThreads) memcpy(rope + 2 * i, in + quantised + i, 2);
  }
}

}  // namespace

absl::Status LaunchWriteRows(const WriteRowsKernelParams& p, StreamHandle stream) {
  if (p.num_rows == 0) return absl::OkStatus();
  const int64_t blocks = p.num_rows < (int64_t{1} << 20) ? p.num_rows : (int64_t{1} << 20);
  WriteRowsKernel<<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(p);
  return ToStatus(GetLastError(), "write-rows kernel launch");
}

}  // namespace smla::kernels::gpu
