// Scale-out across three real smla-server processes on loopback: placement by consistent
// hashing, balance, correct outputs through the cluster, and one server dying.
#include "smla/client/cluster.h"

#include <signal.h>

#include <algorithm>
#include <map>
#include <set>

#include "harness.h"

namespace smla::testing {
namespace {

using client::Cluster;
using client::ClusterOptions;
using client::HashRing;
using client::Sequence;

std::string Id(int i) { return absl::StrCat("seq-", i); }

TEST(HashRingTest, BalancedAndMovesOnlyToANewServer) {
  const std::vector<std::string> servers = {"10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"};
  HashRing ring;
  for (const auto& s : servers) ring.Add(s);
  constexpr int kKeys = 6000;
  std::map<std::string, int> count;
  std::vector<std::string> before(kKeys);
  for (int i = 0; i < kKeys; ++i) {
    before[i] = ring.Find(Id(i));
    ++count[before[i]];
  }
  for (const auto& s : servers) {
    EXPECT_GT(count[s], kKeys * 25 / 100) << s;
    EXPECT_LT(count[s], kKeys * 42 / 100) << s;
  }
  // A fourth server takes about a quarter of the keys, all from the others; no key moves
  // between the old three.
  ring.Add("10.0.0.4:50051");
  int moved = 0;
  for (int i = 0; i < kKeys; ++i) {
    const std::string now = ring.Find(Id(i));
    if (now != before[i]) {
      ++moved;
      EXPECT_EQ(now, "10.0.0.4:50051") << Id(i);
    }
  }
  EXPECT_GT(moved, kKeys * 15 / 100);
  EXPECT_LT(moved, kKeys * 35 / 100);
  // Skipping a server sends its keys to the next ones clockwise; the others stay.
  for (int i = 0; i < kKeys; ++i) {
    const std::string skip =
        ring.Find(Id(i), [](const std::string& s) { return s != "10.0.0.2:50051"; });
    EXPECT_NE(skip, "10.0.0.2:50051");
    if (ring.Find(Id(i)) != "10.0.0.2:50051") {
      EXPECT_EQ(skip, ring.Find(Id(i)));
    }
  }
  ring.Remove("10.0.0.4:50051");
  for (int i = 0; i < kKeys; ++i) EXPECT_EQ(ring.Find(Id(i)), before[i]);
  EXPECT_EQ(ring.Find("x", [](const std::string&) { return false; }), "");
}

TEST(ResolveServersTest, NumericAndNamesAndErrors) {
  auto numeric = client::ResolveServers("127.0.0.1:7001");
  ASSERT_TRUE(numeric.ok()) << numeric.status();
  EXPECT_EQ(*numeric, std::vector<std::string>{"127.0.0.1:7001"});
  auto v6 = client::ResolveServers("[::1]:7001");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(*v6, std::vector<std::string>{"[::1]:7001"});
  auto named = client::ResolveServers("localhost:7001");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_THAT(*named, ::testing::Contains("127.0.0.1:7001"));
  EXPECT_EQ(client::ResolveServers("localhost").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client::ResolveServers("localhost:0").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(client::ResolveServers("no-such-host.invalid:7001").ok());
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 3; ++i) {
      auto s = ServerProcess::Start({kDsv41, "--cpu_threads=1"});
      ASSERT_TRUE(s.ok()) << s.status();
      servers_.push_back(std::move(*s));
    }
    auto info = servers_[0]->Connect()->Info();
    ASSERT_TRUE(info.ok()) << info.status();
    model_ = info->models(0);
    auto ref = client::Reference::Create(model_, 1 << 14);
    ASSERT_TRUE(ref.ok()) << ref.status();
    ref_ = std::move(*ref);
  }

  ClusterOptions Options() const {
    ClusterOptions o;
    for (const auto& s : servers_) o.servers.push_back(s->target());
    o.client.timeout = absl::Seconds(60);
    return o;
  }

  // Sinks and rope go through the cluster (to every live server) and to the reference.
  void UploadTables(Cluster& cluster) {
    std::uniform_real_distribution<float> u(-1.0f, 2.0f);
    std::vector<float> sinks(int64_t{model_.layers_size()} * model_.heads_per_rank());
    for (float& s : sinks) s = u(rng_);
    ASSERT_TRUE(
        cluster.SetSinks(model_.profile(), sinks, model_.layers_size(), model_.heads_per_rank())
            .ok());
    ref_->SetSinks(sinks);
    const std::vector<float> table = client::MakeRopeTable(1024);
    ASSERT_TRUE(cluster.SetRopeTable(model_.profile(), table, 1024).ok());
    ref_->SetRopeTable(table, 1024);
  }

