#include "child_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "heavy_step.h"

namespace smla::testing {

void ConnectChild(ChildClient* out) {
  const char* target = std::getenv("SMLA_FAULT_CHILD_TARGET");
  if (target == nullptr) return;
  client::ClientOptions o;
  o.target = target;
  auto c = client::Client::Connect(o);
  ASSERT_TRUE(c.ok());
  auto info = (*c)->Info();
  ASSERT_TRUE(info.ok());
  out->model = info->models(0);
  out->client = *std::move(c);
}

pid_t StartChild(const std::string& target, const std::string& test) {
  // Built before the fork: the child of a threaded process must not allocate before exec.
  const std::string filter = "--gtest_filter=" + test;
  const pid_t child = fork();
  if (child == 0) {
    setenv("SMLA_FAULT_CHILD_TARGET", target.c_str(), 1);
    execl("/proc/self/exe", "child_test", filter.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return child;
}

int32_t OwnerStepRows(const v1::ModelInfo& model) { return 2 * model.pool().page_rows(); }

v1::StepRequest OwnerStep(const v1::ModelInfo& model) {
  std::mt19937_64 rng(11);
  return client::MakeStep(model, 0, {{"owner", 0, OwnerStepRows(model), 0}}, {}, rng);
}

void SendUntilKilled(client::Client& client, const v1::StepRequest& step) {
  static_cast<void>(client.Step(step));
  for (;;) pause();
}

int64_t KillOwnerMidStep(Harness& h, const std::string& test) {
  const int64_t rows = OwnerStepRows(h.model_);
  const int64_t pages_before = PagesUsed(h);
  const pid_t child = StartChild(h.server->target(), test);
  EXPECT_GT(child, 0);
  if (child <= 0) return -1;
  WaitLaunched(h, pages_before, 2);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  int64_t owner = -1;
  for (int i = 0; i < 100 && owner != rows; ++i) {
    auto len = h.client->Length({h.ModelName(), "owner"}, 0);
    owner = len.ok() ? *len : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return owner;
}

}  // namespace smla::testing
