// smla-kbench's index sets (bench/kbench/workload.h): windows at each row's position, chosen
// sets that redraw the asked fraction of the row before's.
#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kbench/workload.h"
#include "smla/models/grid.h"

namespace smla::kbench {
namespace {

// Row t's entries of one CSR segment.
std::set<int32_t> RowSet(const std::vector<int32_t>& indptr, const std::vector<int32_t>& indices,
                         int t) {
  return std::set<int32_t>(indices.begin() + indptr[t], indices.begin() + indptr[t + 1]);
}

int Missing(const std::set<int32_t>& from, const std::set<int32_t>& in) {
  return static_cast<int>(
      std::count_if(from.begin(), from.end(), [&](int32_t e) { return in.count(e) == 0; }));
}

// Each row after a request's first replaces at most `redraw` of its 512 chosen keys (the
// redraws pick positions with replacement, so somewhat fewer), and none with redraw 0; the
// window is the 128 positions up to the row's own, one more with each row.
TEST(KbenchWorkloadTest, RowsRedrawTheAskedFractionOfTheirChosenKeys) {
  absl::StatusOr<models::Cell> cell = models::ParseCell("dsv4-flash fp8_dsv4 TP2 decode C=4 128K");
  ASSERT_TRUE(cell.ok()) << cell.status();
  const PoolShape pools = PoolFor(*cell, cell->requests);
  const int per_request = cell->rows_per_request();
  for (const double redraw : {0.0, kDefaultRedraw, 0.5}) {
    const CallIndices ci = MakeIndices(*cell, pools, 1000, redraw);
    ASSERT_EQ(static_cast<int>(ci.extra_indptr.size()), cell->rows() + 1);
    const int most = static_cast<int>(512 * redraw);
    std::set<int32_t> prev_chosen, prev_window;  // row t - 1's
    for (int t = 0; t < cell->rows(); ++t) {
      std::set<int32_t> chosen = RowSet(ci.extra_indptr, ci.extra_indices, t);
      EXPECT_EQ(chosen.size(), 512u) << t;
      std::set<int32_t> window = RowSet(ci.main_indptr, ci.main_indices, t);
      EXPECT_EQ(window.size(), 128u) << t;
      if (t % per_request != 0) {
        const int redrawn = Missing(prev_chosen, chosen);
        EXPECT_LE(redrawn, most) << "redraw " << redraw << ", row " << t;
        EXPECT_GE(redrawn, most * 7 / 10) << "redraw " << redraw << ", row " << t;
        EXPECT_EQ(Missing(prev_window, window), 1) << t;
      }
      prev_chosen = std::move(chosen);
      prev_window = std::move(window);
    }
  }
}

// The default is the fraction the grid's tables were measured with.
TEST(KbenchWorkloadTest, DefaultRedrawIsAQuarter) {
  absl::StatusOr<models::Cell> cell = models::ParseCell("dsv4-flash fp8_dsv4 TP2 decode C=2 128K");
  ASSERT_TRUE(cell.ok()) << cell.status();
  const PoolShape pools = PoolFor(*cell, cell->requests);
  const CallIndices by_default = MakeIndices(*cell, pools, 7);
  const CallIndices quarter = MakeIndices(*cell, pools, 7, 0.25);
  EXPECT_EQ(by_default.extra_indices, quarter.extra_indices);
  EXPECT_NE(MakeIndices(*cell, pools, 7, 0.3).extra_indices, quarter.extra_indices);
}

}  // namespace
}  // namespace smla::kbench
