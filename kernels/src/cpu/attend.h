// The CPU backend's Attend: cuts a validated call into (row, head block, split) items, runs
// them on the pool, and finishes every (row, head) through the shared combine and epilogue.
#pragma once

#include <cstdint>

#include "cpu/thread_pool.h"
#include "smla/kernels/params.h"

namespace smla::kernels::cpu {

// Split count of one row. Only a forced split count splits, and then per row (never more
// splits than the row has 64-key tiles), so a row's result never depends on the other rows of
// its batch.
int32_t RowSplits(int32_t planned_splits, bool forced, int64_t main_len, int64_t extra_len);

// Split partials (2 KiB each) kept at once: bounds the workspace of forced splits.
inline constexpr int64_t kMaxSplitRecords = 16384;

// `params` must have passed ValidateAttend. Rows whose split partials exceed `max_records`
// together run in successive chunks (the result does not depend on it).
void RunAttend(const AttendParams& params, ThreadPool& pool,
               int64_t max_records = kMaxSplitRecords);

}  // namespace smla::kernels::cpu
