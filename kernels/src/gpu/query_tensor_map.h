// The queries' tensor map: how the warpgroup program (attend_wgmma_kernel.cuh) has the bulk
// tensor copy engine (TMA) bring its 64 query vectors into shared memory, already in the
// products' 128-byte swizzled layout, instead of staging them through registers (docs/gpu.md,
// "Queries by the tensor copy engine").
#pragma once

#include <cstdint>

namespace smla::kernels::gpu {

// The driver's CUtensorMap by size and alignment: kernel headers that HIP also compiles do not
// include cuda.h. Passed to the kernel as a __grid_constant__ parameter, read there by address.
struct alignas(128) QueryTensorMap {
  uint64_t opaque[16] = {};
};

// Box of one copy: 64 values (one 128-byte swizzle line) of 64 query vectors.
inline constexpr int kQueryBoxValues = 64;
inline constexpr int kQueryBoxVectors = 64;

// Encodes the map of bf16 queries [vectors, width] at device address q (vectors = T x H). False
// where the engine cannot read them (q not 16-byte aligned, a shape past the map's limits, a
// driver without the entry point): the program then stages its queries with loads.
bool EncodeQueryTensorMap(const void* q, int64_t vectors, int width, QueryTensorMap* map);

}  // namespace smla::kernels::gpu