  // A 40-row prefill of `id` on the SWA-only layer 0, checked against the reference.
  absl::Status Prefill(Cluster& cluster, const std::string& id) {
    const v1::StepRequest req =
        client::MakeStep(model_, 0, {{id, 0, 40, 0}}, client::StepOptions{}, rng_);
    auto resp = cluster.Step(req);
    if (!resp.ok()) return resp.status();
    auto expected = ref_->Step(req);
    if (!expected.ok()) return expected.status();
    const client::Comparison c = client::Reference::Compare(*expected, *resp);
    EXPECT_TRUE(c.ok) << id << ": " << c.first_mismatch;
    return absl::OkStatus();
  }

  std::vector<std::unique_ptr<ServerProcess>> servers_;
  v1::ModelInfo model_;
  std::unique_ptr<client::Reference> ref_;
  std::mt19937_64 rng_{7};
};

TEST_F(ClusterTest, PlacementBalanceAndLossOfOneServer) {
  auto cluster = Cluster::Connect(Options());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  ASSERT_EQ(c.LiveServers().size(), 3u);
  UploadTables(c);
  const std::string model = model_.profile();

  // 300 sequences: placement follows the ring, every server holds 20-50% of them, and each
  // server really holds the ones the cluster says it does.
  constexpr int kSequences = 300;
  HashRing ring;
  for (const auto& s : servers_) ring.Add(s->target());
  std::map<std::string, std::vector<std::string>> on;
  for (int i = 0; i < kSequences; ++i) {
    auto seq = c.CreateSequence(model, Id(i));
    ASSERT_TRUE(seq.ok()) << seq.status();
    auto server = c.ServerOf(*seq);
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ(*server, ring.Find(model + "/" + Id(i)));
    on[*server].push_back(Id(i));
  }
  for (const auto& s : servers_) {
    const size_t n = on[s->target()].size();
    EXPECT_GE(n, kSequences * 20 / 100) << s->target();
    EXPECT_LE(n, kSequences * 50 / 100) << s->target();
    auto info = s->Connect()->Info();
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->sequences(), static_cast<int64_t>(n)) << s->target();
  }
  EXPECT_EQ(c.CreateSequence(model, Id(0)).status().code(), absl::StatusCode::kAlreadyExists);

  // Steps on two sequences of every server return what the reference computes (so the
  // sinks and rope tables reached every server).
  for (const auto& s : servers_) {
    for (int k = 0; k < 2; ++k) ASSERT_TRUE(Prefill(c, on[s->target()][k]).ok());
  }
  // One step is one launch on one server.
  const std::string a = on[servers_[0]->target()][0];
  const std::string b = on[servers_[1]->target()][0];
  const v1::StepRequest two =
      client::MakeStep(model_, 0, {{a, 40, 1, 0}, {b, 40, 1, 0}}, client::StepOptions{}, rng_);
  const absl::Status split = c.Step(two).status();
  EXPECT_EQ(split.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(split.message()), ::testing::HasSubstr(b));

  // Server 1 dies without a goodbye.
  const std::string dead = servers_[1]->target();
  servers_[1]->Signal(SIGKILL);
  servers_[1]->WaitExit(10);
  const std::vector<std::string>& lost = on[dead];

  // Its first sequence to be touched reports the loss, naming itself and the server...
  auto step = c.Step(client::MakeStep(model_, 0, {{lost[0], 40, 1, 0}}, {}, rng_));
  ASSERT_FALSE(step.ok());
  EXPECT_TRUE(client::IsSequenceLost(step.status())) << step.status();
  EXPECT_THAT(std::string(step.status().message()), ::testing::HasSubstr(lost[0]));
  EXPECT_THAT(std::string(step.status().message()), ::testing::HasSubstr(dead));
  // ...and then all its sequences are lost, without another call to the dead server.
  std::vector<std::string> expect_lost;
  for (const auto& id : lost) expect_lost.push_back(model + "/" + id);
  std::sort(expect_lost.begin(), expect_lost.end());
  EXPECT_EQ(c.LostSequences(), expect_lost);
  auto len = c.Length({model, lost[1]}, 0);
  EXPECT_TRUE(client::IsSequenceLost(len.status())) << len.status();
  EXPECT_THAT(std::string(len.status().message()), ::testing::HasSubstr(lost[1]));
  EXPECT_TRUE(client::IsSequenceLost(c.Truncate({model, lost[2]}, 0)));
  EXPECT_TRUE(client::IsSequenceLost(c.ClientFor({model, lost[2]}).status()));
  EXPECT_EQ(c.LiveServers().size(), 2u);

