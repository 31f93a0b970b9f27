// RegionRegistry's page-locking hooks and its two-step lookup, without a server: a region is
// pinned once when registered and unpinned exactly when its last user lets go of the mapping.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "edge/shm_region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sealed_fd.h"

namespace smla::server::edge {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kBytes = 8192;

// Registers a fresh memfd for `tenant` and returns the region's name.
std::string Register(RegionRegistry& registry, const std::string& tenant) {
  absl::StatusOr<std::string> name =
      registry.Register(tenant, registry.NewSession(), SealedFd(kBytes), kBytes, nullptr);
  EXPECT_TRUE(name.ok()) << name.status();
  return name.value_or("");
}

struct PinLog {
  std::vector<std::pair<void*, size_t>> pinned;
  std::vector<void*> unpinned;
  absl::Status answer = absl::OkStatus();
  HostPinning Hooks() {
    return HostPinning{[this](void* p, size_t n) {
                         pinned.emplace_back(p, n);
                         return answer;
                       },
                       [this](void* p) { unpinned.push_back(p); }};
  }
};

TEST(ShmPinningTest, PinsOnRegisterAndUnpinsWhenTheLastUserLetsGo) {
  PinLog log;
  RegionRegistry registry(log.Hooks());
  const std::string name = Register(registry, "t1");
  ASSERT_EQ(log.pinned.size(), 1u);
  EXPECT_NE(log.pinned[0].first, nullptr);
  EXPECT_EQ(log.pinned[0].second, kBytes);

  // A step's reference keeps the mapping (and its pin) past the unregistration.
  absl::StatusOr<RegionBytes> held = registry.Resolve("t1", "q", name, 64, 128, 2);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->bytes.data(), static_cast<uint8_t*>(log.pinned[0].first) + 64);
  ASSERT_TRUE(registry.Unregister("t1", name).ok());
  EXPECT_TRUE(log.unpinned.empty());
  held->keep_alive.reset();
  ASSERT_EQ(log.unpinned.size(), 1u);
  EXPECT_EQ(log.unpinned[0], log.pinned[0].first);
}

TEST(ShmPinningTest, AFailedPinStillRegistersAndNeverUnpins) {
  PinLog log;
  log.answer = absl::InternalError("no page-locking here");
  {
    RegionRegistry registry(log.Hooks());
    const std::string name = Register(registry, "t1");
    EXPECT_EQ(log.pinned.size(), 1u);
    EXPECT_TRUE(registry.Resolve("t1", "q", name, 0, kBytes, 1).ok());
  }
  EXPECT_TRUE(log.unpinned.empty());
}

TEST(ShmPinningTest, LookupChecksOwnerAndSliceChecksBounds) {
  RegionRegistry registry;
  const std::string name = Register(registry, "t1");
  EXPECT_EQ(registry.Lookup("t2", "q", name).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(registry.Lookup("t1", "q", "/smla-none").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::shared_ptr<ShmMapping>> m = registry.Lookup("t1", "q", name);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(RegionRegistry::Slice(**m, "q", name, kBytes - 8, 8, 4).ok());
  absl::StatusOr<std::span<uint8_t>> past = RegionRegistry::Slice(**m, "q", name, kBytes - 8, 9, 1);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past.status().message(), HasSubstr("outside region"));
  // offset + size wrapping around 2^64 must not pass.
  EXPECT_FALSE(RegionRegistry::Slice(**m, "q", name, 16, ~uint64_t{0} - 7, 1).ok());
  absl::StatusOr<std::span<uint8_t>> odd = RegionRegistry::Slice(**m, "q", name, 2, 4, 4);
  EXPECT_THAT(odd.status().message(), HasSubstr("not a multiple of 4"));
}

// A region past the pinned-bytes budget is served unpinned; unpinning one frees its share.
TEST(ShmPinningTest, BudgetKeepsPinnedBytesBounded) {
  PinLog log;
  HostPinning budgeted = BudgetedPinning(log.Hooks(), 3 * kBytes);
  int a = 0, b = 0, c = 0;
  EXPECT_TRUE(budgeted.pin(&a, 2 * kBytes).ok());
  const absl::Status over = budgeted.pin(&b, 2 * kBytes);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_THAT(std::string(over.message()), HasSubstr("--max_pinned_bytes"));
  EXPECT_EQ(log.pinned.size(), 1u);  // the refused pin never reached the backend
  EXPECT_TRUE(budgeted.pin(&c, kBytes).ok());
  budgeted.unpin(&a);
  EXPECT_EQ(log.unpinned, std::vector<void*>{&a});
  EXPECT_TRUE(budgeted.pin(&b, 2 * kBytes).ok());
  // A backend refusal gives its share back.
  log.answer = absl::InternalError("no");
  budgeted.unpin(&b);
  EXPECT_FALSE(budgeted.pin(&a, 2 * kBytes).ok());
  log.answer = absl::OkStatus();
  EXPECT_TRUE(budgeted.pin(&a, 2 * kBytes).ok());
}

}  // namespace
}  // namespace smla::server::edge
