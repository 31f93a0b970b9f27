// One chosen entry into a pool slot (TranslateParams in params.h), the same code on every
// backend so that they write identical slots and flag identical ids.
#pragma once

#include <cstdint>

#include "smla/kernels/hd.h"

namespace smla::kernels {

// The slot of entry `e` of a row that sees entries [0, limit) of `table` (pages of 2^shift
// rows), or -1 for -1 and for an id outside [-1, limit), which sets `bad`. The entry is
// clamped into the table before the page is read, so a bad id reads nothing outside it.
SMLA_HD_INLINE int32_t TranslateEntry(int32_t e, const int32_t* table, int32_t shift, int32_t limit,
                                      bool& bad) {
  if (e < -1 || e >= limit) bad = true;
  if (e < 0 || e >= limit) return -1;
  const int32_t mask = (int32_t{1} << shift) - 1;
  return (table[e >> shift] << shift) | (e & mask);
}

}  // namespace smla::kernels
