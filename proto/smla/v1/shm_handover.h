// How a client hands a region's memory to the server (RegisterRegionRequest.handover). Server
// and client both include this header; it is part of the wire API, like step_ring.h.
//
// A region is a memfd (memfd_create with MFD_ALLOW_SEALING) of at least the registered size,
// sealed as shm_region.h says (its size can never change again). The server refuses anything
// else.
//
// The handover socket is a Unix datagram socket; the server names its address in
// ServerInfo.shm_socket: a filesystem path, or "@name" for the abstract name "name".
//
//   client: binds its own datagram socket (autobind: an abstract address of its own), sends
//           one datagram to the server's address holding kRequest as its bytes and exactly one
//           descriptor (SCM_RIGHTS), and reads one datagram back:
//             "OK <token>"  the server holds the memfd; RegisterRegion(handover = token) maps
//                           it, once, within kTokenSeconds, for whichever tenant calls it
//             "ERR <text>"  refused (not a memfd, seals missing, too many pending, ...)
//   server: checks the descriptor and answers the sender's address. A token is a secret of
//           32 hex characters that only the sender saw; a handover nobody claims in time is
//           dropped.
#pragma once

#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>
#include <string>

namespace smla::v1::handover {

inline constexpr char kRequest[] = "SMLA-REGION-1";
inline constexpr size_t kMaxReplyBytes = 512;
inline constexpr int kTokenSeconds = 30;

// Fills `addr` and `len` from "@name" (abstract) or a path; false when it does not fit.
inline bool ToSockaddr(const std::string& address, sockaddr_un* addr, socklen_t* len) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  const bool abstract = !address.empty() && address[0] == '@';
  // An abstract name has no terminating NUL; a path needs one.
  if (address.empty() || address.size() + (abstract ? 0 : 1) > sizeof(addr->sun_path)) {
    return false;
  }
  std::memcpy(addr->sun_path, address.data(), address.size());
  if (abstract) addr->sun_path[0] = '\0';
  *len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size() + (abstract ? 0 : 1));
  return true;
}

}  // namespace smla::v1::handover
