// The server's end of the region handover (smla/v1/shm_handover.h): a Unix datagram socket on
// which local clients send sealed memfds, and the box that holds each one until the
// RegisterRegion call that names its token claims it.
//
// Anyone who can reach the socket may send descriptors, so the box is bounded: a descriptor
// that fails CheckSealedObject is closed at once, at most kMaxPendingPerUid unclaimed ones per
// sending user and kMaxPending in all are held, and an unclaimed one is closed after
// v1::handover::kTokenSeconds. Only the sender learns a token; claiming it is the only way to
// register the memory it stands for.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "owned_fd.h"

namespace smla::server::edge {

class HandoverBox {
 public:
  static constexpr size_t kMaxPending = 1024;
  static constexpr size_t kMaxPendingPerUid = 64;

  // Checks `object` (CheckSealedObject) and keeps it; returns its token. INVALID_ARGUMENT for
  // a bad object, RESOURCE_EXHAUSTED past the bounds (after dropping expired handovers).
  absl::StatusOr<std::string> Offer(OwnedFd object, uint32_t uid, absl::Time now);
  // Takes the object of `token` out of the box; NOT_FOUND when no live handover has it.
  absl::StatusOr<OwnedFd> Claim(const std::string& token, absl::Time now);
  size_t pending() const;

 private:
  struct Pending {
    OwnedFd object;
    uint32_t uid = 0;
    absl::Time expires;
  };
  void DropExpired(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, size_t> per_uid_ ABSL_GUARDED_BY(mu_);
};

// The socket and its thread; stops (and closes the socket) on destruction.
class HandoverSocket {
 public:
  // Binds `address` ("@name" abstract or a path; empty: an abstract name of this process) and
  // starts serving `box`, which must outlive the socket.
  static absl::StatusOr<std::unique_ptr<HandoverSocket>> Start(const std::string& address,
                                                               HandoverBox* box);
  ~HandoverSocket();
  HandoverSocket(const HandoverSocket&) = delete;
  HandoverSocket& operator=(const HandoverSocket&) = delete;

  // The bound address, as clients name it (ServerInfo.shm_socket).
  const std::string& address() const { return address_; }

 private:
  HandoverSocket() = default;
  void Serve();
  // Handles one datagram: its descriptors are closed unless the box keeps one.
  void HandleOne();

  HandoverBox* box_ = nullptr;
  std::string address_;
  std::string path_;  // a filesystem socket to remove on destruction
  OwnedFd socket_;
  OwnedFd stop_;  // eventfd
  std::thread thread_;
};

}  // namespace smla::server::edge
