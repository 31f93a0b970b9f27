// A warpgroup's output rows staged in shared memory, then copied to global memory whole.
// The products' accumulator layout gives each lane two values of a row per store, so bf16 or
// MXFP8 stores straight from it write 16 or 8 bytes of each of 8 rows per warp instruction
// (parts of 32-byte sectors); staged, each warp instruction of the copy writes whole rows of
// 256 or 512 contiguous bytes (docs/gpu.md, "The epilogue through shared memory").
#pragma once

#include <cstdint>

#include "smla/kernels/gpu/runtime.h"
#include "smla/kernels/gpu/warpgroup_sync.h"

namespace smla::kernels::gpu {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)  // as warpgroup_sync.h

// kRows rows of kRowBytes each; a row's 16-byte chunks are XOR-swizzled by its low three bits,
// so that the 8 rows one warp instruction of the accumulator layout touches fall in distinct
// banks.
template <int kRows, int kRowBytes>
struct StagedRows {
  static_assert(kRowBytes % 128 == 0, "at least eight chunks a row, rows on 128-byte lines");
  static constexpr int kChunks = kRowBytes / 16;
  static constexpr int kBytes = kRows * kRowBytes;
  uint8_t* base = nullptr;

  template <class T>
  __device__ __forceinline__ T& At(int row, int byte) const {
    const int chunk = (byte / 16) ^ (row & 7);
    return *reinterpret_cast<T*>(base + row * kRowBytes + chunk * 16 + byte % 16);
  }

  // Every staged row to dst(row) (nullptr: not copied), 16 bytes a thread and step, by the
  // `threads` threads whose index within them is `tid`, after they all staged theirs (named
  // barrier `barrier` over them).
  template <class Dst>
  __device__ __forceinline__ void CopyOut(Dst&& dst, int tid, int threads, int barrier) const {
    wgsync::NamedSync(barrier, threads);
#pragma unroll 4
    for (int i = tid; i < kRows * kChunks; i += threads) {
      const int row = i / kChunks;
      const int chunk = i % kChunks;
      uint8_t* out = dst(row);
      if (out != nullptr) {
        *reinterpret_cast<uint4*>(out + 16 * chunk) = At<const uint4>(row, 16 * chunk);
      }
    }
  }
};

#endif

}  // namespace smla::kernels::gpu
