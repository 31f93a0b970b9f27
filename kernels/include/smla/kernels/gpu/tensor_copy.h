// sm_90a's bulk tensor copy engine (TMA): one thread asks for a box of a tensor described by a
// tensor map (built on the host), and the engine writes it to shared memory, in the map's
// swizzled layout, completing on a barrier (warpgroup_sync.h: ArriveExpectBytes, Wait). The
// copy runs beside the block's own loads and takes no registers.
#pragma once

#include <cstdint>

namespace smla::kernels::gpu::tensor_copy {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Box (x, y) of the 2-D map at `map` (a __grid_constant__ parameter's address: the engine reads
// it from there) into shared memory at `dst` (1 KB aligned for the 128-byte swizzle), its bytes
// counted on `bar`.
__device__ __forceinline__ void LoadBox2d(void* dst, const void* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
      : "memory");
}

#endif

}  // namespace smla::kernels::gpu::tensor_copy
