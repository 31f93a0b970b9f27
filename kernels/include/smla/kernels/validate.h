// Checks of docs/operator.md shared by every backend: an invalid call is rejected before any work
// with a status whose message names the problem (segment, row, id, field).
#pragma once

#include "absl/status/status.h"
#include "smla/kernels/params.h"

namespace smla::kernels {

// Cache view: format/geometry pairing, power-of-two page rows, pitch at least what the rows
// need and a multiple of 16, positive finite scale for fp8_per_tensor.
absl::Status ValidateCacheView(const CacheView& cache, std::string_view what);

// Everything an Attend call needs: heads, q type and scale, CSR shape of both segments, ids in
// range ("main segment, row 3: index 4096 out of range (pool has 4096 slots)") unless the call
// vouches for them (AttendParams::ids_in_range), sink, epilogue positions, output pointers.
absl::Status ValidateAttend(const AttendParams& params);

// Slots in range, cache view valid, groups (when given) one per slot with their flags.
absl::Status ValidateWriteRows(const WriteRowsParams& params);

// Range and row counts, page shift and pointers (ranges and rows lie in backend memory: each
// backend bounds what it reads by a range's length and a row's own limit).
absl::Status ValidateCheckInputs(const CheckInputsParams& params);

// Width a positive multiple of 32, vectors not negative, pointers set when there is work.
absl::Status ValidateExpandQuery(const ExpandQueryParams& params);

}  // namespace smla::kernels
