// Shared-memory regions belong to the tenant that registered them: another tenant (another
// bearer token) naming one in a step or unregistering it is refused and changes nothing, and
// no tenant can register another's memory or take the region a creator is about to register.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "harness.h"
#include "smla/client/shm.h"

namespace smla::testing {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kLayer = 2;
constexpr uint64_t kRegionBytes = 8 << 20;

std::string Unique(const std::string& what) { return absl::StrCat(what, "-", getpid()); }

// A server with --allow_shm and two tenants, alice and bob (a client each).
struct TwoTenants {
  void Start() {
    const std::string tokens = ::testing::TempDir() + "/shm_tokens.txt";
    std::ofstream(tokens) << "token-alice alice\ntoken-bob bob\n";
    chmod(tokens.c_str(), 0600);
    auto s = ServerProcess::Start({kDsv41, "--allow_shm", "--token_file=" + tokens});
    ASSERT_TRUE(s.ok()) << s.status();
    server = *std::move(s);
    alice = Connect("token-alice");
    bob = Connect("token-bob");
  }
  std::unique_ptr<client::Client> Connect(const std::string& token) {
    client::ClientOptions o;
    o.target = server->target();
    o.token = token;
    auto c = client::Client::Connect(o);
    EXPECT_TRUE(c.ok());
    return *std::move(c);
  }
  std::unique_ptr<ServerProcess> server;
  std::unique_ptr<client::Client> alice, bob;
};

TEST(ShmTenantTest, ForeignRegionIsPermissionDenied) {
  TwoTenants tt;
  ASSERT_NO_FATAL_FAILURE(tt.Start());
  client::Client* alice = tt.alice.get();
  client::Client* bob = tt.bob.get();
  auto info = bob->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  const v1::ModelInfo model = info->models(0);
  std::vector<float> sinks(int64_t{model.layers_size()} * model.heads_per_rank(), 0.5f);
  ASSERT_TRUE(
      bob->SetSinks(model.profile(), sinks, model.layers_size(), model.heads_per_rank()).ok());
  std::mt19937_64 rng(7);
  ASSERT_TRUE(bob->CreateSequence(model.profile(), "s").ok());
  ASSERT_TRUE(bob->Step(client::MakeStep(model, kLayer, {{"s", 0, 64, 0}}, {}, rng)).ok());
  auto alices = client::ShmRegion::Create(alice, Unique("alice"), kRegionBytes);
  ASSERT_TRUE(alices.ok()) << alices.status();
  // Bob names alice's region in a step, and tries to unregister it.
  v1::StepRequest r = client::MakeStep(model, kLayer, {{"s", 64, 6, 5}}, {}, rng);
  ASSERT_TRUE((*alices)->Place(&r).ok());
  auto refused = bob->Step(r);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("belongs to another tenant"));
  // The packed form (one region range per tensor kind for all spans) is refused the same way.
  v1::StepRequest packed = client::MakeStep(model, kLayer, {{"s", 64, 6, 5}}, {}, rng);
  ASSERT_TRUE((*alices)->Place(&packed, 0, client::ShmRegion::Layout::kPacked).ok());
  refused = bob->Step(packed);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(absl::StrCat("packed.kv_rows: region '", (*alices)->name(),
                                     "' belongs to another tenant")));
  grpc::ClientContext ctx;
  v1::UnregisterRegionRequest req;
  req.set_name((*alices)->name());
  v1::UnregisterRegionResponse resp;
  EXPECT_EQ(bob->stub()->UnregisterRegion(&ctx, req, &resp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(*bob->Length({model.profile(), "s"}, kLayer), 64);
  // Alice's region still serves alice (her own sequence), and bob's own step still runs.
  ASSERT_TRUE(alice->CreateSequence(model.profile(), "t").ok());
  v1::StepRequest p = client::MakeStep(model, kLayer, {{"t", 0, 64, 0}}, {}, rng);
  ASSERT_TRUE((*alices)->Place(&p).ok());
  EXPECT_TRUE(alice->Step(p).ok());
  EXPECT_TRUE(bob->Step(client::MakeStep(model, kLayer, {{"s", 64, 6, 5}}, {}, rng)).ok());
  EXPECT_EQ(*bob->Length({model.profile(), "s"}, kLayer), 70);
}

// Bob gets in first with everything a squatter has: the label alice's client will use, and
// then her region's name. He only ever gets memory of his own; alice's region is hers alone.
TEST(ShmTenantTest, NoTenantCanTakeAnothersRegion) {
  TwoTenants tt;
  ASSERT_NO_FATAL_FAILURE(tt.Start());
  auto bobs = client::ShmRegion::Create(tt.bob.get(), Unique("label"), kRegionBytes);
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  auto alices = client::ShmRegion::Create(tt.alice.get(), Unique("label"), kRegionBytes);
  ASSERT_TRUE(alices.ok()) << alices.status();
  EXPECT_NE((*alices)->name(), (*bobs)->name());
  // Registering by name (as a squatter would) is refused outright.
  {
    grpc::ClientContext ctx;
    v1::RegisterRegionRequest req;
    req.set_name((*alices)->name());
    req.set_size(kRegionBytes);
    auto reader = tt.bob->stub()->RegisterRegion(&ctx, req);
    v1::RegisterRegionResponse ack;
    EXPECT_FALSE(reader->Read(&ack));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Alice's steps go through her region; bob's outputs land in his own memory only.
  auto info = tt.alice->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  const v1::ModelInfo model = info->models(0);
  std::vector<float> sinks(int64_t{model.layers_size()} * model.heads_per_rank(), 0.5f);
  ASSERT_TRUE(
      tt.alice->SetSinks(model.profile(), sinks, model.layers_size(), model.heads_per_rank()).ok());
  ASSERT_TRUE(
      tt.bob->SetSinks(model.profile(), sinks, model.layers_size(), model.heads_per_rank()).ok());
  std::mt19937_64 rng(11);
  ASSERT_TRUE(tt.alice->CreateSequence(model.profile(), "a").ok());
  ASSERT_TRUE(tt.bob->CreateSequence(model.profile(), "b").ok());
  std::memset((*alices)->data(), 0x5a, kRegionBytes);
  v1::StepRequest mine = client::MakeStep(model, kLayer, {{"a", 0, 64, 0}}, {}, rng);
  auto end = (*alices)->Place(&mine);
  ASSERT_TRUE(end.ok()) << end.status();
  ASSERT_TRUE(tt.alice->Step(mine).ok());
  v1::StepRequest his = client::MakeStep(model, kLayer, {{"b", 0, 64, 0}}, {}, rng);
  ASSERT_TRUE((*bobs)->Place(&his).ok());
  ASSERT_TRUE(tt.bob->Step(his).ok());
  // Past what alice's step used, her region still holds her own bytes.
  for (uint64_t i = *end; i < kRegionBytes; i += 4096) {
    ASSERT_EQ((*alices)->data()[i], 0x5a) << "byte " << i << " of alice's region changed";
  }
  EXPECT_EQ(*tt.alice->Length({model.profile(), "a"}, kLayer), 64);
  EXPECT_EQ(*tt.bob->Length({model.profile(), "b"}, kLayer), 64);
}

// Each region holds a descriptor: --tenant_max_regions bounds one tenant, --max_regions all of
// them, so registrations cannot use up the server's descriptors. The bound is exact, the refusal
// names the cap, and a region unregistered frees its place.
TEST(ShmTenantTest, RegionCapsBoundRegistrations) {
  const std::string tokens = ::testing::TempDir() + "/shm_cap_tokens.txt";
  std::ofstream(tokens) << "token-alice alice\ntoken-bob bob\ntoken-carol carol\n";
  chmod(tokens.c_str(), 0600);
  auto server = ServerProcess::Start({kDsv41, "--allow_shm", "--token_file=" + tokens,
                                      "--tenant_max_regions=3", "--max_regions=5"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto connect = [&](const std::string& token) {
    client::ClientOptions o;
    o.target = (*server)->target();
    o.token = token;
    return *client::Client::Connect(o);
  };
  std::unique_ptr<client::Client> alice = connect("token-alice"), bob = connect("token-bob"),
                                  carol = connect("token-carol");
  auto make = [](client::Client* c, const std::string& name) {
    return client::ShmRegion::Create(c, Unique(name), 4096);
  };
  std::vector<std::unique_ptr<client::ShmRegion>> held;
  for (int i = 0; i < 3; ++i) {
    auto r = make(alice.get(), absl::StrCat("alice", i));
    ASSERT_TRUE(r.ok()) << r.status();
    held.push_back(*std::move(r));
  }
  auto over = make(alice.get(), "alice3");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("tenant_max_regions"));
  // Another tenant has its own quota, up to the server's bound of 5.
  for (int i = 0; i < 2; ++i) {
    auto r = make(bob.get(), absl::StrCat("bob", i));
    ASSERT_TRUE(r.ok()) << r.status();
    held.push_back(*std::move(r));
  }
  over = make(carol.get(), "carol0");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("max_regions"));
  // Unregistering one of alice's frees a place for carol.
  ASSERT_TRUE(held.front()->Unregister().ok());
  auto freed = make(carol.get(), "carol1");
  EXPECT_TRUE(freed.ok()) << freed.status();
}

}  // namespace
}  // namespace smla::testing
