// A pause for spin loops, shared by the server's scheduler and both ends of the step ring
// (step_ring.h). Header-only and free of protobuf, so the service core can include it too.
#pragma once

namespace smla::v1 {

// Tells the CPU this is a spin-wait: it frees the core's pipeline for a sibling hyperthread and
// saves power, where the architecture has such a hint.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace smla::v1
