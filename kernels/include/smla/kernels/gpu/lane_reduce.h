// Butterfly reductions over aligned groups of lanes, written once for both vendors on top of
// WarpXorMax/WarpXorSum. The group size names the fragment, not the warp: 4 lanes hold a row
// of an m16n8k16 accumulator on CUDA, 16 lanes a row of a 16x16 MFMA accumulator on gfx950,
// kWarpSize lanes a whole warp or wavefront (32 or 64).
#pragma once

#include "smla/kernels/gpu/primitives.h"

namespace smla::kernels::gpu {

template <int kLanes>
inline constexpr bool kValidLaneGroup = kLanes >= 1 && kLanes <= kWarpSize &&
                                        (kLanes & (kLanes - 1)) == 0;

// Max over each aligned group of kLanes lanes; every lane of the group gets the result.
template <int kLanes>
__device__ __forceinline__ float LaneGroupMax(float v) {
  static_assert(kValidLaneGroup<kLanes>, "a lane group is a power of two up to kWarpSize");
#pragma unroll
  for (int m = kLanes / 2; m >= 1; m /= 2) v = WarpXorMax(v, m);
  return v;
}

// Sum over each aligned group of kLanes lanes; every lane of the group gets the result.
template <int kLanes>
__device__ __forceinline__ float LaneGroupSum(float v) {
  static_assert(kValidLaneGroup<kLanes>, "a lane group is a power of two up to kWarpSize");
#pragma unroll
  for (int m = kLanes / 2; m >= 1; m /= 2) v = WarpXorSum(v, m);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) { return LaneGroupMax<kWarpSize>(v); }
__device__ __forceinline__ float WarpSum(float v) { return LaneGroupSum<kWarpSize>(v); }

}  // namespace smla::kernels::gpu
