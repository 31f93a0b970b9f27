#include "smla/base/status_macros.h"

#include <memory>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace smla {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<std::unique_ptr<std::string>> Boxed(bool ok) {
  if (!ok) return absl::NotFoundError("no box");
  return std::make_unique<std::string>("box");
}

absl::Status Check(int x, int* steps) {
  SMLA_RETURN_IF_ERROR(Half(x).status());
  ++*steps;
  SMLA_RETURN_IF_ERROR(absl::OkStatus());
  ++*steps;
  return absl::OkStatus();
}

// Two uses in one scope, a declaration and an assignment, in a StatusOr-returning function.
absl::StatusOr<int> Quarter(int x) {
  SMLA_ASSIGN_OR_RETURN(int half, Half(x));
  int quarter = -1;
  SMLA_ASSIGN_OR_RETURN(quarter, Half(half));
  return quarter;
}

absl::StatusOr<std::string> Unbox(bool ok) {
  SMLA_ASSIGN_OR_RETURN(std::unique_ptr<std::string> box, Boxed(ok));  // move-only
  return *box;
}

TEST(StatusMacrosTest, ReturnIfErrorReturnsTheFirstError) {
  int steps = 0;
  EXPECT_TRUE(Check(4, &steps).ok());
  EXPECT_EQ(steps, 2);
  steps = 0;
  const absl::Status st = Check(3, &steps);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "odd");
  EXPECT_EQ(steps, 0);
}

TEST(StatusMacrosTest, AssignOrReturnAssignsOrPropagates) {
  EXPECT_EQ(Quarter(8).value(), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);  // 3 is odd
  EXPECT_EQ(Quarter(5).status().message(), "odd");
  EXPECT_EQ(Unbox(true).value(), "box");
  EXPECT_EQ(Unbox(false).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace smla
