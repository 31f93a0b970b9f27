#include "smla/server/page_allocator.h"

#include <algorithm>
#include <set>

#include "gtest/gtest.h"

namespace smla::server {
namespace {

TEST(PageAllocatorTest, AllOrNothing) {
  PageAllocator a(5);
  EXPECT_EQ(a.pages_total(), 5);
  std::vector<int32_t> got;
  ASSERT_TRUE(a.Allocate(3, got));
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(a.pages_used(), 3);
  EXPECT_FALSE(a.Allocate(3, got));  // only 2 free: nothing taken
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(a.pages_used(), 3);
  ASSERT_TRUE(a.Allocate(2, got));
  EXPECT_EQ(a.pages_free(), 0);
  std::set<int32_t> distinct(got.begin(), got.end());
  EXPECT_EQ(distinct, (std::set<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_FALSE(a.Allocate(1, got));
  EXPECT_TRUE(a.Allocate(0, got));
}

TEST(PageAllocatorTest, FreedPagesAreReused) {
  PageAllocator a(4);
  std::vector<int32_t> got;
  ASSERT_TRUE(a.Allocate(4, got));
  a.Free(std::span<const int32_t>(got.data(), 2));
  EXPECT_EQ(a.pages_used(), 2);
  EXPECT_FALSE(a.IsAllocated(got[0]));
  EXPECT_TRUE(a.IsAllocated(got[2]));
  std::vector<int32_t> again;
  ASSERT_TRUE(a.Allocate(2, again));
  std::sort(again.begin(), again.end());
  std::vector<int32_t> first_two(got.begin(), got.begin() + 2);
  std::sort(first_two.begin(), first_two.end());
  EXPECT_EQ(again, first_two);
}

TEST(PageAllocatorDeathTest, DoubleFreeCrashes) {
  PageAllocator a(2);
  std::vector<int32_t> got;
  ASSERT_TRUE(a.Allocate(1, got));
  a.Free(got[0]);
  EXPECT_DEATH(a.Free(got[0]), "freed but not allocated");
}

}  // namespace
}  // namespace smla::server
