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
#include <algorithm>
#include <cstdint>

#include "gpu/grid_order.h"
#include "gpu/kernel_params.h"
#include "smla/kernels/gpu/primitives.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kUnionThreads = 256;
constexpr int kUnionWarps = kUnionThreads / kWarpSize;
constexpr int kUnionPer = kUnionMaxRow / kUnionThreads;  // entries of a row per thread
constexpr int32_t kNone = 0x7fffffff;
static_assert(kUnionMaxRow % kUnionThreads == 0, "whole entries per thread");
static_assert((1 << kMaxUnionBits) >= kUnionSlotsPerKey * kUnionMaxRow,
              "kMaxUnionBits covers the longest row");

// A table of 2^bits entries, kUnionSlotsPerKey per key of row 2i where the launch's table allows.
__device__ __forceinline__ int TableBits(int la, int max_bits) {
  int bits = 6;
  while (bits < max_bits && (1 << bits) < kUnionSlotsPerKey * la) ++bits;
  return bits;
}

__device__ __forceinline__ uint32_t UnionHash(int32_t slot, int bits) {
  return (static_cast<uint32_t>(slot) * 0x9E3779B1u) >> (32 - bits);
}

// The table entry holding `slot`, or -1.
__device__ __forceinline__ int FindSlot(const int32_t* keys, int32_t slot, int bits) {
  uint32_t h = UnionHash(slot, bits);
  while (true) {
    const int32_t k = keys[h];
    if (k == slot) return static_cast<int>(h);
    if (k == -1) return -1;
    h = (h + 1) & ((1u << bits) - 1);
  }
}

__global__ void __launch_bounds__(kUnionThreads)
    RowUnionKernel(const __grid_constant__ AttendKernelParams p) {
  EnterGrid();  // grid_order.h: before any access to memory
  // The hash table (RowUnionSharedBytes): keys, then the first entry of row 2i and of row 2i+1
  // with each key.
  extern __shared__ int32_t table[];
  int32_t* keys = table;
  int32_t* first_a = table + (1 << p.union_bits);
  int32_t* first_b = table + 2 * (1 << p.union_bits);
  __shared__ int warp_count[kUnionPer][kUnionWarps];  // appended entries per round and warp
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
  if (la > kUnionMaxRow || lb > kUnionMaxRow) {
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
  // Both rows' ids are loaded first (one round trip); entry k of a thread is entry
  // threadIdx.x + k kUnionThreads of its row, so short rows still spread over every thread.
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  int32_t a[kUnionPer], b[kUnionPer];
#pragma unroll
  for (int k = 0; k < kUnionPer; ++k) {
    const int i = threadIdx.x + k * kUnionThreads;
    a[k] = i < la ? src[i] : -1;
    b[k] = i < lb ? src[la + i] : -1;
  }
  const int bits = TableBits(la, p.union_bits);
  for (int i = threadIdx.x; i < (1 << bits); i += kUnionThreads) {
    keys[i] = -1;
    first_a[i] = kNone;
    first_b[i] = kNone;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kUnionPer; ++k) {
    const int i = threadIdx.x + k * kUnionThreads;
    if (k * kUnionThreads >= la) break;
    if (i >= la) continue;
    const bool ok = a[k] >= 0 && a[k] < s.num_slots;
    ui[i] = a[k];
    um[i] = ok ? 1 : 0;
    if (!ok) continue;
    uint32_t h = UnionHash(a[k], bits);
    while (true) {
      const int32_t prev = atomicCAS(&keys[h], -1, a[k]);
      if (prev == -1 || prev == a[k]) {
        atomicMin(&first_a[h], i);
        break;
      }
      h = (h + 1) & ((1u << bits) - 1);
    }
  }
  __syncthreads();
  int at[kUnionPer];  // the table entry of row 2i+1's key, -1 = not in row 2i or no valid slot
#pragma unroll
  for (int k = 0; k < kUnionPer; ++k) {
    const int j = threadIdx.x + k * kUnionThreads;
    at[k] = -1;
    if (j < lb && b[k] >= 0 && b[k] < s.num_slots) {
      at[k] = FindSlot(keys, b[k], bits);
      if (at[k] >= 0) atomicMin(&first_b[at[k]], j);
    }
  }
  __syncthreads();
  // Row 2i+1 in order: the first occurrence of a key of row 2i marks that key's first entry in
  // row 2i; every other valid entry is appended, at its rank among the appended entries (per
  // round of kUnionThreads entries: the rounds before, the warps before, the lanes below).
  LaneMask ballot[kUnionPer];
  const int rounds = (lb + kUnionThreads - 1) / kUnionThreads;
#pragma unroll
  for (int k = 0; k < kUnionPer; ++k) {
    ballot[k] = 0;
    if (k >= rounds) break;
    const int j = threadIdx.x + k * kUnionThreads;
    bool append = false;
    if (j < lb && b[k] >= 0 && b[k] < s.num_slots) {
      if (at[k] >= 0 && first_b[at[k]] == j) {
        um[first_a[at[k]]] = 3;
      } else {
        append = true;
      }
    }
    ballot[k] = WarpBallot(append);
    if (lane == 0) warp_count[k][warp] = __popcll(static_cast<unsigned long long>(ballot[k]));
  }
  __syncthreads();
  int base = la;
  const LaneMask below = (LaneMask{1} << lane) - 1;
#pragma unroll
  for (int k = 0; k < kUnionPer; ++k) {
    if (k >= rounds) break;
    int before = 0, total = 0;
#pragma unroll
    for (int w = 0; w < kUnionWarps; ++w) {
      before += w < warp ? warp_count[k][w] : 0;
      total += warp_count[k][w];
    }
    if ((ballot[k] >> lane) & 1) {
      const int to = base + before + __popcll(static_cast<unsigned long long>(ballot[k] & below));
      ui[to] = b[k];
      um[to] = 2;
    }
    base += total;
  }
  if (threadIdx.x == 0) s.union_count[pair] = base;
}

}  // namespace

bool RowPairsSupported() {
#if defined(__HIP__) || defined(SMLA_WITH_HIP)
  return false;
#else
  return true;
#endif
}

int64_t RowUnionSharedBytes(int union_bits) { return int64_t{3} * 4 << union_bits; }

absl::Status PrepareRowUnion(int64_t max_bytes) {
  // The largest table that fits beside the kernel's static shared memory (the plan asks for no
  // more than RowUnionSharedBytes allows within the per-block limit).
  const int64_t bytes = std::min(max_bytes - 1024, RowUnionSharedBytes(kMaxUnionBits));
  return ToStatus(SetMaxDynamicSharedBytes(reinterpret_cast<const void*>(&RowUnionKernel),
                                           static_cast<int>(bytes)),
                  "row-union kernel shared memory");
}

absl::Status LaunchRowUnion(const AttendKernelParams& p, StreamHandle stream) {
  const int pairs = p.num_rows / 2;
  if (pairs == 0) return absl::OkStatus();
  const auto bytes = static_cast<size_t>(RowUnionSharedBytes(p.union_bits));
  return ToStatus(Launch(RowUnionKernel,
                         dim3(static_cast<unsigned>(pairs), static_cast<unsigned>(p.num_segments)),
                         dim3(kUnionThreads), bytes, stream, p),
                  "row-union kernel launch");
}

}  // namespace smla::kernels::gpu
