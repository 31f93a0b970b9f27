// Faults against the real server on loopback: a client killed mid-stream, a slow reader, a
// burst past the queue limit, a deadline that expires while the kernel runs, an injected
// backend failure, SIGTERM under load, and a bounded soak (SMLA_SOAK_SECONDS, default 6).
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "child_process.h"
#include "harness.h"
#include "heavy_step.h"
#include "smla/client/shm.h"

namespace smla::testing {
namespace {

using std::chrono::milliseconds;

std::string Seq(int i) { return absl::StrCat("s", i); }

// The child side of KilledClientMidStream: steps its own sequence through a stream until
// killed. Skipped unless the parent test started it.
TEST(FaultChild, StreamUntilKilled) {
  ChildClient c;
  ASSERT_NO_FATAL_FAILURE(ConnectChild(&c));
  if (c.client == nullptr) GTEST_SKIP() << "run by FaultTest.KilledClientMidStream";
  const v1::ModelInfo& m = c.model;
  ASSERT_TRUE(c.client->CreateSequence(m.profile(), "child").ok());
  auto stream = c.client->OpenStream();
  ASSERT_TRUE(stream.ok());
  std::mt19937_64 rng(7);
  for (int64_t pos = 0;; pos += 8) {
    // Several requests in flight at the moment of the kill: write two, read one.
    ASSERT_TRUE((*stream)->Write(client::MakeStep(m, 0, {{"child", pos, 8, 0}}, {}, rng)));
    if (pos % 16 == 8) {
      v1::StepResponse r;
      ASSERT_TRUE((*stream)->Read(&r));
    }
  }
}

// The child side of RegionOwnerKilledMidStep: registers a shared-memory region, places one step
// in it (inputs and outputs) and sends it; the parent kills it while the step runs.
TEST(FaultChild, RegionStepUntilKilled) {
  ChildClient c;
  ASSERT_NO_FATAL_FAILURE(ConnectChild(&c));
  if (c.client == nullptr) GTEST_SKIP() << "run by FaultTest.RegionOwnerKilledMidStep";
  const v1::ModelInfo& m = c.model;
  ASSERT_TRUE(c.client->CreateSequence(m.profile(), "owner").ok());
  auto region = client::ShmRegion::Create(c.client.get(), "owner", 8 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  v1::StepRequest step = OwnerStep(m);
  ASSERT_TRUE((*region)->Place(&step).ok());
  SendUntilKilled(*c.client, step);
}

// A client that dies while its step, whose tensors lie in its shared-memory region, runs: the
// server keeps the region's memory mapped until the step ends, so the step completes whole
// (it was launched) and the other clients are served throughout.
TEST(FaultTest, RegionOwnerKilledMidStep) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(
      h.Start({kGlm53, "--allow_shm", "--inject_attend_delay_ms=1500"}, "glm-5.3-flash"));
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "mine").ok());
  EXPECT_EQ(KillOwnerMidStep(h, "FaultChild.RegionStepUntilKilled"), OwnerStepRows(h.model_))
      << "the launched step was not committed whole";
  h.StepAndCheck(h.Make(0, {{"mine", 0, 4, 0}}));
  EXPECT_TRUE(h.client->Health().value_or(false));
}

TEST(FaultTest, KilledClientMidStream) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kGlm53}, "glm-5.3-flash"));
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "mine").ok());
  const pid_t child = StartChild(h.server->target(), "FaultChild.StreamUntilKilled");
  ASSERT_GT(child, 0);
  int64_t pos = 0;
  // Step alongside the child until it has written something, then kill it mid-stream.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    h.StepAndCheck(h.Make(0, {{"mine", pos, 4, 0}}));
    pos += 4;
    auto len = h.client->Length({h.ModelName(), "child"}, 0);
    if (len.ok() && *len >= 32) break;
  }
  ASSERT_GE(h.Length("child", 0), 32) << "the child never stepped";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  // The server keeps serving the others; the dead client's sequence is intact and usable.
  for (int i = 0; i < 10; ++i) {
    h.StepAndCheck(h.Make(0, {{"mine", pos, 4, 0}}));
    pos += 4;
  }
  const int64_t child_len = h.Length("child", 0);
  EXPECT_EQ(child_len % 8, 0) << "a step was applied in part";
  auto health = h.client->Health();
  ASSERT_TRUE(health.ok());
  EXPECT_TRUE(*health);
  // Its stream was closed: no stream stays open on the server.
  std::string text;
  for (int i = 0; i < 100; ++i) {
    auto m = h.server->ScrapeMetrics();
    ASSERT_TRUE(m.ok());
    text = *m;
    if (text.find("smla_open_streams 0") != std::string::npos) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_NE(text.find("smla_open_streams 0"), std::string::npos);
}

