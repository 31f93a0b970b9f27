// The server's configuration file and the `smla` tool, end to end.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "harness.h"

#ifndef SMLA_TOOL_BINARY
#error "SMLA_TOOL_BINARY must name the smla binary"
#endif

namespace smla::testing {
namespace {

// Runs a command, returning its exit status and standard output.
std::pair<int, std::string> RunCommand(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(ConfigTest, TextFormatFileConfiguresModelsAndLimits) {
  const std::string path = ::testing::TempDir() + "/smla_config_test.txtpb";
  {
    std::ofstream f(path);
    f << R"(
      models { profile: "glm-5.3-flash" tp: 4 page_rows: 32 pool_pages: 40 }
      models { spec: "dsv4.1-flash:tp=8:page_rows=16:pool=16MiB" }
      limits { max_rows_per_step: 1000 batch_wait_us: 1500 stream_max_inflight: 4
               scheduler_spin_us: 0 }
    )";
  }
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({"--config=" + path}, "glm-5.3-flash"));
  auto info = h.client->Info();
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->models_size(), 2);
  EXPECT_EQ(h.model_.tp(), 4);
  EXPECT_EQ(h.model_.heads_per_rank(), 16);
  EXPECT_EQ(h.model_.pool().page_rows(), 32);
  EXPECT_EQ(h.model_.pool().pages_total(), 40);
  EXPECT_EQ(info->models(1).profile(), "dsv4.1-flash");
  EXPECT_EQ(info->models(1).heads_per_rank(), 8);
  EXPECT_EQ(info->limits().max_rows_per_step(), 1000);
  EXPECT_EQ(info->limits().batch_wait_us(), 1500);
  // An explicit 0 in the file is applied (park at once), not taken for "keep the default".
  EXPECT_EQ(info->limits().scheduler_spin_us(), 0);
  EXPECT_EQ(info->limits().stream_max_inflight(), 4);
  // The message limit covers the largest legal step of the largest profile.
  EXPECT_GE(info->limits().max_message_bytes(), int64_t{1000} * 16 * 512 * 2);

  // The step limit from the file is enforced, naming the field.
  ASSERT_TRUE(h.client->CreateSequence("glm-5.3-flash", "s").ok());
  auto r = h.client->Step(h.Make(0, {{"s", 0, 1001, 0}}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("spans[0].num_rows"));
}

// scheduler_spin_us: unset keeps the default (200), a file value applies, and the flag overrides
// the file (as for batch_wait_us).
TEST(ConfigTest, SchedulerSpinFromFileAndFlag) {
  const std::string path = ::testing::TempDir() + "/smla_config_spin_test.txtpb";
  {
    std::ofstream f(path);
    f << "limits { batch_wait_us: 700 scheduler_spin_us: 350 }\n";
  }
  const std::string unset_path = ::testing::TempDir() + "/smla_config_spin_unset_test.txtpb";
  {
    std::ofstream f(unset_path);
    f << "limits { batch_wait_us: 700 }\n";
  }
  struct Case {
    std::vector<std::string> args;
    int64_t want_spin;
  };
  for (const Case& c :
       {Case{{kDsv41, "--config=" + unset_path}, 200}, Case{{kDsv41, "--config=" + path}, 350},
        Case{{kDsv41, "--config=" + path, "--scheduler_spin_us=0"}, 0},
        Case{{kDsv41, "--config=" + path, "--scheduler_spin_us=90"}, 90}}) {
    SCOPED_TRACE(absl::StrJoin(c.args, " "));
    auto server = ServerProcess::Start(c.args);
    ASSERT_TRUE(server.ok()) << server.status();
    auto info = (*server)->Connect()->Info();
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->limits().scheduler_spin_us(), c.want_spin);
    EXPECT_EQ(info->limits().batch_wait_us(), 700);
  }
}

