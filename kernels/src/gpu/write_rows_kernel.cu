// Row writers (docs/operator.md section 3, "Writing rows"): one block of kRowThreads threads
// quantises one bf16 row into the pool. Each scale group's amax is reduced across the block (a
// maximum, so the order does not change it) and every value is encoded with the same helpers
// EncodeRow uses on the CPU, so both backends write identical bytes. Thread t holds value t of
// every 64-value chunk of the row: the row's loads are all in flight at once and one barrier
// publishes every chunk's maximum (a group at a time chained seven load-reduce rounds, most of
// the kernel's time on a small launch). The row is loaded before its step's flag is known, so
// that the flag's two dependent loads overlap the row's.
#include <cstdint>
#include <cstring>

#include "gpu/grid_order.h"
#include "gpu/kernel_params.h"
#include "smla/kernels/codec/row_codec.h"
#include "smla/kernels/gpu/primitives.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kRowThreads = 64;
constexpr int kChunks = 512 / kRowThreads;  // a quantised part holds 448 or 512 values
constexpr int kSubgroup = 32;  // lanes of one shuffle reduction: a warp, half a gfx950 wavefront
constexpr int kSubgroups = kRowThreads / kSubgroup;
static_assert(64 % kRowThreads == 0, "a chunk lies in one scale group (of 64 or 128 values)");

// The larger of a and b, keeping a when b is NaN, as EncodeRow's serial loop does.
__device__ __forceinline__ float Larger(float a, float b) { return b > a ? b : a; }

__global__ void __launch_bounds__(kRowThreads)
    WriteRowsKernel(const __grid_constant__ WriteRowsKernelParams p) {
  EnterGrid();  // grid_order.h: before any access to memory
  __shared__ float amax_s[kSubgroups][kChunks];
  const int t = threadIdx.x;
  const auto f = static_cast<KvFormat>(p.format);
  const auto g = static_cast<Geometry>(p.geometry);
  const int width = QkWidth(g);
  // The flags are final (the checks ran before this kernel): the first block hands them to the
  // host, so that no copy has to follow the attention for them.
  if (blockIdx.x == 0) {
    for (int i = t; i < p.num_flags; i += kRowThreads) p.flags_out[i] = p.group_flags[i];
  }
  // The format is the same for every block, so every thread takes the same branches and
  // reaches the same barriers.
  for (int64_t r = blockIdx.x; r < p.num_rows; r += gridDim.x) {
    // A flagged step writes nothing; the flag is the block's alike.
    const bool skip = p.groups != nullptr && p.group_flags[p.groups[r]] != 0;
    const int64_t slot = p.slots[r];
    const uint16_t* in = p.rows + r * width;
    uint8_t* data = p.base + SlotDataOffset(f, g, slot, p.rows_per_page, p.pitch);
    if (f == KvFormat::kBf16) {
      if (skip) continue;
      uint16_t* out = reinterpret_cast<uint16_t*>(data);
      for (int i = t; i < width; i += kRowThreads) out[i] = in[i];
      continue;
    }
    if (f == KvFormat::kFp8PerTensor) {
      if (skip) continue;
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
    const int chunks = quantised / kRowThreads;
    const int per_group = group / kRowThreads;  // chunks per scale group: 1 or 2
    float x[kChunks];
#pragma unroll
    for (int k = 0; k < kChunks; ++k)
      x[k] = k < chunks ? Bf16BitsToF32(in[k * kRowThreads + t]) : 0.0f;
    if (skip) continue;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      // EncodeRow's floor, NaN skipped; partial maxima are never NaN, so fmaxf combines them.
      float a = Larger(1e-4f, AbsF(x[k]));
      for (int m = kSubgroup / 2; m > 0; m >>= 1) a = WarpXorMax(a, m);
      if (t % kSubgroup == 0) amax_s[t / kSubgroup][k] = a;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      if (k >= chunks) continue;
      const int gi = k / per_group;
      float amax = 1e-4f;
      for (int j = gi * per_group; j < (gi + 1) * per_group; ++j) {
        for (int h = 0; h < kSubgroups; ++h) amax = Larger(amax, amax_s[h][j]);
      }
      const int e = CeilLog2Over448(amax);
      float v = x[k] * Pow2(-e);
      v = v > kE4m3Max ? kE4m3Max : (v < -kE4m3Max ? -kE4m3Max : v);
      data[k * kRowThreads + t] = EncodeE4m3(v);
      if (t == 0 && k % per_group == 0) {
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
    __syncthreads();  // amax_s is rewritten by the block's next row
  }
}

}  // namespace

absl::Status LaunchWriteRows(const WriteRowsKernelParams& p, StreamHandle stream) {
  if (p.num_rows == 0) return absl::OkStatus();
  const int64_t blocks = p.num_rows < (int64_t{1} << 20) ? p.num_rows : (int64_t{1} << 20);
  return ToStatus(
      Launch(WriteRowsKernel, dim3(static_cast<unsigned>(blocks)), dim3(kRowThreads), 0, stream, p),
      "write-rows kernel launch");
}

}  // namespace smla::kernels::gpu
