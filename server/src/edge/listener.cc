#include "listener.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "edge_metrics.h"
#include "spdlog/spdlog.h"

namespace smla::server::edge {
namespace {

enum Kind : uint64_t { kWake = 1, kListening = 2, kWatch = 3 };

uint64_t Tag(Kind kind, int fd) { return (uint64_t{kind} << 32) | static_cast<uint32_t>(fd); }

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The first and the longest pause after a failed accept.
constexpr int64_t kFirstPauseMs = 50;
constexpr int64_t kLongestPauseMs = 1000;
// Accepts per wake-up, so hang-ups and commands are not starved by a flood of connects.
constexpr int kAcceptsPerWake = 256;

int OpenReserve() { return open("/dev/null", O_RDONLY | O_CLOEXEC); }

}  // namespace

absl::StatusOr<std::unique_ptr<ConnectionListener>> ConnectionListener::Start(
    const std::string& host_port, int32_t max_connections, Handoff handoff) {
  absl::StatusOr<std::pair<std::string, int>> hp = SplitHostPort(host_port);
  if (!hp.ok()) return hp.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int gai =
      getaddrinfo(hp->first.c_str(), std::to_string(hp->second).c_str(), &hints, &found);
  if (gai != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host_port, ": ", gai_strerror(gai)));
  }
  std::unique_ptr<ConnectionListener> l(new ConnectionListener());
  l->max_connections_ = std::max<int32_t>(1, max_connections);
  l->handoff_ = std::move(handoff);
  std::string error;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    sockaddr_storage addr{};
    std::memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    if (l->port_ != 0) {  // port 0: every address takes the port the first one got
      const uint16_t p = htons(static_cast<uint16_t>(l->port_));
      if (ai->ai_family == AF_INET) reinterpret_cast<sockaddr_in*>(&addr)->sin_port = p;
      if (ai->ai_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = p;
    }
    const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), ai->ai_addrlen) != 0 ||
        listen(fd, SOMAXCONN) != 0) {
      // A second address may already be covered by a dual-stack first one.
      error = std::strerror(errno);
      close(fd);
      continue;
    }
    if (l->port_ == 0) {
      sockaddr_storage bound{};
      socklen_t len = sizeof bound;
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      l->port_ =
          ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    }
    l->listeners_.push_back(fd);
  }
  freeaddrinfo(found);
  if (l->listeners_.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host_port, ": ", error));
  }
  l->epoll_ = epoll_create1(EPOLL_CLOEXEC);
  l->wake_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  l->reserve_ = OpenReserve();
  if (l->epoll_ < 0 || l->wake_ < 0) {
    return absl::InternalError(absl::StrCat("listener: ", std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(kWake, l->wake_);
  epoll_ctl(l->epoll_, EPOLL_CTL_ADD, l->wake_, &ev);
  for (int fd : l->listeners_) {
    ev.data.u64 = Tag(kListening, fd);
    epoll_ctl(l->epoll_, EPOLL_CTL_ADD, fd, &ev);
  }
  l->thread_ = std::thread([p = l.get()] { p->Loop(); });
  return l;
}

ConnectionListener::~ConnectionListener() {
  if (thread_.joinable()) {
    Run(Command::kExit);
    thread_.join();
  }
  for (int fd : listeners_) close(fd);
  for (int fd : watches_) close(fd);
  for (int fd : {epoll_, wake_, reserve_}) {
    if (fd >= 0) close(fd);
  }
}

void ConnectionListener::StopAccepting() { Run(Command::kStopAccepting); }
void ConnectionListener::DisconnectAll() { Run(Command::kDisconnectAll); }

void ConnectionListener::Run(Command c) {
  absl::MutexLock run(&run_mu_);
  absl::MutexLock lock(&mu_);
  command_ = c;
  done_ = false;
  const uint64_t one = 1;
  if (write(wake_, &one, sizeof one) < 0) {
    spdlog::error("listener: cannot wake its thread: {}", std::strerror(errno));
  }
  mu_.Await(absl::Condition(&done_));
}

void ConnectionListener::Loop() {
  epoll_event events[64];
  for (;;) {
    int timeout_ms = -1;
    if (paused_) timeout_ms = static_cast<int>(std::max<int64_t>(0, resume_at_ms_ - NowMs()));
    const int n = epoll_wait(epoll_, events, 64, timeout_ms);
    if (paused_ && NowMs() >= resume_at_ms_) {
      paused_ = false;
      SetAccepting(true);
    }
    for (int i = 0; i < n; ++i) {
      const Kind kind = static_cast<Kind>(events[i].data.u64 >> 32);
      const int fd = static_cast<int>(events[i].data.u64 & 0xffffffffu);
      if (kind == kListening) {
        if (!paused_) AcceptAll(fd);
      } else if (kind == kWatch) {
        Untrack(fd);
      } else if (kind == kWake) {
        uint64_t count = 0;
        if (read(wake_, &count, sizeof count) < 0) continue;
        Command c;
        {
          absl::MutexLock lock(&mu_);
          c = command_;
        }
        if (c == Command::kStopAccepting) {
          for (int l : listeners_) {
            epoll_ctl(epoll_, EPOLL_CTL_DEL, l, nullptr);
            close(l);
          }
          listeners_.clear();
        } else if (c == Command::kDisconnectAll) {
          for (int w : watches_) shutdown(w, SHUT_RDWR);
        }
        absl::MutexLock lock(&mu_);
        done_ = true;
        if (c == Command::kExit) return;
      }
    }
  }
}

void ConnectionListener::AcceptAll(int listener_fd) {
  for (int i = 0; i < kAcceptsPerWake; ++i) {
    const int fd = accept4(listener_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      pause_ms_ = 0;
      if (open_connections() >= max_connections_) {
        close(fd);
        Refused("at the connection cap");
      } else {
        Track(fd, listener_fd);
      }
      continue;
    }
    const int err = errno;
    switch (err) {
      case EAGAIN:
        return;
      case EINTR:
      case ECONNABORTED:
      case EPROTO:
      case EPERM:
        continue;  // this connection's own failure
      case EMFILE:
      case ENFILE:
      case ENOBUFS:
      case ENOMEM:
        // The waiting connection would sit in the backlog until its client gives up: free the
        // reserve to accept and close it, so the client learns at once.
        if (reserve_ >= 0) {
          close(reserve_);
          const int shed = accept4(listener_fd, nullptr, nullptr, SOCK_CLOEXEC);
          if (shed >= 0) close(shed);
          reserve_ = OpenReserve();
        }
        Refused(std::strerror(err));
        Pause();
        return;
      default:
        spdlog::error("listener: accept4: {}", std::strerror(err));
        Pause();
        return;
    }
  }
}

void ConnectionListener::Track(int fd, int listener_fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const int watch = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  epoll_event ev{};
  ev.events = 0;  // EPOLLHUP and EPOLLERR are always reported
  ev.data.u64 = Tag(kWatch, watch);
  if (watch < 0 || epoll_ctl(epoll_, EPOLL_CTL_ADD, watch, &ev) != 0) {
    const int err = errno;
    if (watch >= 0) close(watch);
    close(fd);
    Refused(std::strerror(err));
    Pause();
    return;
  }
  watches_.insert(watch);
  open_.fetch_add(1, std::memory_order_relaxed);
  handoff_(fd, listener_fd);
}

void ConnectionListener::Untrack(int watch) {
  if (watches_.erase(watch) == 0) return;
  epoll_ctl(epoll_, EPOLL_CTL_DEL, watch, nullptr);
  close(watch);
  open_.fetch_sub(1, std::memory_order_relaxed);
}

void ConnectionListener::Refused(const char* why) {
  refused_.fetch_add(1, std::memory_order_relaxed);
  const int64_t now = NowMs();
  if (now - last_warning_ms_ < 1000) return;
  last_warning_ms_ = now;
  spdlog::warn("connections: refusing new ones ({}); {} open, cap {}, {} refused so far", why,
               open_connections(), max_connections_, refused_connections());
}

void ConnectionListener::Pause() {
  pause_ms_ = pause_ms_ == 0 ? kFirstPauseMs : std::min(2 * pause_ms_, kLongestPauseMs);
  paused_ = true;
  resume_at_ms_ = NowMs() + pause_ms_;
  SetAccepting(false);
}

void ConnectionListener::SetAccepting(bool on) {
  for (int fd : listeners_) {
    epoll_event ev{};
    ev.events = on ? uint32_t{EPOLLIN} : 0u;
    ev.data.u64 = Tag(kListening, fd);
    epoll_ctl(epoll_, EPOLL_CTL_MOD, fd, &ev);
  }
}

}  // namespace smla::server::edge
