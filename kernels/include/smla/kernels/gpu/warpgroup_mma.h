// The warpgroup product of sm_90a (wgmma): four warps (128 threads) multiply a 64-row A tile by an
// N-row B tile, both in shared memory and named by descriptors, into f32 accumulators held across
// the warpgroup, asynchronously. This is the product core a compute-dense attention program is
// written against on Hopper (gfx950 keeps the MFMA core of mma_tile.h).
//
// Operand layout (the "no swizzle" canonical layout of the PTX ISA): a tile of R rows by K bf16
// values per row, K-major (a row's values contiguous in K, as Q rows and K-cache rows lie), is
// stored as core matrices of 8 rows x 8 values (16 bytes a row, 128 bytes each, contiguous);
// core (r / 8, k / 8) starts at ((r / 8) * (K / 8) + k / 8) * 128 bytes. So cores adjacent in K
// are 128 bytes apart (the descriptor's leading-dimension offset) and cores adjacent in rows
// K / 8 * 128 bytes (its stride-dimension offset); k-step s of 16 values starts 256 * s bytes in.
//
// The B operand of P.V, the value rows (keys along K, values along N, each key's values
// contiguous: MN-major), is read transposed. Its cores hold 8 keys x 8 values, a key's 8 values
// in 16 bytes, the bytes of a K-major core of the key rows: so the gathered key tile of Q.K^T,
// stored as above with the keys as rows, serves P.V as it lies, with the two offsets exchanged
// (cores adjacent in K, the keys, are D / 8 * 128 bytes apart; adjacent in N, the values, 128:
// SharedKvDescriptor), as MLA's values are the first 512 lanes of its key rows. A V tile of its
// own may instead keep a value-column's cores together (TileOffsetMn, KMajorDescriptor).
// An A operand from registers (P after the softmax) is four 32-bit registers a lane: bf16 pairs
// at (row, k) = (r, 2c), (r + 8, 2c), (r, 2c + 8), (r + 8, 2c + 8), r = 16w + l / 4, c = l % 4
// (ARow, ACol), as mma.sync's A fragment per warp.
//
// Accumulators of m64nNk16 (f32): warp w of the group holds rows 16w..16w+15; for each 8-column
// block j, lane l holds d[4j + 0..3] at (row 16w + l / 4, column 8j + 2 (l % 4)), the column
// after it, and the same two 8 rows down (AccRow, AccCol).
#pragma once

#include <cstdint>

#include "smla/kernels/hd.h"

namespace smla::kernels::gpu::wgmma {

// Byte offset of element (r, k) in a K-major no-swizzle tile of `k_values` values per row.
SMLA_HD constexpr uint32_t TileOffset(int r, int k, int k_values) {
  return static_cast<uint32_t>(((r / 8) * (k_values / 8) + k / 8) * 128 + (r % 8) * 16 +
                               (k % 8) * 2);
}

// Byte offset of element (k, n) in an MN-major no-swizzle tile of `k_values` keys.
SMLA_HD constexpr uint32_t TileOffsetMn(int k, int n, int k_values) {
  return static_cast<uint32_t>(((n / 8) * (k_values / 8) + k / 8) * 128 + (k % 8) * 16 +
                               (n % 8) * 2);
}

// Row and first column (of a bf16 pair) of register j (0..3) of `lane` in warp `warp`'s A
// fragment of one k-step of 16.
SMLA_HD constexpr int ARow(int warp, int lane, int j) { return 16 * warp + lane / 4 + 8 * (j % 2); }
SMLA_HD constexpr int ACol(int lane, int j) { return 2 * (lane % 4) + 8 * (j / 2); }

// Row and column of accumulator i of `lane` in warp `warp` of the group.
SMLA_HD constexpr int AccRow(int warp, int lane, int i) {
  return 16 * warp + lane / 4 + 8 * ((i % 4) / 2);
}
SMLA_HD constexpr int AccCol(int lane, int i) { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; }

// The accumulator of an m64nN product (N a multiple of 16) that holds the first value of A
// fragment register j of k-step ks when the product's columns become the next product's k
// (P.V's A from Q.K^T's scores): column 16 ks + ACol(lane, j) of row ARow(warp, lane, j) is
// accumulator 4 (2 ks + j / 2) + 2 (j % 2) of the same lane, the next column the one after.
SMLA_HD constexpr int AccumulatorOfA(int ks, int j) { return 4 * (2 * ks + j / 2) + 2 * (j % 2); }

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The descriptor of a no-swizzle operand at shared address `smem` (16-byte aligned) whose cores
// adjacent in K lie `lead` bytes apart and adjacent in M or N `stride` bytes apart.
__device__ __forceinline__ uint64_t Descriptor(const void* smem, uint32_t lead, uint32_t stride) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return uint64_t{(addr & 0x3ffff) >> 4} | (uint64_t{lead >> 4} << 16) |
         (uint64_t{stride >> 4} << 32);
}

