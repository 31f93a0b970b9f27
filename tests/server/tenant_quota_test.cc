// Per-tenant quotas and leases of the KV store: page accounting through prepare, commit, abort,
// truncate, window trimming and release, and idle sequences released on every layer.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "smla/kernels/cpu_backend.h"
#include "smla/server/kv_store.h"

namespace smla::server {
namespace {

using ::testing::HasSubstr;

class TenantQuotaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = kernels::CreateCpuBackend({.cpu_threads = 1});
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = *std::move(b);
  }

  std::unique_ptr<KvStore> Make(const std::string& spec) {
    auto c = ParseModelConfig(spec);
    EXPECT_TRUE(c.ok()) << c.status();
    auto s = KvStore::Create(*c, *backend_, 16);
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }

  absl::Status Step(KvStore& store, const std::string& tenant, int32_t layer, const std::string& id,
                    int64_t first, int32_t rows, bool abort = false) {
    store.BeginBatch();
    SpanWrite w{id, first, rows};
    auto p = store.Prepare(tenant, layer, {&w, 1});
    if (p.ok()) abort ? store.Abort(**p) : store.Commit(**p);
    store.EndBatch();
    return p.status();
  }

  std::unique_ptr<kernels::Backend> backend_;
};

TEST_F(TenantQuotaTest, SequenceQuotaPerTenant) {
  auto store = Make("glm-5.3-flash:tp=8:page_rows=4:pool_pages=64");
  store->SetTenantQuota(2, 0);
  ASSERT_TRUE(store->CreateSequence("a", "1").ok());
  ASSERT_TRUE(store->CreateSequence("a", "2").ok());
  absl::Status st = store->CreateSequence("a", "3");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(st.message()), HasSubstr("tenant quota of sequences"));
  EXPECT_TRUE(store->CreateSequence("b", "3").ok());
  ASSERT_TRUE(store->ReleaseSequence("a", "1").ok());
  EXPECT_TRUE(store->CreateSequence("a", "3").ok());
  EXPECT_EQ(store->tenant_sequences("a"), 2);
  EXPECT_EQ(store->tenant_sequences("b"), 1);
}

TEST_F(TenantQuotaTest, PageQuotaFollowsEveryChange) {
  auto store = Make("glm-5.3-flash:tp=8:page_rows=4:pool_pages=64");
  store->SetTenantQuota(0, 5);
  ASSERT_TRUE(store->CreateSequence("a", "x").ok());
  ASSERT_TRUE(store->CreateSequence("b", "x").ok());
  ASSERT_TRUE(Step(*store, "a", 0, "x", 0, 12).ok());  // 3 pages
  EXPECT_EQ(store->tenant_pages("a"), 3);
  absl::Status st = Step(*store, "a", 0, "x", 12, 12);  // 3 more: 6 > 5
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(st.message()), HasSubstr("tenant quota of pages"));
  EXPECT_EQ(store->tenant_pages("a"), 3);
  ASSERT_TRUE(Step(*store, "a", 0, "x", 12, 8, /*abort=*/true).ok());
  EXPECT_EQ(store->tenant_pages("a"), 3);  // an aborted step gives its pages back
  ASSERT_TRUE(Step(*store, "a", 0, "x", 12, 8).ok());
  EXPECT_EQ(store->tenant_pages("a"), 5);             // exactly the quota
  ASSERT_TRUE(Step(*store, "a", 0, "x", 4, 2).ok());  // rewrite from 4: pages past 6 go
  EXPECT_EQ(store->tenant_pages("a"), 2);
  EXPECT_EQ(store->pages_used(), 2);
  ASSERT_TRUE(Step(*store, "b", 0, "x", 0, 20).ok());  // b has its own quota
  EXPECT_EQ(store->tenant_pages("b"), 5);
  ASSERT_TRUE(store->Truncate("b", "x", 3).ok());
  EXPECT_EQ(store->tenant_pages("b"), 1);
  ASSERT_TRUE(store->ReleaseSequence("a", "x").ok());
  ASSERT_TRUE(store->ReleaseSequence("b", "x").ok());
  EXPECT_EQ(store->tenant_pages("a"), 0);
  EXPECT_EQ(store->tenant_pages("b"), 0);
  EXPECT_EQ(store->pages_used(), 0);
}

TEST_F(TenantQuotaTest, WindowTrimmingReturnsPagesToTheTenant) {
  // dsv4.1-flash layer 0 is sliding-window only: a long sequence holds a bounded ring.
  auto store = Make("dsv4.1-flash:tp=8:page_rows=16:pool_pages=64");
  ASSERT_TRUE(store->CreateSequence("a", "w").ok());
  for (int64_t pos = 0; pos < 1024; pos += 64) ASSERT_TRUE(Step(*store, "a", 0, "w", pos, 64).ok());
  EXPECT_EQ(store->tenant_pages("a"), store->pages_used());
  EXPECT_LT(store->pages_used(), 1024 / 16);
}

TEST_F(TenantQuotaTest, IdleSequencesAreReleasedOnEveryLayer) {
  auto store = Make("dsv4.1-flash:tp=8:page_rows=16:pool_pages=64");
  ASSERT_TRUE(store->CreateSequence("a", "old").ok());
  for (int32_t layer : {0, 2}) ASSERT_TRUE(Step(*store, "a", layer, "old", 0, 40).ok());
  const absl::Time cutoff = absl::Now();
  ASSERT_TRUE(store->CreateSequence("a", "new").ok());
  ASSERT_TRUE(Step(*store, "a", 0, "new", 0, 8).ok());
  const int64_t new_pages = 1;
  auto released = store->ReleaseIdle(cutoff);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0], std::make_pair(std::string("a"), std::string("old")));
  EXPECT_EQ(store->Length("a", "old", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->pages_used(), new_pages);
  EXPECT_EQ(store->tenant_pages("a"), new_pages);
  EXPECT_EQ(store->tenant_sequences("a"), 1);
}

}  // namespace
}  // namespace smla::server
