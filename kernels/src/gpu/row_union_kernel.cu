// The row-union kernel of paired launches (kernel_params.h, AttendKernelParams::paired): for
// each pair of rows (2i, 2i+1) and each segment, the union of the two rows' keys with a row
// mask per entry, written into the pair's own CSR range indptr[2i] .. indptr[2i+2] of the
// workspace (the union never exceeds the two rows together). One program per (pair, segment):
// row 2i's entries keep their places (mask 1; its sentinels mask 0); the first occurrence of a
// key in row 2i+1 marks the first occurrence of that key in row 2i (mask 3) through a
// shared-memory hash table, and every other valid entry of row 2i+1 is appended in row order
// (mask 2); row 2i+1's sentinels are dropped. Every occurrence of a key in a row stays one
// entry with that row's bit (duplicated ids keep their multiplicity), and the result does not
// depend on thread timing, so runs are bitwise reproducible.
#include <cstdint>

#include "gpu/kernel_params.h"
#include "smla/kernels/gpu/primitives.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kUnionThreads = 256;
constexpr int kUnionWarps = kUnionThreads / kWarpSize;
constexpr int kUnionTable = 2 * kUnionMaxRow;  // entries (a power of two): load <= 1/2
constexpr int32_t kNone = 0x7fffffff;
static_assert((kUnionTable & (kUnionTable - 1)) == 0, "the table size is a power of two");

__device__ __forceinline__ uint32_t UnionHash(int32_t slot) {
  return (static_cast<uint32_t>(slot) * 0x9E3779B1u) >> 20;  // 12 bits
}
static_assert(kUnionTable == 4096, "UnionHash yields 12 bits");

// The table entry holding `slot`, or -1.
__device__ __forceinline__ int FindSlot(const int32_t* keys, int32_t slot) {
  uint32_t h = UnionHash(slot);
  while (true) {
    const int32_t k = keys[h];
    if (k == slot) return static_cast<int>(h);
    if (k == -1) return -1;
    h = (h + 1) & (kUnionTable - 1);
  }
}

__global__ void __launch_bounds__(kUnionThreads)
    RowUnionKernel(const __grid_constant__ AttendKernelParams p) {
  __shared__ int32_t keys[kUnionTable];
  __shared__ int32_t first_a[kUnionTable];  // first entry of row 2i with the key
  __shared__ int32_t first_b[kUnionTable];  // first entry of row 2i+1 with the key
  __shared__ int32_t warp_count[kUnionWarps];
  const SegmentArgs& s = p.seg[blockIdx.y];
  const int pair = blockIdx.x;
  const int a0 = s.indptr[2 * pair];
  const int a1 = s.indptr[2 * pair + 1];
  const int b1 = s.indptr[2 * pair + 2];
  const int la = a1 - a0;
  const int lb = b1 - a1;
  int32_t* ui = s.union_indices + a0;
  uint8_t* um = s.union_mask + a0;
  const int32_t* src = s.indices + a0;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (la > kUnionMaxRow) {
    // Too long for the table: the concatenation (each entry its own row's).
    for (int i = threadIdx.x; i < la + lb; i += kUnionThreads) {
      const int32_t slot = src[i];
      const bool ok = slot >= 0 && slot < s.num_slots;
      ui[i] = slot;
      um[i] = ok ? (i < la ? 1 : 2) : 0;
    }
    if (threadIdx.x == 0) s.union_count[pair] = la + lb;
    return;
  }
  for (int i = threadIdx.x; i < kUnionTable; i += kUnionThreads) {
    keys[i] = -1;
    first_a[i] = kNone;
    first_b[i] = kNone;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < la; i += kUnionThreads) {
    const int32_t slot = src[i];
    const bool ok = slot >= 0 && slot < s.num_slots;
    ui[i] = slot;
    um[i] = ok ? 1 : 0;
    if (!ok) continue;
    uint32_t h = UnionHash(slot);
    while (true) {
      const int32_t prev = atomicCAS(&keys[h], -1, slot);
      if (prev == -1 || prev == slot) {
        atomicMin(&first_a[h], i);
        break;
      }
      h = (h + 1) & (kUnionTable - 1);
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < lb; j += kUnionThreads) {
    const int32_t slot = src[la + j];
    if (slot < 0 || slot >= s.num_slots) continue;
    const int h = FindSlot(keys, slot);
    if (h >= 0) atomicMin(&first_b[h], j);
  }
  __syncthreads();
  // Row 2i+1 in order: merge or append (positions by a block-wide prefix count per round).
  int appended = 0;
  for (int j0 = 0; j0 < lb; j0 += kUnionThreads) {
    const int j = j0 + threadIdx.x;
    bool append = false;
    int32_t slot = -1;
    if (j < lb) {
      slot = src[la + j];
      if (slot >= 0 && slot < s.num_slots) {
        const int h = FindSlot(keys, slot);
        if (h >= 0 && first_b[h] == j) {
          um[first_a[h]] = 3;
        } else {
          append = true;
        }
      }
    }
    const LaneMask ballot = WarpBallot(append);
    if (lane == 0) warp_count[warp] = __popcll(static_cast<unsigned long long>(ballot));
    __syncthreads();
    int before = appended;
    for (int w = 0; w < warp; ++w) before += warp_count[w];
    int total = appended;
    for (int w = 0; w < kUnionWarps; ++w) total += warp_count[w];
    if (append) {
      const LaneMask below = (LaneMask{1} << lane) - 1;
      const int at = la + before + __popcll(static_cast<unsigned long long>(ballot & below));
      ui[at] = slot;
      um[at] = 2;
    }
    appended = total;
    __syncthreads();  // warp_count is reused
  }
  if (threadIdx.x == 0) s.union_count[pair] = la + appended;
}

}  // namespace

bool RowPairsSupported() {
#if defined(__HIP__) || defined(SMLA_WITH_HIP)
  return false;
#else
  return true;
#endif
}

absl::Status LaunchRowUnion(const AttendKernelParams& p, StreamHandle stream) {
  const int pairs = p.num_rows / 2;
  if (pairs == 0) return absl::OkStatus();
  RowUnionKernel<<<dim3(static_cast<unsigned>(pairs), static_cast<unsigned>(p.num_segments)),
                   kUnionThreads, 0, stream>>>(p);
  return ToStatus(GetLastError(), "row-union kernel launch");
}

}  // namespace smla::kernels::gpu
