// The gRPC port's listening sockets, owned by the server instead of gRPC: gRPC 1.51 stops its
// accept loop for good at the first accept4() failure other than EAGAIN (EMFILE once descriptors
// run out), after which the server never takes a connection again. Here, as in nginx, libuv and
// gRPC's own later fix:
// - open connections are capped (`max_connections`); one past the cap is accepted and closed at
//   once, so the client fails fast instead of waiting in the backlog;
// - when accept4() fails for want of descriptors or memory, a reserved descriptor is freed to
//   accept and close one waiting connection, and accepting pauses briefly (doubling up to 1 s)
//   instead of spinning; it always resumes.
// Accepted connections go to `handoff` (gRPC's external connection acceptor). The listener
// keeps a duplicate of each to count it: gRPC shuts a connection's socket down before closing
// it, which the duplicate sees as a hang-up. The duplicates also let shutdown close every
// connection at once (DisconnectAll).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace smla::server::edge {

class ConnectionListener {
 public:
  // Takes ownership of `fd`, an accepted connection of the listening socket `listener_fd`.
  using Handoff = std::function<void(int fd, int listener_fd)>;

  // Binds every address of HOST:PORT (port 0 picks a free one, the same for all) and starts
  // accepting.
  static absl::StatusOr<std::unique_ptr<ConnectionListener>> Start(const std::string& host_port,
                                                                   int32_t max_connections,
                                                                   Handoff handoff);
  ~ConnectionListener();

  int port() const { return port_; }
  int64_t open_connections() const { return open_.load(std::memory_order_relaxed); }
  // Connections closed at once: past the cap, or for want of descriptors.
  int64_t refused_connections() const { return refused_.load(std::memory_order_relaxed); }

  // Closes the listening sockets: new connects are refused. Returns once they are closed.
  void StopAccepting();
  // Shuts down every open connection (the peer sees it closed; gRPC then closes its side).
  void DisconnectAll();

 private:
  enum class Command { kNone, kStopAccepting, kDisconnectAll, kExit };

  ConnectionListener() = default;
  void Loop();
  void AcceptAll(int listener_fd);
  void Track(int fd, int listener_fd);
  void Untrack(int watch);
  void Refused(const char* why);
  // Stops accepting for the current back-off, then doubles it.
  void Pause();
  void SetAccepting(bool on);
  // Has the loop thread carry out `c`; returns when it has.
  void Run(Command c);

  int32_t max_connections_ = 0;
  Handoff handoff_;
  std::vector<int> listeners_;  // touched by the loop thread only, once started
  int epoll_ = -1;
  int wake_ = -1;     // eventfd: a command is waiting
  int reserve_ = -1;  // freed to shed one connection when descriptors run out
  int port_ = 0;
  // The fields below are the loop thread's alone.
  std::unordered_set<int> watches_;  // the duplicates
  bool paused_ = false;
  int64_t pause_ms_ = 0;  // the last back-off; 0 after a successful accept
  int64_t resume_at_ms_ = 0;
  int64_t last_warning_ms_ = 0;
  std::atomic<int64_t> open_{0};
  std::atomic<int64_t> refused_{0};
  absl::Mutex run_mu_;  // one command at a time
  absl::Mutex mu_;
  Command command_ ABSL_GUARDED_BY(mu_) = Command::kNone;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace smla::server::edge
