// How the warpgroups of a warp-specialised sm_90a program hand work to each other: barriers in
// shared memory that count arrivals and flip a phase bit (mbarrier), the hardware's named
// barriers for a subset of the block's warps, and the register file moved between warpgroups
// (setmaxnreg). docs/gpu.md, "Tensor cores", says how the warpgroup program uses them.
//
// Memory ordering: an arrival releases and a completed wait acquires the writes before it at
// block scope, for ordinary loads and stores. Writes that the products (wgmma, the async proxy)
// will read need wgmma::FenceOperands by the writing threads before they arrive.
#pragma once

#include <cstdint>

namespace smla::kernels::gpu::wgsync {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t BarrierAddress(const uint64_t* bar) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(bar));
}

// A barrier whose phase completes when `arrivals` threads have arrived; by one thread, before a
// block-wide barrier that every user passes first.
__device__ __forceinline__ void InitBarrier(uint64_t* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(BarrierAddress(bar)), "r"(arrivals)
               : "memory");
}

// This thread's arrival on the current phase (release).
__device__ __forceinline__ void Arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(BarrierAddress(bar)) : "memory");
}

// Makes barriers just initialised visible to the tensor copy engine, whose copies complete on
// them (tensor_copy.h); by the initialising thread, before the block-wide barrier.
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// This thread's arrival, announcing `bytes` that copies completing on the barrier will bring:
// the phase completes when the arrivals and those bytes are all in.
__device__ __forceinline__ void ArriveExpectBytes(uint64_t* bar, uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(BarrierAddress(bar)),
      "r"(bytes)
      : "memory");
}

// Returns once the phase of parity `parity` (0 for the barrier's first phase, then 1, 0, ...)
// has completed (acquire).
__device__ __forceinline__ void Wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = BarrierAddress(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (done == 0);
}

// Named barrier `id` (1..15; 0 is __syncthreads') over `threads` threads (a multiple of 32): Sync
// waits for all of them, Arrive counts this warp and goes on (its earlier writes are visible to
// the threads that Sync there).
__device__ __forceinline__ void NamedSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// This warpgroup's registers per thread, raised to or lowered to kRegs (a multiple of 8, 24 ..
// 256); every thread of the warpgroup executes it. Raising waits until lowered registers are free.
template <int kRegs>
__device__ __forceinline__ void RaiseRegisters() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg's range");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void LowerRegisters() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg's range");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

#endif

}  // namespace smla::kernels::gpu::wgsync
