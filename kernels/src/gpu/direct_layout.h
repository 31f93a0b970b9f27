// Which lane holds which row, column and key of the m16n8k16 fragments in the direct attention
// kernel (attend_direct_kernel.cuh). Both dots sum over a dimension whose order is free, and the
// output columns may land anywhere the epilogue knows about, so the kernel permutes them to make
// each lane's operands contiguous bytes of one staged fp8 row. All the layout arithmetic lives
// here: a port to another matrix instruction replaces this file and the primitives.
//
// m16n8k16 (32 lanes): g = lane / 4 is the A/C row and the B column, c = lane % 4 picks the
// k (A, B) or n (C) pairs 2c, 2c+1 and 2c+8, 2c+9 (A, B) / 2c, 2c+1 (C).
#pragma once

namespace smla::kernels::gpu::direct {

__host__ __device__ constexpr int FragGroup(int lane) { return lane / 4; }
__host__ __device__ constexpr int FragPair(int lane) { return lane % 4; }

// Q.K^T runs over 64-dim chunks of 4 k-steps. Lane (g, c) feeds key g from two 8-byte runs of
// the chunk, dims [8c, 8c+8) and [32+8c, 32+8c+8): k-step s takes dims 8c+2s, +1 as its first
// B register and 32+8c+2s, +1 as its second. Q is staged in the matching order: position l
// (0..15) of k-step s holds this dim of the chunk.
__host__ __device__ constexpr int QkDim(int s, int l) {
  return (l < 8 ? 0 : 32) + 8 * ((l % 8) / 2) + 2 * s + l % 2;
}
// Byte offsets, inside a 64-dim chunk of e4m3 codes, of lane c's two 8-byte runs.
__host__ __device__ constexpr int QkRun(int c, int r) { return 32 * r + 8 * c; }

// P.V runs over k-steps of 16 keys. Lane (g, c) feeds keys c, c+4 (first B register) and
// c+8, c+12 (second), so position l (0..15) of P's k-step holds this key of the 16.
__host__ __device__ constexpr int PvKey(int l) { return (l / 8) * 8 + (l % 8) / 2 + 4 * (l % 2); }
// Inverse of PvKey: where key k (0..15) of the k-step sits in P's staged row.
__host__ __device__ constexpr int PvPosition(int k) {
  return (k / 8) * 8 + 2 * (k % 4) + (k % 8) / 4;
}
// The four keys (of the 16) lane c reads for one k-step, in B-register order.
__host__ __device__ constexpr int PvLaneKey(int c, int m) { return c + 4 * m; }

// Output n-tile j, C column n of a warp's 64 columns is column 8n + j: lane (g, c) reads
// columns [8g, 8g+8) of V as B, and holds output columns [16c, 16c+16) as C (value i of the
// C pair in tile j is column 16c + 8i + j).
__host__ __device__ constexpr int PvLaneColumn(int g) { return 8 * g; }
__host__ __device__ constexpr int OutColumn(int c, int i, int j) { return 16 * c + 8 * i + j; }

static_assert(QkDim(0, 0) == 0 && QkDim(0, 1) == 1 && QkDim(0, 8) == 32 && QkDim(3, 7) == 31 &&
                  QkDim(3, 15) == 63,
              "each chunk dim is used once");
static_assert(PvKey(PvPosition(13)) == 13 && PvPosition(PvKey(6)) == 6 && PvKey(1) == 4 &&
                  PvKey(9) == 12,
              "PvPosition inverts PvKey");

}  // namespace smla::kernels::gpu::direct