// Every limit flag applies (--max_context, --max_spans_per_step and --max_batch_bytes were once
// parsed and dropped), over the file's value; a negative one stops the server naming the flag.
TEST(ConfigTest, LimitFlagsApplyAndNegativeOnesAreRefused) {
  const std::string path = ::testing::TempDir() + "/smla_config_limits_test.txtpb";
  {
    std::ofstream f(path);
    f << "limits { max_context: 4096 max_spans_per_step: 3 }\n";
  }
  auto server = ServerProcess::Start({kDsv41, "--config=" + path, "--max_context=8192",
                                      "--max_batch_bytes=1048576", "--max_queued_rows=99"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto info = (*server)->Connect()->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->limits().max_context(), 8192);
  EXPECT_EQ(info->limits().max_spans_per_step(), 3);
  EXPECT_EQ(info->limits().max_batch_bytes(), 1048576);
  EXPECT_EQ(info->limits().max_queued_rows(), 99);

  for (const std::string flag : {"--max_batch_rows=-5", "--scheduler_spin_us=-1",
                                 "--tenant_max_pages=-2", "--sequence_idle_timeout=-1s"}) {
    SCOPED_TRACE(flag);
    // `timeout`: a server that took the value would serve until killed (exit 124).
    const auto [status, out] = RunCommand(
        absl::StrCat("timeout 20 ", ServerBinary(),
                     " --backend=cpu --listen=127.0.0.1:0 --metrics_listen= ", flag, " 2>&1"));
    EXPECT_EQ(status, 2) << out;
    const std::string name = flag.substr(0, flag.find('='));
    EXPECT_THAT(out, ::testing::HasSubstr("configuration: INVALID_ARGUMENT: " + name)) << out;
  }
}

TEST(ConfigTest, RepeatedModelFlagsServeEveryModel) {
  auto server = ServerProcess::Start({kGlm53, "--model", "dsv4-flash:tp=4:pool=16MiB"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto info = (*server)->Connect()->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->models_size(), 2);
  EXPECT_EQ(info->models(0).profile(), "glm-5.3-flash");
  EXPECT_EQ(info->models(1).profile(), "dsv4-flash");
  EXPECT_EQ(info->models(1).heads_per_rank(), 16);
}

TEST(ConfigTest, BadConfigurationFailsToStart) {
  const std::string path = ::testing::TempDir() + "/smla_bad_config.txtpb";
  {
    std::ofstream f(path);
    f << "models { profile: \"no-such-model\" }\n";
  }
  EXPECT_FALSE(ServerProcess::Start({"--config=" + path}).ok());
  EXPECT_FALSE(ServerProcess::Start({"--model=dsv4.1-flash:tp=3"}).ok());
}

TEST(ToolTest, InfoHealthAndDemo) {
  auto server = ServerProcess::Start({kDsv41});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string tool =
      absl::StrCat(ToolBinary(SMLA_TOOL_BINARY), " --server=", (*server)->target());
  auto [rc, out] = RunCommand(tool + " health");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out, "SERVING\n");
  std::tie(rc, out) = RunCommand(tool + " info");
  EXPECT_EQ(rc, 0);
  EXPECT_THAT(out, ::testing::HasSubstr("model dsv4.1-flash TP8: 8 heads/rank"));
  std::tie(rc, out) = RunCommand(tool + " demo --context=300 --chunk=128 --decode_steps=3 2>&1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("OK: every output matched the reference"));
  std::tie(rc, out) = RunCommand(tool + " demo --model=no-such-model 2>&1");
  EXPECT_EQ(rc, 2) << out;
  // Out-of-range numbers are usage errors naming the flag, before any call.
  for (const std::string flag :
       {"--sequences=0", "--chunk=0", "--decode_steps=-1", "--timeout_s=0"}) {
    std::tie(rc, out) = RunCommand(tool + " demo " + flag + " 2>&1");
    EXPECT_EQ(rc, 2) << flag << ": " << out;
    EXPECT_THAT(out, ::testing::HasSubstr(flag.substr(0, flag.find('=')) + ": ")) << flag;
  }
}

}  // namespace
}  // namespace smla::testing
