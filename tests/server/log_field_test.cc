#include "smla/server/log_field.h"

#include <string>

#include "gtest/gtest.h"

namespace smla::server {
namespace {

TEST(LogFieldTest, PrintableTextIsKept) {
  EXPECT_EQ(LogField("seq-1_a.b/c 'x'"), "seq-1_a.b/c 'x'");
  EXPECT_EQ(LogField(""), "");
}

TEST(LogFieldTest, ControlsQuotesAndBytesPastAsciiAreEscaped) {
  EXPECT_EQ(LogField("a\nb\rc\td"), "a\\nb\\rc\\td");
  EXPECT_EQ(LogField("q\"\\"), "q\\\"\\\\");
  EXPECT_EQ(LogField(std::string("\x00\x1b\x7f\xff", 4)), "\\x00\\x1b\\x7f\\xff");
  // Whatever the bytes, the field is one line of printable ASCII without a bare quote.
  std::string every;
  for (int c = 0; c < 256; ++c) every += static_cast<char>(c);
  const std::string field = LogField(every, every.size());
  for (size_t i = 0; i < field.size(); ++i) {
    const auto c = static_cast<unsigned char>(field[i]);
    ASSERT_TRUE(c >= 0x20 && c < 0x7f) << "byte " << i;
    if (c == '"') {
      ASSERT_EQ(field[i - 1], '\\') << "byte " << i;
    }
  }
}

TEST(LogFieldTest, LongTextIsCutAndSaysHowMuchWasLeftOut) {
  EXPECT_EQ(LogField(std::string(300, 'x')), std::string(256, 'x') + "...(+44 bytes)");
  EXPECT_EQ(LogField(std::string(10 << 20, '\n'), 4), "\\n\\n\\n\\n...(+10485756 bytes)");
  EXPECT_EQ(LogField("abcd", 4), "abcd");
}

TEST(LogFieldTest, BoundedCutsWithoutEscaping) {
  EXPECT_EQ(Bounded("a\nb", 8), "a\nb");
  EXPECT_EQ(Bounded(std::string(2000, 'm'), 1000), std::string(1000, 'm') + "...(+1000 bytes)");
}

}  // namespace
}  // namespace smla::server
