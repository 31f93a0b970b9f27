// Alignment arithmetic on sizes, offsets and addresses, for host and device code.
//
//   AlignUp(37, 16) == 48      CeilDiv(37, 16) == 3      IsAligned(48, 16)      IsAligned(ptr, 64)
//
// The alignment may be any positive integer (fp8_dsv4 pages pad to multiples of 576), not only
// a power of two; the values are non-negative.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SMLA_ALIGN_HD __host__ __device__
#else
#define SMLA_ALIGN_HD
#endif

namespace smla {

// The smallest multiple of `alignment` that is >= n.
template <typename T>
SMLA_ALIGN_HD constexpr T AlignUp(T n, std::type_identity_t<T> alignment) {
  static_assert(std::is_integral_v<T>);
  return (n + alignment - 1) / alignment * alignment;
}

// How many `d`-sized parts cover n: the quotient rounded up (d > 0).
template <typename T>
SMLA_ALIGN_HD constexpr T CeilDiv(T n, std::type_identity_t<T> d) {
  static_assert(std::is_integral_v<T>);
  return (n + d - 1) / d;
}

template <typename T>
SMLA_ALIGN_HD constexpr bool IsAligned(T n, std::type_identity_t<T> alignment) {
  static_assert(std::is_integral_v<T>);
  return n % alignment == 0;
}

inline bool IsAligned(const void* p, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

template <typename T>
SMLA_ALIGN_HD constexpr bool IsPowerOfTwo(T v) {
  static_assert(std::is_integral_v<T>);
  return v > 0 && (v & (v - 1)) == 0;
}

}  // namespace smla