TEST(FaultTest, SlowReaderHoldsBoundedMemory) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kGlm53, "--stream_max_inflight=4"}, "glm-5.3-flash"));
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "slow").ok());
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "other").ok());
  h.StepAndCheck(h.Make(0, {{"other", 0, 64, 0}}));  // warm
  const int64_t rss_before = RssBytes(h.server->pid());
  ASSERT_GT(rss_before, 0);
  auto slow_client = h.server->Connect();
  auto stream = slow_client->OpenStream();
  ASSERT_TRUE(stream.ok());
  // The same 64-row request (it rewrites positions 0..63) 160 times: about 100 MiB of
  // requests and 80 MiB of responses if the server buffered them all. The reader never reads;
  // the server holds --stream_max_inflight requests plus what HTTP/2 flow control admits.
  const v1::StepRequest req = h.Make(0, {{"slow", 0, 64, 0}});
  constexpr int kWrites = 160;
  std::atomic<int> written{0};
  std::thread writer([&] {
    for (int i = 0; i < kWrites; ++i) {
      if (!(*stream)->Write(req)) return;
      ++written;
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const int64_t rss_held = RssBytes(h.server->pid());
  // Others are served meanwhile.
  h.StepAndCheck(h.Make(0, {{"other", 64, 8, 0}}));
  std::printf("slow reader: %d of %d writes went through; server RSS %lld -> %lld KiB\n",
              written.load(), kWrites, static_cast<long long>(rss_before / 1024),
              static_cast<long long>(rss_held / 1024));
  EXPECT_LT(written.load(), kWrites) << "the server read everything: reading is not bounded";
  if (kRssMeaningful) {
    EXPECT_LT(rss_held - rss_before, int64_t{48} << 20);
  }
  (*stream)->Cancel();
  writer.join();
  (*stream)->Finish().IgnoreError();
  EXPECT_TRUE(h.client->Health().value_or(false));
}

TEST(FaultTest, BurstPastTheQueueLimit) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(
      h.Start({kGlm53, kHoldBackend, "--max_queued_requests=4"}, "glm-5.3-flash"));
  const v1::StepRequest heavy = PrepareHeavy(h);
  std::vector<v1::StepRequest> small;
  for (int i = 0; i < 5; ++i) {
    const std::string id = absl::StrCat("q", i);
    ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), id).ok());
    small.push_back(h.Make(0, {{id, 0, 4, 0}}));
  }
  auto running = LaunchHeavy(h, heavy);
  // Exactly the limit is admitted while the kernel runs ...
  std::vector<std::future<absl::StatusOr<v1::StepResponse>>> queued;
  for (int i = 0; i < 4; ++i) {
    queued.push_back(std::async(std::launch::async, [&, i] { return h.client->Step(small[i]); }));
  }
  bool four_waiting = false;
  for (int i = 0; i < 500 && !four_waiting; ++i) {
    auto m = h.server->ScrapeMetrics();
    four_waiting = m.ok() && m->find("smla_queue_depth 4") != std::string::npos;
    if (!four_waiting) std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_TRUE(four_waiting) << "the four calls did not queue behind the running step";
  // ... and one more is refused at once, with nothing written.
  auto refused = h.client->Step(small[4]);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_EQ(h.Length("heavy", 0), kHeavyBase) << "the heavy step ended too early";
  auto heavy_result = running.get();
  ASSERT_TRUE(heavy_result.ok()) << heavy_result.status();
  h.Check(heavy, *heavy_result);
  for (int i = 0; i < 4; ++i) {
    auto r = queued[i].get();
    ASSERT_TRUE(r.ok()) << r.status();
    h.Check(small[i], *r);
  }
  EXPECT_EQ(h.Length("q4", 0), 0);
  h.StepAndCheck(small[4]);
}

