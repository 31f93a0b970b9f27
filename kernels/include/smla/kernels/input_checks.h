// The checks a step's inputs pass on the device, the same code on every backend so that they
// flag the same values and write the same slots (Backend::CheckInputs;
// the host's error messages in server/src/core/step_validation.cc apply the same rules).
#pragma once

#include <cstdint>

#include "smla/kernels/codec/mxfp8_query.h"
#include "smla/kernels/formats.h"
#include "smla/kernels/hd.h"
#include "smla/kernels/params.h"

namespace smla::kernels {

// bf16 bits (sign cleared) of the largest accepted KV magnitude, 2^kKvMaxLog2.
inline constexpr uint16_t kKvMaxBf16Bits = (127 + kKvMaxLog2) << 7;
static_assert(kKvMaxBf16Bits < 0x7f80, "the bound is finite");

// Whether a bf16 KV value is refused: not finite, or |x| > 2^kKvMaxLog2.
SMLA_HD_INLINE bool Bf16OutOfBounds(uint16_t bits) { return (bits & 0x7fffu) > kKvMaxBf16Bits; }

// Whether a byte of a range refuses it, per InputCheck (params.h); bf16 values take
// Bf16OutOfBounds per pair of bytes instead.
SMLA_HD_INLINE bool ByteRefused(InputCheck check, uint8_t byte) {
  if (check == InputCheck::kNone) return false;
  return check == InputCheck::kE4m3Codes ? E4m3IsNaN(byte) : E8m0IsNaN(byte);
}

// Sets `flag` (kFlag* in params.h) in flags[group] by storing its byte: idempotent, so no
// read-modify-write is needed, and any number of writers may set it at once.
SMLA_HD_INLINE void SetFlag(uint32_t* flags, int32_t group, uint32_t flag) {
  auto* bytes = reinterpret_cast<uint8_t*>(flags + group);
  for (int b = 0; b < 4; ++b) {
    const auto v = static_cast<uint8_t>(flag >> (8 * b));
    if (v == 0) continue;
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    bytes[b] = v;
#else
    __atomic_store_n(bytes + b, v, __ATOMIC_RELAXED);
#endif
  }
}

// The slot of entry `e` of a row that sees entries [0, limit) of a table held in `blocks` of
// 2^block_shift pages of 2^shift rows (TranslateRow), or -1 for -1 and for an id outside
// [-1, limit), which sets `bad`. A bad id is refused before any page is read, so it reads
// nothing outside the table.
SMLA_HD_INLINE int32_t TranslateEntry(int32_t e, const int32_t* const* blocks, int32_t shift,
                                      int32_t block_shift, int32_t limit, bool& bad) {
  if (e < -1 || e >= limit) bad = true;
  if (e < 0 || e >= limit) return -1;
  const int32_t mask = (int32_t{1} << shift) - 1;
  const int32_t page = e >> shift;
  const int32_t block_mask = (int32_t{1} << block_shift) - 1;
  return (blocks[page >> block_shift][page & block_mask] << shift) | (e & mask);
}

// Slot j of a PositionRun over pages of 2^shift rows.
SMLA_HD_INLINE int32_t RunSlot(const PositionRun& run, int32_t j, int32_t shift) {
  const int32_t q = run.first + j;
  return (run.pages[q >> shift] << shift) | (q & ((int32_t{1} << shift) - 1));
}

}  // namespace smla::kernels
