// Allocator behaviour for processes that send and receive multi-MB smla.v1 messages (the server,
// the client tools, a frontend). glibc's malloc serves blocks past its mmap threshold (128 KiB
// by default, adapting up to 32 MiB) with fresh mappings and unmaps them on free, so every
// large message faults in its pages again, and it trims freed heap tops back to the kernel.
// Page faults on fresh multi-MB buffers cost more than the copies themselves
// (docs/performance.md, "The inline data path"). Header-only: both sides call it at start-up.
#pragma once

#include <malloc.h>

#include <climits>

namespace smla::v1 {

// Keeps freed memory for reuse: blocks up to 32 MiB (glibc's largest mmap threshold) come from
// the heap, and the heap is never trimmed below 2 GiB of free space. Returns false where the
// allocator refused (another allocator than glibc's answers 0 as well).
inline bool KeepFreedMemoryForReuse() {
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
  return mmap_ok && trim_ok;
}

}  // namespace smla::v1
