// Device helpers of the kernel benchmark: pools filled with valid random rows, random bf16
// tensors, and the ceilings measured in the same run (a gather of whole rows over the pool
// layout the operator reads; a large bf16 matrix product through cuBLAS; the tensor-core rate
// of the warp-level product the attention kernels issue).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "smla/kernels/formats.h"
#include "smla/kernels/gpu/runtime.h"

namespace smla::kbench {

struct PoolLayout {
  uint8_t* base = nullptr;
  kernels::KvFormat format = kernels::KvFormat::kBf16;
  kernels::Geometry geometry = kernels::Geometry::kRopeInside;
  int64_t num_pages = 0;
  int32_t rows_per_page = 64;
  int64_t pitch = 0;
};

// Every byte of the pool: finite random rows in the format's layout (codes never NaN, scales
// in a sane range, padding zero).
absl::Status FillPool(const PoolLayout& pool, uint64_t seed, kernels::gpu::StreamHandle stream);
absl::Status FillBf16(uint16_t* dst, int64_t n, float magnitude, uint64_t seed,
                      kernels::gpu::StreamHandle stream);

// Reads the rows named by `slots` ([n] device int32) whole (the format's row bytes, the
// fp8_dsv4 scale record too) with 16-byte loads, several in flight per thread.
absl::Status LaunchGather(const PoolLayout& pool, const int32_t* slots, int64_t n, uint32_t* sink,
                          kernels::gpu::StreamHandle stream);
// Bytes a gather of one row reads.
int64_t GatherRowBytes(kernels::KvFormat format, kernels::Geometry geometry);

// Dense bf16 GEMM rate (TFLOP/s) of an n x n x n product through cuBLAS loaded at run time;
// an error when the library is not found.
absl::StatusOr<double> GemmTflops(int n, int iterations, kernels::gpu::StreamHandle stream);

// Rate (TFLOP/s) of mma.sync m16n8k16 with f16 operands and f32 accumulators, register-resident
// on every SM: what a kernel built on that instruction can reach at best (the dense GEMM
// above uses Hopper's warpgroup products, which the attention kernels do not).
absl::StatusOr<double> MmaTflops(int compute_units, int iterations,
                                 kernels::gpu::StreamHandle stream);

}  // namespace smla::kbench
