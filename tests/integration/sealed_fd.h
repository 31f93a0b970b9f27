// A sealed memfd (client::SealedMemfd), owned the way the server owns a handed-over one.
#pragma once

#include <cstdint>

#include "edge/owned_fd.h"
#include "gtest/gtest.h"
#include "smla/client/shm.h"

namespace smla::server::edge {

inline OwnedFd SealedFd(uint64_t bytes) {
  absl::StatusOr<int> fd = client::SealedMemfd("edge-test", bytes);
  EXPECT_TRUE(fd.ok()) << fd.status();
  return OwnedFd(fd.ok() ? *fd : -1);
}

}  // namespace smla::server::edge
