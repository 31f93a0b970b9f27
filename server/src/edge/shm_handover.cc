#include "shm_handover.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "shm_region.h"
#include "smla/v1/shm_handover.h"
#include "spdlog/spdlog.h"

namespace smla::server::edge {
namespace wire = v1::handover;

absl::StatusOr<std::string> HandoverBox::Offer(OwnedFd object, uint32_t uid, absl::Time now) {
  absl::StatusOr<uint64_t> size = CheckSealedObject(object.get());
  if (!size.ok()) return size.status();
  std::string token = RandomHex(16);
  absl::MutexLock lock(&mu_);
  DropExpired(now);
  if (pending_.size() >= kMaxPending || per_uid_[uid] >= kMaxPendingPerUid) {
    return absl::ResourceExhaustedError(
        absl::StrCat("region handover: too many unclaimed handovers (", kMaxPendingPerUid,
                     " per user, ", kMaxPending, " in all); claim them with RegisterRegion"));
  }
  while (pending_.contains(token)) token = RandomHex(16);
  ++per_uid_[uid];
  pending_[token] = Pending{std::move(object), uid, now + absl::Seconds(wire::kTokenSeconds)};
  return token;
}

absl::StatusOr<OwnedFd> HandoverBox::Claim(const std::string& token, absl::Time now) {
  absl::MutexLock lock(&mu_);
  DropExpired(now);
  auto it = pending_.find(token);
  if (it == pending_.end()) {
    return absl::NotFoundError(
        "handover: no pending region memory has this token (unknown, claimed, or older than "
        "the handover's time limit)");
  }
  OwnedFd object = std::move(it->second.object);
  if (--per_uid_[it->second.uid] == 0) per_uid_.erase(it->second.uid);
  pending_.erase(it);
  return object;
}

size_t HandoverBox::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

void HandoverBox::DropExpired(absl::Time now) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    if (--per_uid_[it->second.uid] == 0) per_uid_.erase(it->second.uid);
    it = pending_.erase(it);
  }
}

absl::StatusOr<std::unique_ptr<HandoverSocket>> HandoverSocket::Start(const std::string& address,
                                                                      HandoverBox* box) {
  std::unique_ptr<HandoverSocket> s(new HandoverSocket());
  s->box_ = box;
  s->address_ = address.empty() ? absl::StrCat("@smla-", getpid(), "-", RandomHex(8)) : address;
  sockaddr_un addr{};
  socklen_t len = 0;
  if (!wire::ToSockaddr(s->address_, &addr, &len)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shm_socket '", s->address_, "': not a Unix socket address"));
  }
  s->socket_.reset(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  s->stop_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  const int on = 1;
  if (!s->socket_.valid() || !s->stop_.valid() ||
      setsockopt(s->socket_.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0) {
    return absl::InternalError(absl::StrCat("region handover socket: ", std::strerror(errno)));
  }
  if (s->address_[0] != '@') {
    // A socket left behind by an earlier server on this path; anything else stays.
    struct stat st {};
    if (lstat(s->address_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(s->address_.c_str());
  }
  if (bind(s->socket_.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return absl::InternalError(
        absl::StrCat("region handover socket ", s->address_, ": bind: ", std::strerror(errno)));
  }
  if (s->address_[0] != '@') s->path_ = s->address_;
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

HandoverSocket::~HandoverSocket() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    if (write(stop_.get(), &one, sizeof one) != sizeof one) {
      spdlog::error("region handover: cannot stop its thread");
    }
    thread_.join();
  }
  if (!path_.empty()) unlink(path_.c_str());
}

void HandoverSocket::Serve() {
  pollfd fds[2] = {{socket_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0 && errno != EINTR) {
      spdlog::error("region handover: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents != 0) HandleOne();
  }
}

void HandoverSocket::HandleOne() {
  constexpr int kMaxFds = 8;  // more are closed by the kernel (MSG_CTRUNC)
  char payload[64];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds) + CMSG_SPACE(sizeof(ucred))];
  sockaddr_un from{};
  iovec iov{payload, sizeof payload};
  msghdr msg{};
  msg.msg_name = &from;
  msg.msg_namelen = sizeof from;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = recvmsg(socket_.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return;
  // Own every descriptor that arrived before looking at anything else, so all are closed.
  std::vector<OwnedFd> received;
  const ucred* cred = nullptr;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET) continue;
    if (c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        received.emplace_back(fd);
      }
    } else if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
      cred = reinterpret_cast<const ucred*>(CMSG_DATA(c));
    }
  }
  // An unbound sender cannot be answered, so nothing it sends is kept.
  if (msg.msg_namelen <= offsetof(sockaddr_un, sun_path) || cred == nullptr) return;
  absl::StatusOr<std::string> token;
  if (static_cast<size_t>(n) != sizeof wire::kRequest - 1 ||
      std::memcmp(payload, wire::kRequest, sizeof wire::kRequest - 1) != 0 ||
      (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || received.size() != 1) {
    token = absl::InvalidArgumentError(
        absl::StrCat("region handover: send \"", wire::kRequest, "\" with exactly one descriptor"));
  } else {
    token = box_->Offer(std::move(received[0]), cred->uid, absl::Now());
  }
  const std::string reply =
      token.ok() ? absl::StrCat("OK ", *token) : absl::StrCat("ERR ", token.status().message());
  if (sendto(socket_.get(), reply.data(), std::min(reply.size(), wire::kMaxReplyBytes),
             MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&from),
             msg.msg_namelen) < 0 &&
      token.ok()) {
    box_->Claim(*token, absl::Now()).IgnoreError();  // nobody can learn the token: drop it
  }
}

}  // namespace smla::server::edge
