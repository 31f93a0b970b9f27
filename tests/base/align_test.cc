#include "smla/base/align.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace smla {
namespace {

static_assert(AlignUp(37, 16) == 48);
static_assert(IsPowerOfTwo(64) && !IsPowerOfTwo(0) && !IsPowerOfTwo(48));

TEST(AlignTest, AlignUpRoundsToTheNextMultiple) {
  EXPECT_EQ(AlignUp(0, 16), 0);
  EXPECT_EQ(AlignUp(1, 16), 16);
  EXPECT_EQ(AlignUp(16, 16), 16);
  EXPECT_EQ(AlignUp(17, 16), 32);
  EXPECT_EQ(AlignUp(uint64_t{65}, 64), uint64_t{128});
  // Not only powers of two: fp8_dsv4 pages pad to multiples of 576 bytes.
  EXPECT_EQ(AlignUp(int64_t{584} * 64, 576), int64_t{65} * 576);
  // Past 32 bits in the caller's type.
  EXPECT_EQ(AlignUp(int64_t{1} << 40 | 1, 256), (int64_t{1} << 40) + 256);
}

TEST(AlignTest, CeilDivCountsPartsThatCover) {
  EXPECT_EQ(CeilDiv(0, 16), 0);
  EXPECT_EQ(CeilDiv(1, 16), 1);
  EXPECT_EQ(CeilDiv(16, 16), 1);
  EXPECT_EQ(CeilDiv(17, 16), 2);
  EXPECT_EQ(CeilDiv(int64_t{2048}, 32), int64_t{64});
  EXPECT_EQ(CeilDiv(int64_t{1} << 40 | 1, 1 << 20), (int64_t{1} << 20) + 1);
}

TEST(AlignTest, IsAlignedOnIntegers) {
  EXPECT_TRUE(IsAligned(0, 64));
  EXPECT_TRUE(IsAligned(128, 64));
  EXPECT_FALSE(IsAligned(100, 64));
  EXPECT_TRUE(IsAligned(1152, 576));
  EXPECT_FALSE(IsAligned(size_t{1151}, 576));
}

TEST(AlignTest, IsAlignedOnAddresses) {
  alignas(64) static uint8_t bytes[128];
  EXPECT_TRUE(IsAligned(bytes, 64));
  EXPECT_TRUE(IsAligned(bytes + 4, 4));
  EXPECT_FALSE(IsAligned(bytes + 4, 64));
  const int32_t* ints = reinterpret_cast<const int32_t*>(bytes + 2);
  EXPECT_FALSE(IsAligned(ints, alignof(int32_t)));
}

TEST(AlignTest, IsPowerOfTwo) {
  EXPECT_TRUE(IsPowerOfTwo(1));
  EXPECT_TRUE(IsPowerOfTwo(int64_t{1} << 40));
  EXPECT_FALSE(IsPowerOfTwo(0));
  EXPECT_FALSE(IsPowerOfTwo(-8));
  EXPECT_FALSE(IsPowerOfTwo(96));
}

}  // namespace
}  // namespace smla
