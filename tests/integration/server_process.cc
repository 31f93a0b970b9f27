#include "server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "httplib.h"

#ifndef SMLA_SERVER_BINARY
#error "SMLA_SERVER_BINARY must name the smla-server binary"
#endif

namespace smla::testing {

int64_t RssBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      int64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
    in.ignore(1 << 20, '\n');
  }
  return -1;
}

std::string ServerBinary() {
  const char* binary = std::getenv("SMLA_SERVER_BINARY");
  return binary != nullptr ? binary : SMLA_SERVER_BINARY;
}

std::string ToolBinary(const char* built) {
  const char* binary = std::getenv("SMLA_TOOL_BINARY");
  return binary != nullptr ? binary : built;
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::vector<std::string>& args, const std::string& log_path, int open_files) {
  const int log_fd = log_path.empty()
                         ? -1
                         : open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (!log_path.empty() && log_fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", log_path));
  }
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    if (log_fd >= 0) close(log_fd);
    return absl::InternalError("pipe failed");
  }
  const char* backend = std::getenv("SMLA_TEST_BACKEND");
  std::vector<std::string> argv_s = {
      ServerBinary(),
      "--listen=127.0.0.1:0",
      "--metrics_listen=127.0.0.1:0",
      absl::StrCat("--backend=", backend != nullptr ? backend : "cpu"),
      "--log_level=info",
      "--mutex_deadlock_checks"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    if (log_fd >= 0) dup2(log_fd, STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    if (open_files > 0) {
      const rlimit limit{static_cast<rlim_t>(open_files), static_cast<rlim_t>(open_files)};
      if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(126);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  if (log_fd >= 0) close(log_fd);
  std::unique_ptr<ServerProcess> p(new ServerProcess());
  p->pid_ = pid;
  // The first stdout line says where it listens; the rest of stdout is drained by a thread.
  std::string line;
  char c;
  while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
  std::thread([fd = out[0]] {
    char buf[256];
    while (read(fd, buf, sizeof buf) > 0) {
    }
    close(fd);
  }).detach();
  // "smla-server listening on 127.0.0.1:PORT (metrics 127.0.0.1:MPORT, backend NAME)"
  int port = 0, metrics_port = 0;
  char served_by[32] = {0};
  if (std::sscanf(line.c_str(),
                  "smla-server listening on 127.0.0.1:%d (metrics 127.0.0.1:%d, backend %31[a-z])",
                  &port, &metrics_port, served_by) != 3) {
    return absl::InternalError(absl::StrCat("server did not start; first line: '", line, "'"));
  }
  p->port_ = port;
  p->metrics_port_ = metrics_port;
  return p;
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

std::string ServerProcess::target() const { return absl::StrCat("127.0.0.1:", port_); }

std::unique_ptr<client::Client> ServerProcess::Connect() const {
  client::ClientOptions o;
  o.target = target();
  o.timeout = absl::Seconds(600);  // generous: sanitizer builds run steps 20-50x slower
  return *client::Client::Connect(o);
}

void ServerProcess::Signal(int sig) { kill(pid_, sig); }

int ServerProcess::WaitExit(int timeout_s) {
  if (exited_) return exit_status_;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exited_ = true;
      exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      return exit_status_;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

int ServerProcess::Terminate(int timeout_s) {
  Signal(SIGTERM);
  return WaitExit(timeout_s);
}

absl::StatusOr<std::string> ServerProcess::ScrapeMetrics() const {
  return HttpGet(metrics_port_, "/metrics");
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  httplib::Client http("127.0.0.1", port);
  http.set_connection_timeout(10);
  http.set_read_timeout(30);
  const httplib::Result res = http.Get(path);
  if (!res) {
    return absl::UnavailableError(
        absl::StrCat("GET 127.0.0.1:", port, path, " failed: ", httplib::to_string(res.error())));
  }
  if (res->status != 200) {
    return absl::InternalError(
        absl::StrCat("GET ", path, ": HTTP ", res->status, ": ", res->body.substr(0, 200)));
  }
  return res->body;
}

}  // namespace smla::testing
