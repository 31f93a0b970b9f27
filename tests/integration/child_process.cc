#include "child_process.h"

#include <unistd.h>

#include <cstdlib>

#include "gtest/gtest.h"

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

}  // namespace smla::testing