// A launched step is not interrupted: the kernel finishes and the write is committed even
// though the caller's deadline passed (it gets DEADLINE_EXCEEDED). Only an acknowledged write
// is promised; after a deadline the caller reads the stored length to learn the outcome.
// The request is small and the hold long, so that the deadline passes while the kernel runs
// and not, on a loaded machine, before the step was admitted.
TEST(FaultTest, DeadlineExpiresWhileKernelRuns) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kGlm53, "--inject_attend_delay_ms=3000"}, "glm-5.3-flash"));
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "late").ok());
  const int32_t rows = 2 * h.model_.pool().page_rows();
  const v1::StepRequest step = h.Make(0, {{"late", 0, rows, 0}});
  const int64_t pages_before = PagesUsed(h);
  auto late = std::async(std::launch::async,
                         [&] { return h.client->Step(step, absl::Milliseconds(1000)); });
  ASSERT_NO_FATAL_FAILURE(WaitLaunched(h, pages_before, 2));
  EXPECT_EQ(h.Length("late", 0), 0) << "the step ended before its deadline";
  auto r = late.get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  int64_t len = -1;
  for (int i = 0; i < 600 && len != rows; ++i) {
    len = h.Length("late", 0);
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_EQ(len, rows) << "the launched step was not committed";
  ASSERT_TRUE(h.ref->Step(step).ok());  // the reference records the committed rows
  h.StepAndCheck(h.Make(0, {{"late", len, 4, 0}}));
  EXPECT_TRUE(h.client->Health().value_or(false));
}

TEST(FaultTest, InjectedBackendFailure) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kGlm53, "--inject_backend_failure_after=2"}, "glm-5.3-flash"));
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "s").ok());
  h.StepAndCheck(h.Make(0, {{"s", 0, 8, 0}}));
  h.StepAndCheck(h.Make(0, {{"s", 8, 8, 0}}));
  auto failed = h.client->Step(h.Make(0, {{"s", 16, 8, 0}}));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()), ::testing::HasSubstr("injected"));
  EXPECT_EQ(h.Length("s", 0), 16);  // the failed step wrote nothing
  bool not_serving = false;
  for (int i = 0; i < 100 && !not_serving; ++i) {
    auto serving = h.client->Health();
    ASSERT_TRUE(serving.ok()) << serving.status();
    not_serving = !*serving;
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(not_serving);
  auto refused = h.client->Step(h.Make(0, {{"s", 16, 8, 0}}));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_TRUE(h.client->Info().ok());  // alive
  EXPECT_EQ(h.server->Terminate(), 0);
}

TEST(FaultTest, SigtermUnderLoad) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kGlm53}, "glm-5.3-flash"));
  constexpr int kClients = 4;
  std::vector<Harness> hs(kClients);
  for (int i = 0; i < kClients; ++i) {
    ASSERT_NO_FATAL_FAILURE(hs[i].Attach(h.server->Connect(), "glm-5.3-flash"));
    hs[i].rng.seed(100 + i);
    ASSERT_TRUE(hs[i].client->CreateSequence(hs[i].ModelName(), Seq(i)).ok());
  }
  std::atomic<int> ok{0}, refused{0}, other{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Harness& c = hs[i];
      for (int64_t pos = 0;; pos += 4) {
        const v1::StepRequest req = c.Make(0, {{Seq(i), pos, 4, 0}});
        auto r = c.client->Step(req, absl::Seconds(60));
        if (r.ok()) {
          c.Check(req, *r);
          ++ok;
          continue;
        }
        // Draining refuses new work; once the port closes calls fail to connect.
        if (r.status().code() == absl::StatusCode::kUnavailable) {
          ++refused;
        } else {
          ADD_FAILURE() << r.status();
          ++other;
        }
        return;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  h.server->Signal(SIGTERM);
  EXPECT_EQ(h.server->WaitExit(60), 0);
  for (auto& t : threads) t.join();
  EXPECT_GT(ok.load(), kClients);
  EXPECT_EQ(refused.load(), kClients);
  EXPECT_EQ(other.load(), 0);
}

int OpenDescriptors(pid_t pid) {
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n - 2;  // . and ..
}

// `count` plain TCP connections to the port that never speak; -1 entries for failed connects.
std::vector<int> SilentConnections(int port, int count) {
  std::vector<int> fds;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < count; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      close(fd);
      fd = -1;
    }
    fds.push_back(fd);
  }
  return fds;
}