// A K-major tile of `k_values` values per row (TileOffset), or an MN-major one of `k_values` keys
// (TileOffsetMn).
__device__ __forceinline__ uint64_t KMajorDescriptor(const void* smem, int k_values) {
  return Descriptor(smem, 128, static_cast<uint32_t>(k_values / 8) * 128);
}

// The key tile of Q.K^T (TileOffset, `width` lanes a key) read as P.V's value operand.
__device__ __forceinline__ uint64_t SharedKvDescriptor(const void* smem, int width) {
  return Descriptor(smem, static_cast<uint32_t>(width / 8) * 128, 128);
}

// Shared-memory writes of ordinary stores made visible to the products' (async proxy) reads;
// after the writes and a barrier, before the products.
__device__ __forceinline__ void FenceOperands() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Orders the accumulator registers' earlier accesses before the products that follow.
__device__ __forceinline__ void Arrive() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void Commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most `kPending` committed groups are still running.
template <int kPending>
__device__ __forceinline__ void Wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins accumulator registers here: after Wait, so that no read of them moves above it (the
// products' asm statements name them as outputs at issue, not at completion).
template <int N>
__device__ __forceinline__ void FenceAccumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The 32 f32 accumulators of an m64n64 product as the asm's first operands (%0..%31), read and
// written; both products below name them so.
#define SMLA_WGMMA_ACCUMULATORS                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
  "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define SMLA_WGMMA_ACCUMULATOR_OPERANDS(d)                                                        \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d (+)= A (64 x 16, descriptor a) * B (64 x 16, descriptor b)^T: m64n64k16, bf16 in, f32
// accumulate; `accumulate` false overwrites d. kTransB: B is 16 x 64 MN-major instead (the
// value operand of P.V with P in shared memory).
template <bool kTransB = false>
__device__ __forceinline__ void Mma64x64x16(float (&d)[32], uint64_t a, uint64_t b,
                                            bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SMLA_WGMMA_ACCUMULATORS
      "%32, %33, p, 1, 1, 0, %35;\n"
      "}\n"
      : SMLA_WGMMA_ACCUMULATOR_OPERANDS(d)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransB ? 1 : 0));
}

// d (+)= A (64 x 16 from registers, ARow / ACol) * B (16 x 64, MN-major, descriptor b):
// m64n64k16 with B transposed, bf16 in, f32 accumulate; `accumulate` false overwrites d.
__device__ __forceinline__ void Mma64x64x16RegA(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                                bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SMLA_WGMMA_ACCUMULATORS
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n"
      "}\n"
      : SMLA_WGMMA_ACCUMULATOR_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

#undef SMLA_WGMMA_ACCUMULATORS
#undef SMLA_WGMMA_ACCUMULATOR_OPERANDS

#endif

}  // namespace smla::kernels::gpu::wgmma