  // The other servers keep working: their sequences step on, with correct outputs.
  for (const int s : {0, 2}) {
    const std::string id = on[servers_[s]->target()][0];
    const v1::StepRequest req = client::MakeStep(model_, 0, {{id, 40, 6, 5}}, {}, rng_);
    auto resp = c.Step(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    auto expected = ref_->Step(req);
    ASSERT_TRUE(expected.ok());
    EXPECT_TRUE(client::Reference::Compare(*expected, *resp).ok);
    auto l = c.Length({model, id}, 0);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(*l, 46);
  }

  // New sequences go to the live servers only, and still spread over both.
  std::map<std::string, int> fresh;
  for (int i = kSequences; i < kSequences + 60; ++i) {
    auto seq = c.CreateSequence(model, Id(i));
    ASSERT_TRUE(seq.ok()) << seq.status();
    ++fresh[*c.ServerOf(*seq)];
  }
  EXPECT_EQ(fresh.count(dead), 0u);
  EXPECT_EQ(fresh.size(), 2u);

  // A dead server stays down on Refresh; releasing a lost sequence acknowledges the loss.
  ASSERT_TRUE(c.Refresh().ok());
  EXPECT_EQ(c.LiveServers().size(), 2u);
  EXPECT_TRUE(c.Release({model, lost[0]}).ok());
  EXPECT_EQ(c.ServerOf({model, lost[0]}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.LostSequences().size(), lost.size() - 1);
  const std::string kept = on[servers_[0]->target()][1];
  EXPECT_TRUE(c.Release({model, kept}).ok());
  auto info = servers_[0]->Connect()->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->sequences(), static_cast<int64_t>(on[servers_[0]->target()].size()) +
                                   fresh[servers_[0]->target()] - 1);
}

TEST_F(ClusterTest, DeadAtConnectAndRejoinWithTables) {
  // Server 2 is down before the cluster starts: it stays on the ring but takes nothing.
  const std::string down = servers_[2]->target();
  servers_[2]->Signal(SIGKILL);
  servers_[2]->WaitExit(10);
  auto cluster = Cluster::Connect(Options());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  EXPECT_EQ(c.Servers().size(), 3u);
  EXPECT_EQ(c.LiveServers().size(), 2u);
  UploadTables(c);
  for (int i = 0; i < 60; ++i) {
    auto seq = c.CreateSequence(model_.profile(), Id(i));
    ASSERT_TRUE(seq.ok()) << seq.status();
    EXPECT_NE(*c.ServerOf(*seq), down);
  }

  // The server comes back on its address with an empty cache: Refresh lets it take new
  // sequences, after replaying the tables to it, so its outputs are right.
  const std::string port = down.substr(down.rfind(':') + 1);
  auto back = ServerProcess::Start({kDsv41, "--cpu_threads=1", "--listen=127.0.0.1:" + port});
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ((*back)->target(), down);
  ASSERT_TRUE(c.Refresh().ok());
  EXPECT_EQ(c.LiveServers().size(), 3u);
  std::string on_back;
  for (int i = 60; i < 160 && on_back.empty(); ++i) {
    auto seq = c.CreateSequence(model_.profile(), Id(i));
    ASSERT_TRUE(seq.ok()) << seq.status();
    if (*c.ServerOf(*seq) == down) on_back = Id(i);
  }
  ASSERT_FALSE(on_back.empty());
  ASSERT_TRUE(Prefill(c, on_back).ok());
}

TEST_F(ClusterTest, ServersFromAName) {
  // "localhost:PORT" stands for a headless Service's name: every address it resolves to is
  // a server. Only 127.0.0.1 listens, so [::1] (where localhost has it) starts down.
  ClusterOptions o = Options();
  o.servers.clear();
  o.dns_name = absl::StrCat("localhost:", servers_[0]->port());
  auto cluster = Cluster::Connect(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ((*cluster)->LiveServers(), std::vector<std::string>{servers_[0]->target()});
  UploadTables(**cluster);
  for (int i = 0; i < 10; ++i) {
    auto seq = (*cluster)->CreateSequence(model_.profile(), Id(i));
    ASSERT_TRUE(seq.ok()) << seq.status();
    EXPECT_EQ(*(*cluster)->ServerOf(*seq), servers_[0]->target());
  }
  ASSERT_TRUE(Prefill(**cluster, Id(3)).ok());
}

}  // namespace
}  // namespace smla::testing