// Whether GetServerInfo answers within `limit` on new connections: five in a row, each on a
// channel of its own (gRPC would otherwise share one connection between a process's channels)
// with a short deadline.
bool ServedWithin(const ServerProcess& server, absl::Duration limit) {
  const absl::Time end = absl::Now() + limit;
  int in_a_row = 0;
  while (in_a_row < 5 && absl::Now() < end) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = v1::Smla::NewStub(
        grpc::CreateCustomChannel(server.target(), grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(500));
    v1::ServerInfoRequest req;
    v1::ServerInfo info;
    if (stub->GetServerInfo(&ctx, req, &info).ok()) {
      ++in_a_row;
    } else {
      in_a_row = 0;
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
  return in_a_row == 5;
}

// Descriptors run out (a low open-files limit, a connection cap above it, and silent
// connections past it). gRPC 1.51's own accept loop stopped for good at the first EMFILE;
// the server's listener pauses and resumes, so once the connections close, new clients are
// served within seconds, and an established client is served throughout.
TEST(FaultTest, DescriptorExhaustionDoesNotStopTheListener) {
  constexpr int kOpenFiles = 256;
  auto server = ServerProcess::Start({kGlm53, "--max_connections=100000"}, "", kOpenFiles);
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<client::Client> established = (*server)->Connect();
  ASSERT_TRUE(established->Info().ok());
  std::vector<int> silent = SilentConnections((*server)->port(), kOpenFiles + 100);
  // The server takes connections until its descriptors run out.
  int open = 0;
  for (int i = 0; i < 500 && (open = OpenDescriptors((*server)->pid())) < kOpenFiles - 8; ++i) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_GE(open, kOpenFiles - 8) << "the server never ran out of descriptors";
  // More connects while none are left, so every listening socket meets the shortage.
  std::vector<int> more = SilentConnections((*server)->port(), 100);
  silent.insert(silent.end(), more.begin(), more.end());
  std::this_thread::sleep_for(milliseconds(300));
  auto info = established->Info();
  EXPECT_TRUE(info.ok()) << info.status();
  for (int fd : silent) {
    if (fd >= 0) close(fd);
  }
  EXPECT_TRUE(ServedWithin(**server, absl::Seconds(5)))
      << "no new connection was served after the descriptors came back";
  EXPECT_TRUE(established->Info().ok());
  EXPECT_EQ((*server)->Terminate(), 0);
}

// Past --max_connections a connection is closed at once (the client fails fast instead of
// waiting), established clients keep being served, and descriptors never run out.
TEST(FaultTest, ConnectionsPastTheCapAreClosedAtOnce) {
  auto server = ServerProcess::Start({kGlm53, "--max_connections=8"});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<client::Client> established = (*server)->Connect();
  ASSERT_TRUE(established->Info().ok());
  constexpr int kSilent = 40;
  std::vector<int> silent = SilentConnections((*server)->port(), kSilent);
  // Connections past the cap read end-of-stream; those within it stay open.
  std::vector<pollfd> polled;
  for (int fd : silent) {
    ASSERT_GE(fd, 0);
    polled.push_back({fd, POLLIN, 0});
  }
  int closed = 0;
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while (closed < kSilent - 7 && absl::Now() < end) {
    if (poll(polled.data(), polled.size(), 100) <= 0) continue;
    for (pollfd& p : polled) {
      char byte;
      if (p.fd >= 0 && p.revents != 0 && read(p.fd, &byte, 1) <= 0) {
        ++closed;
        p.fd = -1;  // poll skips it from now on
      }
    }
  }
  EXPECT_EQ(closed, kSilent - 7);  // the cap of 8 holds the established client and 7 more
  auto info = established->Info();
  EXPECT_TRUE(info.ok()) << info.status();
  auto metrics = (*server)->ScrapeMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, ::testing::HasSubstr("smla_connections_open 8\n"));
  EXPECT_THAT(*metrics, ::testing::HasSubstr(
                            absl::StrCat("smla_connections_refused_total ", kSilent - 7, "\n")));
  for (int fd : silent) close(fd);
  EXPECT_TRUE(ServedWithin(**server, absl::Seconds(5)));
  EXPECT_EQ((*server)->Terminate(), 0);
}

// How the calls of one client ended: codes other than OK and UNAVAILABLE are kept by name.
struct CallTally {
  int ok = 0;
  int unavailable = 0;
  std::vector<std::string> other;
  void Add(const absl::Status& st, const std::string& what) {
    const absl::StatusCode code = st.code();
    if (code == absl::StatusCode::kOk) {
      ++ok;
    } else if (code == absl::StatusCode::kUnavailable) {
      ++unavailable;
    } else {
      other.push_back(absl::StrCat(what, ": ", st.ToString()));
    }
  }
};

// Unary steps until `stop`; a refused step writes nothing, so the next one retries its place.
void UnaryStepsUntil(Harness& c, const std::string& seq, const std::atomic<bool>& stop,
                     CallTally* tally) {
  int64_t pos = 0;
  for (int calls = 0; !stop.load() && calls < 1000000; ++calls) {
    const v1::StepRequest req = c.Make(0, {{seq, pos, 2, 0}});
    auto r = c.client->Step(req, absl::Seconds(60));
    tally->Add(r.status(), "Step");
    if (r.ok()) {
      c.Check(req, *r);
      pos += 2;
    } else {
      std::this_thread::sleep_for(milliseconds(2));
    }
  }
}

// Streams of steps until `stop`: every step's code and every stream's final status are tallied;
// a stream that ends is replaced by a new one.
void StreamStepsUntil(Harness& c, const std::string& seq, const std::atomic<bool>& stop,
                      CallTally* tally) {
  int64_t pos = 0;
  for (int streams = 0; !stop.load() && streams < 100000; ++streams) {
    auto stream = c.client->OpenStream();
    if (!stream.ok()) {
      tally->Add(stream.status(), "OpenStream");
      std::this_thread::sleep_for(milliseconds(2));
      continue;
    }
    v1::StepResponse resp;
    while (!stop.load()) {
      const v1::StepRequest req = c.Make(0, {{seq, pos, 2, 0}});
      if (!(*stream)->Write(req) || !(*stream)->Read(&resp)) break;
      tally->Add(absl::Status(static_cast<absl::StatusCode>(resp.code()), resp.message()),
                 "StepStream step");
      if (resp.code() == 0) {
        c.Check(req, resp);
        pos += 2;
      }
    }
    if (stop.load()) (*stream)->Cancel();
    const absl::Status st = (*stream)->Finish();
    if (!stop.load()) tally->Add(st, "StepStream");
  }
}

// SIGTERM while clients keep stepping, unary and on streams, and keep calling after refusals:
// every call and every stream ends OK or UNAVAILABLE (what a Cluster fails over on), never
// CANCELLED, and the process exits 0.
TEST(FaultTest, SigtermEndsEveryCallOkOrUnavailable) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kGlm53, "--shutdown_grace_s=2"}, "glm-5.3-flash"));
  constexpr int kClients = 6;
  std::vector<Harness> hs(kClients);
  for (int i = 0; i < kClients; ++i) {
    ASSERT_NO_FATAL_FAILURE(hs[i].Attach(h.server->Connect(), "glm-5.3-flash"));
    hs[i].rng.seed(200 + i);
    ASSERT_TRUE(hs[i].client->CreateSequence(hs[i].ModelName(), Seq(i)).ok());
  }
  std::atomic<bool> stop{false};
  std::vector<CallTally> tallies(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      if (i % 2 == 0) {
        UnaryStepsUntil(hs[i], Seq(i), stop, &tallies[i]);
      } else {
        StreamStepsUntil(hs[i], Seq(i), stop, &tallies[i]);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  h.server->Signal(SIGTERM);
  const int exit_status = h.server->WaitExit(60);
  // Calls made after the exit find no server (UNAVAILABLE); a moment of them is enough.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  stop.store(true);
  for (auto& t : threads) t.join();
  EXPECT_EQ(exit_status, 0);
  for (int i = 0; i < kClients; ++i) {
    SCOPED_TRACE(absl::StrCat("client ", i));
    EXPECT_GT(tallies[i].ok, 0);
    EXPECT_GT(tallies[i].unavailable, 0);
    EXPECT_THAT(tallies[i].other, ::testing::IsEmpty());
  }
}

TEST(FaultTest, SoakAtHighConcurrency) {
  const char* env = std::getenv("SMLA_SOAK_SECONDS");
  const int seconds = env != nullptr ? std::atoi(env) : 6;
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kDsv41}, "dsv4.1-flash"));
  constexpr int kClients = 12;
  std::vector<Harness> hs(kClients);
  for (int i = 0; i < kClients; ++i) {
    ASSERT_NO_FATAL_FAILURE(hs[i].Attach(h.server->Connect(), "dsv4.1-flash"));
    ASSERT_NO_FATAL_FAILURE(hs[i].UploadTables(1 << 16));  // the same tables for everyone
    hs[i].rng.seed(1000 + i);
    ASSERT_TRUE(hs[i].client->CreateSequence(hs[i].ModelName(), Seq(i)).ok());
  }
  std::atomic<bool> stop{false};
  std::atomic<int64_t> calls{0}, failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Harness& c = hs[i];
      // SWA layer 0 keeps a bounded ring, so a long soak holds a bounded pool; half the
      // clients go through a stream.
      auto stream = c.client->OpenStream();
      for (int64_t pos = 0; !stop.load() && pos + 2 < (1 << 16); pos += 2) {
        const v1::StepRequest req = c.Make(0, {{Seq(i), pos, 2, 0}});
        v1::StepResponse resp;
        bool ok;
        if (i % 2 == 0 && stream.ok()) {
          ok = (*stream)->Write(req) && (*stream)->Read(&resp) && resp.code() == 0;
        } else {
          auto r = c.client->Step(req);
          ok = r.ok();
          if (ok) resp = *r;
        }
        ++calls;
        if (!ok) {
          ++failures;
          return;
        }
        c.Check(req, resp);
      }
      if (stream.ok()) {
        (*stream)->WritesDone();
        (*stream)->Finish().IgnoreError();
      }
    });
  }
  const pid_t pid = h.server->pid();
  std::this_thread::sleep_for(std::chrono::seconds(std::max(1, seconds / 3)));
  const int64_t rss_warm = RssBytes(pid);
  int64_t rss_peak = rss_warm;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(milliseconds(250));
    rss_peak = std::max(rss_peak, RssBytes(pid));
  }
  stop = true;
  for (auto& t : threads) t.join();
  std::printf("soak: %lld calls in %d s by %d clients; server RSS warm %lld KiB, peak %lld KiB\n",
              static_cast<long long>(calls.load()), seconds + std::max(1, seconds / 3), kClients,
              static_cast<long long>(rss_warm / 1024), static_cast<long long>(rss_peak / 1024));
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(calls.load(), kClients);
  if (kRssMeaningful) {
    EXPECT_LT(rss_peak - rss_warm, int64_t{32} << 20) << "server memory grew under a steady load";
  }
}

}  // namespace
}  // namespace smla::testing
