// Runs the real smla-server binary on 127.0.0.1 with free ports for a test, and reads what
// it prints. The binary's path comes from CMake (SMLA_SERVER_BINARY).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "smla/client/client.h"

namespace smla::testing {

// The smla-server binary the tests run: $SMLA_SERVER_BINARY (e.g. a GPU build carried to a GPU
// machine, with SMLA_TEST_BACKEND=cuda) or the build's own.
std::string ServerBinary();
// The smla tool the tests run: $SMLA_TOOL_BINARY or `built` (the build's own, from CMake).
std::string ToolBinary(const char* built);

// Under AddressSanitizer freed memory sits in a quarantine, so the server's RSS does not follow
// its live memory: RSS bounds are checked only in normal builds (the test binary is built like
// the server).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kRssMeaningful = false;
#else
inline constexpr bool kRssMeaningful = true;
#endif

// The resident memory of process `pid` (VmRSS), or -1.
int64_t RssBytes(pid_t pid);

class ServerProcess {
 public:
  // Starts `smla-server --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 --backend cpu` (the
  // environment variables SMLA_SERVER_BINARY and SMLA_TEST_BACKEND override both) with
  // abseil's lock-order checks on, plus `args`, and waits for its "listening on" line. Its log
  // (stderr) goes to `log_path` when one is given, else to the test's stderr. `open_files` > 0 sets
  // the soft and hard RLIMIT_NOFILE of the server to it.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(const std::vector<std::string>& args,
                                                              const std::string& log_path = "",
                                                              int open_files = 0);
  ~ServerProcess();  // SIGKILL if still running

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  int metrics_port() const { return metrics_port_; }
  std::string target() const;
  std::unique_ptr<client::Client> Connect() const;

  // Sends SIGTERM and waits (up to `timeout_s`) for the exit status; -1 on timeout or signal.
  int Terminate(int timeout_s = 30);
  void Signal(int sig);
  // Waits for the process to exit; -1 on timeout or death by signal.
  int WaitExit(int timeout_s);

  // GET /metrics body, or an error.
  absl::StatusOr<std::string> ScrapeMetrics() const;

 private:
  ServerProcess() = default;
  pid_t pid_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
  bool exited_ = false;
  int exit_status_ = -1;
};

// GET http://127.0.0.1:port/path; returns the body of a 200 response.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

}  // namespace smla::testing
