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

// The 128-byte swizzle (what the attention program uses: docs/gpu.md, "Tensor cores"). A
// K-major tile of `rows` rows is stored as column blocks of 64 values, each `rows` x 128 bytes
// (a row's 64 values in one 128-byte line, rows one after another, 8-row atoms of 1 KB); in
// row r the 16-byte chunk c of the line sits at chunk c ^ (r % 8). The products apply the same
// exclusive-or to address bits 4-6 from bits 7-9, so a tile must start 1024-byte aligned. Read
// MN-major (P.V's value operand: keys along K, values along N) the same bytes are the
// swizzled MN-major layout, so one key tile serves both products, as with no swizzle. `rows` is
// a multiple of 8.
SMLA_HD constexpr uint32_t SwizzledOffset(int r, int k, int rows) {
  return static_cast<uint32_t>((k / 64) * rows * 128 + r * 128 + (((k % 64) / 8) ^ (r % 8)) * 16 +
                               (k % 8) * 2);
}

// How far k-step ks (16 values) of a swizzled K-major tile of `rows` rows starts from its
// k-step 0, in descriptor units (16 bytes): 32 bytes along the line per step, the next column
// block every four steps. Added to k-step 0's descriptor it gives k-step ks's (shared addresses
// stay below 2^18, so the sum stays within the start-address field): one add per product
// instead of building each descriptor from its address.
SMLA_HD constexpr uint64_t SwizzledKStepAdvance(int rows, int ks) {
  return static_cast<uint64_t>((ks / 4) * rows * 128 + (ks % 4) * 32) >> 4;
}

// The same for the tile read MN-major (SwizzledValues) from key 16 ks and value `col`.
SMLA_HD constexpr uint64_t SwizzledValuesAdvance(int rows, int ks, int col) {
  return static_cast<uint64_t>((col / 64) * rows * 128 + 16 * ks * 128) >> 4;
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

// The descriptor of an operand at shared address `smem` (16-byte aligned) with leading and
// stride byte offsets `lead` and `stride`: with no swizzle, how far apart cores adjacent in K
// and in M or N lie; `swizzle128` marks the 128-byte swizzled layout (SwizzledOffset), whose
// offsets SwizzledKStep and SwizzledValues give.
__device__ __forceinline__ uint64_t Descriptor(const void* smem, uint32_t lead, uint32_t stride,
                                               bool swizzle128 = false) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return uint64_t{(addr & 0x3ffff) >> 4} | (uint64_t{lead >> 4} << 16) |
         (uint64_t{stride >> 4} << 32) | (uint64_t{swizzle128} << 62);
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

// K-step ks (16 values) of a swizzled K-major tile of `rows` rows (SwizzledOffset): its start
// moves 32 bytes along the line per step and to the next column block every four steps; 8-row
// atoms are 1 KB apart (the stride offset; the leading one is unused within a 128-byte line).
__device__ __forceinline__ uint64_t SwizzledKStep(const uint8_t* tile, int rows, int ks) {
  return Descriptor(tile, 16, 1024, true) + SwizzledKStepAdvance(rows, ks);
}

// The same tile read MN-major from key (row) 16 ks and value `col` (a multiple of 64): P.V's
// value operand. Groups of 8 keys are 1 KB apart (stride); 64-value column blocks, the atoms
// along N, `rows` x 128 bytes (leading).
__device__ __forceinline__ uint64_t SwizzledValues(const uint8_t* tile, int rows, int ks, int col) {
  return Descriptor(tile, static_cast<uint32_t>(rows) * 128, 1024, true) +
         SwizzledValuesAdvance(rows, ks, col);
}

// Writes A fragment `a` of k-step ks (ARow / ACol) of warp `warp` into a swizzled K-major tile
// of `rows` rows (SwizzledOffset) with one stmatrix: register m is the 8x8 matrix of rows
// 16 warp + 8 (m % 2) and columns 16 ks + 8 (m / 2), and lane l names the address of row l % 8
// of matrix l / 8 (a 16-byte chunk, which the swizzle keeps whole). Four stores in one.
__device__ __forceinline__ void StoreA(uint8_t* tile, int rows, int warp, int lane, int ks,
                                       const uint32_t (&a)[4]) {
  const int m = lane / 8;
  const uint32_t at =
      SwizzledOffset(16 * warp + 8 * (m % 2) + lane % 8, 16 * ks + 8 * (m / 2), rows);
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(tile + at));
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])
               : "memory");
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

// The 128 f32 accumulators of an m64n256 product (d[cb][i]: column block cb of 64, accumulator
// i of its m64n64 layout) as the asm's first operands (%0..%127).
#define SMLA_WGMMA_ACCUMULATORS_256                                                                \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "     \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "     \
  "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "     \
  "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "     \
  "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, " \
  "%109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, "     \
  "%124, %125, %126, %127}, "
#define SMLA_WGMMA_ACCUMULATOR_OPERANDS_256(d)                                  \
  SMLA_WGMMA_ACCUMULATOR_OPERANDS(d[0]), SMLA_WGMMA_ACCUMULATOR_OPERANDS(d[1]), \
      SMLA_WGMMA_ACCUMULATOR_OPERANDS(d[2]), SMLA_WGMMA_ACCUMULATOR_OPERANDS(d[3])

// d (+)= A (64 x 16, descriptor a) * B (16 x 256, MN-major, descriptor b): m64n256k16, bf16 in,
// f32 accumulate: P.V over 256 value columns with P in shared memory, A read once for all four
// column blocks.
__device__ __forceinline__ void Mma64x256x16TransB(float (&d)[4][32], uint64_t a, uint64_t b,
                                                   bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " SMLA_WGMMA_ACCUMULATORS_256
      "%128, %129, p, 1, 1, 0, 1;\n"
      "}\n"
      : SMLA_WGMMA_ACCUMULATOR_OPERANDS_256(d)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// The same with A from registers (ARow / ACol), as Mma64x64x16RegA.
__device__ __forceinline__ void Mma64x256x16RegA(float (&d)[4][32], const uint32_t (&a)[4],
                                                 uint64_t b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " SMLA_WGMMA_ACCUMULATORS_256
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n"
      "}\n"
      : SMLA_WGMMA_ACCUMULATOR_OPERANDS_256(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

#undef SMLA_WGMMA_ACCUMULATORS_256
#undef SMLA_WGMMA_ACCUMULATOR_OPERANDS_256
#undef SMLA_WGMMA_ACCUMULATORS
#undef SMLA_WGMMA_ACCUMULATOR_OPERANDS

#endif

}  // namespace smla::kernels::gpu::wgmma
