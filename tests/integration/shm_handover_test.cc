// The region handover without a gRPC server: only sealed memfds are taken (so no client can
// make a mapping fault), the box of unclaimed handovers is bounded and forgets, tokens work
// once, and the registry names every region itself.
#include "edge/shm_handover.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "edge/shm_region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sealed_fd.h"
#include "smla/client/shm.h"
#include "smla/v1/shm_handover.h"

namespace smla::server::edge {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr uint64_t kBytes = 8192;

OwnedFd Sealed() { return SealedFd(kBytes); }

// A memfd of kBytes with exactly `seals` added (0: none).
OwnedFd Memfd(int seals) {
  OwnedFd fd(memfd_create("handover-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(ftruncate(fd.get(), kBytes), 0);
  if (seals != 0) {
    EXPECT_EQ(fcntl(fd.get(), F_ADD_SEALS, seals), 0);
  }
  return fd;
}

void ExpectRefused(const absl::StatusOr<uint64_t>& got, const std::string& text) {
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr(text));
}

TEST(ShmHandoverTest, OnlySealedMemfdsAreTaken) {
  ExpectRefused(CheckSealedObject(Memfd(0).get()), "lack F_SEAL_SHRINK");
  ExpectRefused(CheckSealedObject(Memfd(F_SEAL_SHRINK).get()), "lack F_SEAL_SHRINK, F_SEAL_GROW");
  ExpectRefused(
      CheckSealedObject(Memfd(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_WRITE).get()),
      "forbid writes");
  // A POSIX shared-memory object can be shrunk by its creator at any time and can never be
  // sealed: never taken.
  const std::string posix = absl::StrCat("/smla-handover-test-", getpid());
  OwnedFd shm(shm_open(posix.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600));
  ASSERT_TRUE(shm.valid());
  shm_unlink(posix.c_str());
  ASSERT_EQ(ftruncate(shm.get(), kBytes), 0);
  ExpectRefused(CheckSealedObject(shm.get()), "POSIX shm objects cannot be sealed");
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  OwnedFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  ExpectRefused(CheckSealedObject(read_end.get()), "not a memfd");
  absl::StatusOr<uint64_t> ok = CheckSealedObject(Sealed().get());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, kBytes);
  // The registry applies the same rule, and maps no more than the memfd holds.
  RegionRegistry registry;
  EXPECT_EQ(
      registry.Register("t", registry.NewSession(), Memfd(0), kBytes, nullptr).status().code(),
      absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> big =
      registry.Register("t", registry.NewSession(), Sealed(), kBytes + 1, nullptr);
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("holds 8192 bytes"));
  EXPECT_EQ(registry.size(), 0);
}

// The server names regions (128 random bits each): registering the same memory twice, or two
// tenants registering at once, gives distinct regions, and nobody picks a name.
TEST(ShmHandoverTest, RegistryNamesEveryRegionItself) {
  RegionRegistry registry;
  OwnedFd fd = Sealed();
  absl::StatusOr<std::string> a =
      registry.Register("alice", registry.NewSession(), OwnedFd(dup(fd.get())), kBytes, nullptr);
  absl::StatusOr<std::string> b =
      registry.Register("bob", registry.NewSession(), OwnedFd(dup(fd.get())), kBytes, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_THAT(*a, MatchesRegex("/smla-[0-9a-f]{32}"));
  EXPECT_NE(*a, *b);
  EXPECT_EQ(registry.Lookup("bob", "q", *a).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(registry.Lookup("alice", "q", *a).ok());
}

TEST(ShmHandoverTest, BoxIsBoundedPerUserAndForgets) {
  HandoverBox box;
  const absl::Time t0 = absl::Now();
  std::vector<std::string> tokens;
  for (size_t i = 0; i < HandoverBox::kMaxPendingPerUid; ++i) {
    absl::StatusOr<std::string> token = box.Offer(Sealed(), 1000, t0);
    ASSERT_TRUE(token.ok()) << token.status();
    EXPECT_THAT(*token, MatchesRegex("[0-9a-f]{32}"));
    tokens.push_back(*token);
  }
  absl::StatusOr<std::string> over = box.Offer(Sealed(), 1000, t0);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  // Another user is not held up by the first one's handovers.
  absl::StatusOr<std::string> other = box.Offer(Sealed(), 1001, t0);
  ASSERT_TRUE(other.ok()) << other.status();
  // A bad descriptor is never kept.
  EXPECT_EQ(box.Offer(Memfd(0), 1002, t0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(box.pending(), HandoverBox::kMaxPendingPerUid + 1);
  // A token works once.
  EXPECT_TRUE(box.Claim(tokens[0], t0).ok());
  EXPECT_EQ(box.Claim(tokens[0], t0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(box.Claim("not-a-token", t0).status().code(), absl::StatusCode::kNotFound);
  // Unclaimed handovers expire, and free their user's share.
  const absl::Time later = t0 + absl::Seconds(v1::handover::kTokenSeconds + 1);
  EXPECT_EQ(box.Claim(tokens[1], later).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(box.pending(), 0u);
  EXPECT_TRUE(box.Offer(Sealed(), 1000, later).ok());
}

TEST(ShmHandoverTest, SocketTakesSealedMemfdsAndRefusesTheRest) {
  HandoverBox box;
  absl::StatusOr<std::unique_ptr<HandoverSocket>> socket = HandoverSocket::Start("", &box);
  ASSERT_TRUE(socket.ok()) << socket.status();
  const std::string address = (*socket)->address();
  EXPECT_EQ(address[0], '@');
  OwnedFd fd = Sealed();
  absl::StatusOr<std::string> token = client::HandOver(address, fd.get());
  ASSERT_TRUE(token.ok()) << token.status();
  absl::StatusOr<OwnedFd> claimed = box.Claim(*token, absl::Now());
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  // The server got the same memory: a write through one shows through the other.
  void* mine = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  void* theirs = mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, claimed->get(), 0);
  ASSERT_NE(mine, MAP_FAILED);
  ASSERT_NE(theirs, MAP_FAILED);
  static_cast<char*>(mine)[100] = 42;
  EXPECT_EQ(static_cast<char*>(theirs)[100], 42);
  munmap(mine, kBytes);
  munmap(theirs, kBytes);
  absl::StatusOr<std::string> refused = client::HandOver(address, Memfd(0).get());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("lack F_SEAL_SHRINK"));
  EXPECT_EQ(box.pending(), 0u);
}

}  // namespace
}  // namespace smla::server::edge
