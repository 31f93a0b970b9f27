// The row-union kernel of paired launches (kernel_params.h, AttendKernelParams::paired): for
// each unit of g = union_rows consecutive rows and each segment, the union of the rows' keys
// with a row mask per entry, written into the unit's own CSR range (the union never exceeds the
// rows together). One program per (unit, segment), one row after another: the first row's
// entries keep their places (mask 1; its sentinels mask 0); in each later row r, the first
// occurrence of a key an earlier row holds sets bit r of that key's first entry, found through a
// shared-memory hash table, and every other valid entry is appended in row order with bit r (and
// entered in the table for the rows after); sentinels past the first row are dropped. Every
// occurrence of a key in a row stays one entry with that row's bit (duplicated ids keep their
// multiplicity), and the result does not depend on thread timing, so runs are bitwise
// reproducible. The table keeps each first entry's rows so far, so a row adds its bit with a
// store rather than a read of global memory.
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
constexpr int kEntryBits = 11;  // an entry's index within its row, in a claim
static_assert(kUnionMaxRow % kUnionThreads == 0, "whole entries per thread");
static_assert(kUnionMaxRow <= (1 << kEntryBits) && kMaxUnionRows <= (1 << (30 - kEntryBits)),
              "claims fit an int");
static_assert((1 << kMaxUnionBits) >= kUnionSlotsPerKey * kUnionMaxRow,
              "kMaxUnionBits covers the longest row");

// The smallest table of at least `entries` entries (64 or more) within the launch's table.
__device__ __forceinline__ int TableBits(int entries, int max_bits) {
  int bits = 6;
  while (bits < max_bits && (1 << bits) < entries) ++bits;
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

// Enters `slot` with its union entry `at` (a key entered twice keeps its first entry); returns
// its table entry.
__device__ __forceinline__ int Enter(int32_t* keys, int32_t* first, int32_t slot, int at,
                                     int bits) {
  uint32_t h = UnionHash(slot, bits);
  while (true) {
    const int32_t prev = atomicCAS(&keys[h], -1, slot);
    if (prev == -1 || prev == slot) {
      atomicMin(&first[h], at);
      return static_cast<int>(h);
    }
    h = (h + 1) & ((1u << bits) - 1);
  }
}

// Row r's claim on a key for its entry i: a later row's claims are larger than an earlier
// one's, and within a row the first entry's is the largest.
__device__ __forceinline__ int32_t Claim(int r, int i) {
  return (r << kEntryBits) | ((1 << kEntryBits) - 1 - i);
}

// Row r's ids, entry k of this thread at threadIdx.x + k kUnionThreads (-1 past the row), so
// short rows still spread over every thread.
__device__ __forceinline__ void LoadRow(const int32_t* row, int len, int32_t (&ids)[kUnionPer]) {
#pragma unroll
  for (int k = 0; k < kUnionPer; ++k) {
    const int i = threadIdx.x + k * kUnionThreads;
    ids[k] = i < len ? row[i] : -1;
  }
}

// kRows: the rows per unit when fixed at compile time (pairs, the common case: straight-line
// code), 0 for AttendKernelParams::union_rows.
template <int kRows>
__global__ void __launch_bounds__(kUnionThreads)
    RowUnionKernel(const __grid_constant__ AttendKernelParams p) {
  EnterGrid();  // grid_order.h: before any access to memory
  // The hash table (RowUnionSharedBytes): keys, each key's first union entry, the largest claim
  // on it (Claim), and the rows that attend that entry so far (its mask).
  extern __shared__ int32_t table[];
  int32_t* keys = table;
  int32_t* first = table + (1 << p.union_bits);
  int32_t* claim = table + 2 * (1 << p.union_bits);
  uint8_t* rows_of = reinterpret_cast<uint8_t*>(table + 3 * (1 << p.union_bits));
  __shared__ int warp_count[kUnionPer][kUnionWarps];  // appended entries per round and warp
  __shared__ int bound[kMaxUnionRows + 1];            // the unit's indptr, from its first row's
  const SegmentArgs& s = p.seg[blockIdx.y];
  const int g = kRows > 0 ? kRows : p.union_rows;
  const int unit = blockIdx.x;
  const int tid = threadIdx.x;
  if (tid <= g) bound[tid] = s.indptr[unit * g + tid];
  __syncthreads();
  const int a0 = bound[0];
  int longest = 0;
  for (int r = 0; r < g; ++r) longest = max(longest, bound[r + 1] - bound[r]);
  // Keys the table may hold: those of every row but the last.
  const int held = bound[g - 1] - a0;
  int32_t* ui = s.union_indices + a0;
  uint8_t* um = s.union_mask + a0;
  const int32_t* src = s.indices + a0;
  if (longest > kUnionMaxRow || 2 * held > (1 << p.union_bits)) {
    // Too long for the table: the concatenation (each entry its own row's).
    for (int r = 0; r < g; ++r) {
      for (int i = bound[r] - a0 + threadIdx.x; i < bound[r + 1] - a0; i += kUnionThreads) {
        const int32_t slot = src[i];
        ui[i] = slot;
        um[i] = slot >= 0 && slot < s.num_slots ? (1 << r) : 0;
      }
    }
    if (threadIdx.x == 0) s.union_count[unit] = bound[g] - a0;
    return;
  }
  // The first two rows' ids in one round trip; each later row's while the row before it is
  // merged.
  const int la = bound[1] - a0;
  int32_t a[kUnionPer], next[kUnionPer];
  LoadRow(src, la, a);
  LoadRow(src + la, bound[2] - bound[1], next);
  const int bits = TableBits(max(kUnionSlotsPerKey * longest, 2 * held), p.union_bits);
  for (int i = threadIdx.x; i < (1 << bits); i += kUnionThreads) {
    keys[i] = -1;
    first[i] = kNone;
    claim[i] = -1;
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
    if (ok) rows_of[Enter(keys, first, a[k], i, bits)] = 1;
  }
  __syncthreads();
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const LaneMask below = (LaneMask{1} << lane) - 1;
  int base = la;  // union entries so far
  for (int r = 1; r < g; ++r) {
    const int lb = bound[r + 1] - bound[r];
    const int rounds = (lb + kUnionThreads - 1) / kUnionThreads;
    int32_t b[kUnionPer];
#pragma unroll
    for (int k = 0; k < kUnionPer; ++k) b[k] = next[k];
    if (r + 1 < g) LoadRow(src + (bound[r + 1] - a0), bound[r + 2] - bound[r + 1], next);
    int at[kUnionPer];  // the table entry of the key, -1 = not held or no valid slot
#pragma unroll
    for (int k = 0; k < kUnionPer; ++k) {
      const int j = threadIdx.x + k * kUnionThreads;
      at[k] = -1;
      if (j < lb && b[k] >= 0 && b[k] < s.num_slots) {
        at[k] = FindSlot(keys, b[k], bits);
        if (at[k] >= 0) atomicMax(&claim[at[k]], Claim(r, j));
      }
    }
    __syncthreads();
    // The first occurrence of a held key adds row r to its first entry's mask; every other valid
    // entry is appended, at its rank among the appended entries (per round of kUnionThreads
    // entries: the rounds before, the warps before, the lanes below).
    LaneMask ballot[kUnionPer];
#pragma unroll
    for (int k = 0; k < kUnionPer; ++k) {
      ballot[k] = 0;
      if (k >= rounds) break;
      const int j = threadIdx.x + k * kUnionThreads;
      bool append = false;
      if (j < lb && b[k] >= 0 && b[k] < s.num_slots) {
        if (at[k] >= 0 && claim[at[k]] == Claim(r, j)) {
          // The entry's rows so far are in the table: a store, not a read of global memory.
          const auto rows = static_cast<uint8_t>(rows_of[at[k]] | (1 << r));
          rows_of[at[k]] = rows;
          um[first[at[k]]] = rows;
        } else {
          append = true;
        }
      }
      ballot[k] = WarpBallot(append);
      if (lane == 0) warp_count[k][warp] = __popcll(static_cast<unsigned long long>(ballot[k]));
    }
    __syncthreads();
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
        um[to] = static_cast<uint8_t>(1 << r);
        // A key no earlier row holds is entered for the rows after, with this row alone.
        if (r + 1 < g && at[k] < 0) rows_of[Enter(keys, first, b[k], to, bits)] = 1 << r;
      }
      base += total;
    }
    __syncthreads();  // the table and warp_count, before the next row
  }
  if (threadIdx.x == 0) s.union_count[unit] = base;
}

}  // namespace

