// The shared-memory region contract (RegisterRegion, RegionRef in tensor.proto): the rules a
// region and every reference into it obey. Server and client both include this header; it is
// part of the wire API, like step_ring.h and shm_handover.h, so it lives beside them.
//
// - A region is a memfd sealed with kRegionSeals (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
//   and not with kRegionWriteSeals: its size is fixed for good, so no client action can make
//   an access to the server's mapping fault, and the server can write outputs into it. POSIX
//   shm_open objects (which cannot be sealed) are not taken. How the memfd reaches the server:
//   shm_handover.h.
// - A RegionRef (region, offset, size) lies within the region's registered size
//   (RefInBounds, overflow-safe), and its offset is a multiple of the element size of its
//   tensor's dtype (RefAligned).
// - The client places tensors and rings at multiples of kRegionAlign (a cache line); a ring's
//   offset must be one (step_ring.h).
#pragma once

#include <fcntl.h>

#include <cstdint>
#include <string>
#include <string_view>

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

namespace smla::v1::region {

inline constexpr int kRegionSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
inline constexpr int kRegionWriteSeals = F_SEAL_WRITE | F_SEAL_FUTURE_WRITE;
inline constexpr uint64_t kRegionAlign = 64;

// Whether [offset, offset + size) lies within `region_bytes`, written so that it cannot
// overflow.
inline constexpr bool RefInBounds(uint64_t offset, uint64_t size, uint64_t region_bytes) {
  return offset <= region_bytes && size <= region_bytes - offset;
}

// Whether `offset` is a multiple of `align` (0 and 1 take any offset).
inline constexpr bool RefAligned(uint64_t offset, uint64_t align) {
  return align <= 1 || offset % align == 0;
}

// `x` rounded up to a multiple of kRegionAlign.
inline constexpr uint64_t AlignUp(uint64_t x) {
  return (x + kRegionAlign - 1) / kRegionAlign * kRegionAlign;
}

// The errors' wording, the same on both ends: "offset O + size S is outside region 'NAME' of
// N bytes", "offset O is not a multiple of A".
inline std::string OutsideText(uint64_t offset, uint64_t size, std::string_view name,
                               uint64_t region_bytes) {
  return "offset " + std::to_string(offset) + " + size " + std::to_string(size) +
         " is outside region '" + std::string(name) + "' of " + std::to_string(region_bytes) +
         " bytes";
}
inline std::string MisalignedText(uint64_t offset, uint64_t align) {
  return "offset " + std::to_string(offset) + " is not a multiple of " + std::to_string(align);
}

}  // namespace smla::v1::region
