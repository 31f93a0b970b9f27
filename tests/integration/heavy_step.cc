#include "heavy_step.h"

#include <chrono>
#include <thread>

namespace smla::testing {

v1::StepRequest PrepareHeavy(Harness& h) {
  EXPECT_TRUE(h.client->CreateSequence(h.ModelName(), "heavy").ok());
  h.StepAndCheck(h.Make(0, {{"heavy", 0, kHeavyBase, 0}}));
  return h.Make(0, {{"heavy", kHeavyBase, kHeavyRows, 0}});
}

int64_t PagesUsed(Harness& h) {
  auto info = h.client->Info();
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? info->models(0).pool().pages_used() : -1;
}

void WaitLaunched(Harness& h, int64_t pages_before, int64_t pages) {
  if (pages < 0) pages = kHeavyRows / h.model_.pool().page_rows();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (PagesUsed(h) < pages_before + pages) {
    if (std::chrono::steady_clock::now() >= until) {
      ADD_FAILURE() << "no launch reserved " << pages << " pages within 30 s";
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::future<absl::StatusOr<v1::StepResponse>> LaunchHeavy(Harness& h, const v1::StepRequest& heavy,
                                                          absl::Duration timeout) {
  const int64_t before = PagesUsed(h);
  auto running = std::async(std::launch::async,
                            [&h, &heavy, timeout] { return h.client->Step(heavy, timeout); });
  WaitLaunched(h, before);
  EXPECT_EQ(h.Length("heavy", 0), kHeavyBase) << "the heavy step ended before the test ran";
  return running;
}

}  // namespace smla::testing