bool RowPairsSupported() {
#if defined(__HIP__) || defined(SMLA_WITH_HIP)
  return false;
#else
  return true;
#endif
}

int64_t RowUnionSharedBytes(int union_bits) { return int64_t{13} << union_bits; }

absl::Status PrepareRowUnion(int64_t max_bytes) {
  // The largest table that fits beside the kernel's static shared memory (the plan asks for no
  // more than RowUnionSharedBytes allows within the per-block limit).
  const int64_t bytes = std::min(max_bytes - 1024, RowUnionSharedBytes(kMaxUnionBits));
  for (const void* fn : {reinterpret_cast<const void*>(&RowUnionKernel<2>),
                         reinterpret_cast<const void*>(&RowUnionKernel<0>)}) {
    if (absl::Status st = ToStatus(SetMaxDynamicSharedBytes(fn, static_cast<int>(bytes)),
                                   "row-union kernel shared memory");
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status LaunchRowUnion(const AttendKernelParams& p, StreamHandle stream) {
  if (p.union_rows < 2 || p.union_rows > kMaxUnionRows) {
    return absl::InternalError("row-union kernel: rows per unit out of range");
  }
  const int64_t units = ProgramUnits(p);
  if (units == 0) return absl::OkStatus();
  const auto bytes = static_cast<size_t>(RowUnionSharedBytes(p.union_bits));
  return ToStatus(Launch(p.union_rows == 2 ? &RowUnionKernel<2> : &RowUnionKernel<0>,
                         dim3(static_cast<unsigned>(units), static_cast<unsigned>(p.num_segments)),
                         dim3(kUnionThreads), bytes, stream, p),
                  "row-union kernel launch");
}

}  // namespace smla::kernels::gpu
