// The device side of programmatic dependent launch (gpu::LaunchKernel launches every kernel so):
// a kernel may start while the one before it on the stream is still running, so every kernel
// waits for it before its first access to memory that kernel may have written (the direct
// attention kernel stages queries no kernel writes before it: AttendParams::q_before_launch), and
// lets the next one start once all its own blocks are running. The wait covers all of the earlier
// kernel's writes, and that kernel waited for its own predecessor, so stream order holds as before;
// what is saved is the launch gap. Without the instructions (HIP, NVIDIA before sm_90) both are
// nothing and order is the stream's. docs/architecture.md, "Kernels that start early".
#pragma once

#include "smla/kernels/gpu/runtime.h"  // the vendor's device qualifiers

namespace smla::kernels::gpu {

// Returns once the grid before this one on the stream has completed and its writes are visible.
// First in every kernel, before any load or store of global memory.
__device__ __forceinline__ void WaitForPriorGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next grid on the stream be scheduled (it still waits for this one to complete).
__device__ __forceinline__ void LetNextGridStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Both, as every kernel starts.
__device__ __forceinline__ void EnterGrid() {
  WaitForPriorGrid();
  LetNextGridStart();
}

}  // namespace smla::kernels::gpu
