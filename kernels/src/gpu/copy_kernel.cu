// Copies within device memory and page-locked host memory (Backend::CopyBatch,
// CopyDirection::kOnDevice) as one kernel: the runtime runs each device-to-device copy as its
// own operation, several microseconds apiece whatever its size, and a launch's outputs to a GPU
// region are a handful of small ones (docs/results/bench-h200.md, "The floor of a launch"); the
// executor's upload of its arrays from its page-locked arena is one too. Each block copies one
// 16 KiB chunk of one copy: in 16-byte words where both ends of the chunk are 16-byte aligned,
// else bytes.
#include <cstdint>

#include "gpu/grid_order.h"
#include "gpu/kernel_params.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kCopyThreads = 256;
constexpr int kWordsPerThread = static_cast<int>(kDeviceCopyChunk / 16 / kCopyThreads);
static_assert(kWordsPerThread * 16 * kCopyThreads == kDeviceCopyChunk, "a chunk in one pass");

__global__ void __launch_bounds__(kCopyThreads)
    DeviceCopyKernel(const __grid_constant__ DeviceCopyKernelParams p) {
  EnterGrid();  // grid_order.h: before any access to memory
  const auto block = static_cast<int32_t>(blockIdx.x);
  // The block's op, picked with constant indices only: a run-time index into the parameter
  // would go through local memory.
  CopyOp op = p.ops[0];
  int32_t first = 0;
#pragma unroll
  for (int k = 1; k < kMaxDeviceCopies; ++k) {
    if (k < p.count && p.first_block[k] <= block) {
      op = p.ops[k];
      first = p.first_block[k];
    }
  }
  const auto bytes = static_cast<int64_t>(op.bytes);
  const int64_t begin = int64_t{block - first} * kDeviceCopyChunk;
  const int64_t end = begin + kDeviceCopyChunk < bytes ? begin + kDeviceCopyChunk : bytes;
  auto* dst = static_cast<uint8_t*>(op.dst) + begin;
  const auto* src = static_cast<const uint8_t*>(op.src) + begin;
  const int64_t n = end - begin;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    // All of a thread's loads before its stores: the compiler cannot move a load above a store
    // that may alias it, and a chain of round trips is slow where the source is host memory.
    const int64_t words = n / 16;
    uint4 v[kWordsPerThread];
#pragma unroll
    for (int k = 0; k < kWordsPerThread; ++k) {
      const int64_t w = threadIdx.x + int64_t{k} * kCopyThreads;
      if (w < words) v[k] = reinterpret_cast<const uint4*>(src)[w];
    }
#pragma unroll
    for (int k = 0; k < kWordsPerThread; ++k) {
      const int64_t w = threadIdx.x + int64_t{k} * kCopyThreads;
      if (w < words) reinterpret_cast<uint4*>(dst)[w] = v[k];
    }
    for (int64_t b = words * 16 + threadIdx.x; b < n; b += kCopyThreads) dst[b] = src[b];
  } else {
    for (int64_t b = threadIdx.x; b < n; b += kCopyThreads) dst[b] = src[b];
  }
}

}  // namespace

absl::Status LaunchDeviceCopies(std::span<const CopyOp> copies, StreamHandle stream) {
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // 16 GiB a launch
  while (!copies.empty()) {
    DeviceCopyKernelParams p;
    int64_t blocks = 0;
    size_t used = 0;  // ops of `copies` this launch takes (empty ones included)
    for (; used < copies.size() && p.count < kMaxDeviceCopies; ++used) {
      const int64_t chunks =
          (static_cast<int64_t>(copies[used].bytes) + kDeviceCopyChunk - 1) / kDeviceCopyChunk;
      if (chunks == 0) continue;
      if (blocks + chunks > kMaxBlocks) {
        if (p.count == 0) return absl::InvalidArgumentError("a device copy over 16 GiB");
        break;
      }
      p.ops[p.count] = copies[used];
      p.first_block[p.count] = static_cast<int32_t>(blocks);
      ++p.count;
      blocks += chunks;
    }
    copies = copies.subspan(used);
    if (p.count == 0) continue;
    p.first_block[p.count] = static_cast<int32_t>(blocks);
    if (absl::Status st = ToStatus(Launch(DeviceCopyKernel, dim3(static_cast<unsigned>(blocks)),
                                          dim3(kCopyThreads), 0, stream, p),
                                   "device-copy kernel launch");
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace smla::kernels::gpu
