#include "smla/base/strings.h"

#include <string>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace smla {
namespace {

TEST(StringsTest, SvViewsTheSameBytes) {
  const std::string text = "fp8_dsv4 rows";
  const std::string_view view(text.data(), 8);
  const absl::string_view a = Sv(view);
  EXPECT_EQ(a.data(), text.data());
  EXPECT_EQ(a.size(), 8u);
  EXPECT_TRUE(absl::EqualsIgnoreCase(Sv("FP8_DSV4"), a));
  EXPECT_EQ(absl::StrFormat("[%s]", Sv(view)), "[fp8_dsv4]");
}

TEST(StringsTest, CatTakesStdStringViews) {
  const std::string_view model = "dsv4.1-flash";
  const std::string owned = "TP";
  EXPECT_EQ(Cat(model, " ", owned, 4, " ", std::string_view("decode")), "dsv4.1-flash TP4 decode");
  EXPECT_EQ(Cat(), "");
  // A view of part of a string stops at its end, not at a terminator.
  EXPECT_EQ(Cat(std::string_view("glm-5.3-flash").substr(0, 7)), "glm-5.3");
}

}  // namespace
}  // namespace smla
