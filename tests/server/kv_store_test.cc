#include "smla/server/kv_store.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "smla/kernels/cpu_backend.h"

namespace smla::server {
namespace {

using ::testing::HasSubstr;

class KvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<kernels::Backend>> b =
        kernels::CreateCpuBackend({.cpu_threads = 1});
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = *std::move(b);
  }

  std::unique_ptr<KvStore> Make(const std::string& spec, int32_t max_sequences = 16) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(spec);
    EXPECT_TRUE(c.ok()) << c.status();
    absl::StatusOr<std::unique_ptr<KvStore>> s = KvStore::Create(*c, *backend_, max_sequences);
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }

  // One span, prepared and committed.
  absl::Status Step(KvStore& store, const std::string& tenant, int32_t layer, const std::string& id,
                    int64_t first, int32_t rows) {
    store.BeginBatch();
    SpanWrite w{id, first, rows};
    absl::StatusOr<std::unique_ptr<PreparedStep>> p = store.Prepare(tenant, layer, {&w, 1});
    if (p.ok()) store.Commit(**p);
    store.EndBatch();
    return p.status();
  }

  std::unique_ptr<kernels::Backend> backend_;
};

TEST_F(KvStoreTest, ArenaGeometry) {
  auto store = Make("dsv4.1-flash:tp=8:page_rows=32:pool_pages=6");
  const kernels::MutableCacheView c = store->cache();
  EXPECT_NE(c.base, nullptr);
  EXPECT_EQ(c.num_pages, 6);
  EXPECT_EQ(c.rows_per_page, 32);
  EXPECT_EQ(c.pitch_bytes, 19008);  // operator.md: ceil(32*584/576)*576
  EXPECT_EQ(c.format, kernels::KvFormat::kFp8Dsv4);
  EXPECT_EQ(store->pages_total(), 6);
  EXPECT_EQ(store->page_bytes(), 19008);
}

TEST_F(KvStoreTest, AppendOverwriteTruncateRelease) {
  auto store = Make("glm-5.3-flash:tp=8:page_rows=4:pool_pages=8");
  ASSERT_TRUE(store->CreateSequence("t", "a").ok());
  EXPECT_EQ(store->CreateSequence("t", "a").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->num_sequences(), 1);

  ASSERT_TRUE(Step(*store, "t", 0, "a", 0, 10).ok());
  EXPECT_EQ(*store->Length("t", "a", 0), 10);
  EXPECT_EQ(store->pages_used(), 3);
  ASSERT_TRUE(Step(*store, "t", 0, "a", 10, 3).ok());
  EXPECT_EQ(*store->Length("t", "a", 0), 13);
  EXPECT_EQ(store->pages_used(), 4);

  absl::Status gap = Step(*store, "t", 0, "a", 14, 1);
  EXPECT_EQ(gap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(gap.message()),
              HasSubstr("spans[0].first_position 14 leaves a gap after stored length 13"));

  // Overwriting from position 5 drops everything after the new rows.
  ASSERT_TRUE(Step(*store, "t", 0, "a", 5, 2).ok());
  EXPECT_EQ(*store->Length("t", "a", 0), 7);
  EXPECT_EQ(store->pages_used(), 2);

  ASSERT_TRUE(store->Truncate("t", "a", 3).ok());
  EXPECT_EQ(*store->Length("t", "a", 0), 3);
  EXPECT_EQ(store->pages_used(), 1);
  ASSERT_TRUE(store->Truncate("t", "a", 100).ok());  // nothing past 3 to drop
  EXPECT_EQ(*store->Length("t", "a", 0), 3);

  ASSERT_TRUE(store->ReleaseSequence("t", "a").ok());
  EXPECT_EQ(store->pages_used(), 0);
  EXPECT_EQ(store->num_sequences(), 0);
  EXPECT_EQ(store->Length("t", "a", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->ReleaseSequence("t", "a").code(), absl::StatusCode::kNotFound);
}

TEST_F(KvStoreTest, SlotsFollowPageTables) {
  auto store = Make("glm-5.3-flash:tp=8:page_rows=4:pool_pages=8");
  ASSERT_TRUE(store->CreateSequence("t", "a").ok());
  ASSERT_TRUE(store->CreateSequence("t", "b").ok());
  store->BeginBatch();
  SpanWrite w[2] = {{"a", 0, 6}, {"b", 0, 3}};
  absl::StatusOr<std::unique_ptr<PreparedStep>> p = store->Prepare("t", 0, w);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->new_pages(), 3);
  std::set<int64_t> slots;
  for (int64_t pos = 0; pos < 6; ++pos) slots.insert((*p)->MainSlot(0, pos));
  for (int64_t pos = 0; pos < 3; ++pos) slots.insert((*p)->MainSlot(1, pos));
  EXPECT_EQ(slots.size(), 9u);                                // distinct slots for distinct rows
  EXPECT_EQ((*p)->MainSlot(0, 1), (*p)->MainSlot(0, 0) + 1);  // rows of a page are adjacent
  const int64_t slot5 = (*p)->MainSlot(0, 5);
  store->Commit(**p);
  store->EndBatch();
  absl::StatusOr<LayerPages> pages = store->Pages("t", "a", 0);
  ASSERT_TRUE(pages.ok());
  EXPECT_EQ(pages->main.size(), 2u);
  EXPECT_EQ(slot5, int64_t{pages->main[1]} * 4 + 1);
}

TEST_F(KvStoreTest, TenantsDoNotSeeEachOther) {
  auto store = Make("glm-5.3-flash:tp=8:page_rows=4:pool_pages=8");
  ASSERT_TRUE(store->CreateSequence("alice", "s").ok());
  ASSERT_TRUE(store->CreateSequence("bob", "s").ok());  // same name, another tenant
  ASSERT_TRUE(Step(*store, "alice", 0, "s", 0, 5).ok());
  EXPECT_EQ(*store->Length("bob", "s", 0), 0);
  EXPECT_EQ(Step(*store, "carol", 0, "s", 0, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Truncate("carol", "s", 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->ReleaseSequence("carol", "s").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store->Length("alice", "s", 0), 5);
}

TEST_F(KvStoreTest, CapacityIsAllOrNothing) {
  auto store = Make("glm-5.3-flash:tp=8:page_rows=4:pool_pages=4");
  ASSERT_TRUE(store->CreateSequence("t", "a").ok());
  ASSERT_TRUE(store->CreateSequence("t", "b").ok());
  ASSERT_TRUE(Step(*store, "t", 0, "a", 0, 4).ok());  // 1 page
  store->BeginBatch();
  SpanWrite w[2] = {{"a", 4, 8}, {"b", 0, 5}};  // 2 + 2 pages, 3 free
  absl::StatusOr<std::unique_ptr<PreparedStep>> p = store->Prepare("t", 0, w);
  store->EndBatch();
  ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("needs 4 new pages, 3 of 4 are free"));
  EXPECT_EQ(store->pages_used(), 1);
  EXPECT_EQ(*store->Length("t", "a", 0), 4);
  EXPECT_EQ(*store->Length("t", "b", 0), 0);
  // Exactly the free pages fit.
  ASSERT_TRUE(Step(*store, "t", 0, "a", 4, 12).ok());
  EXPECT_EQ(store->pages_used(), 4);
  EXPECT_EQ(Step(*store, "t", 0, "b", 0, 1).code(), absl::StatusCode::kResourceExhausted);
  // Rewriting stored positions needs no new page.
  ASSERT_TRUE(Step(*store, "t", 0, "a", 10, 6).ok());
}

TEST_F(KvStoreTest, AbortReturnsPages) {
  auto store = Make("glm-5.3-flash:tp=8:page_rows=4:pool_pages=4");
  ASSERT_TRUE(store->CreateSequence("t", "a").ok());
  store->BeginBatch();
  SpanWrite w{"a", 0, 9};
  absl::StatusOr<std::unique_ptr<PreparedStep>> p = store->Prepare("t", 0, {&w, 1});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(store->pages_used(), 3);
  store->Abort(**p);
  store->EndBatch();
  EXPECT_EQ(store->pages_used(), 0);
  EXPECT_EQ(*store->Length("t", "a", 0), 0);
}

TEST_F(KvStoreTest, SwaRingStaysBounded) {
  // W = 128, B = 16, rollback 16: at rest at most ceil((127 + 16) / 16) + 1 = 10 pages.
  auto store = Make("dsv4.1-flash:tp=8:page_rows=16:pool_pages=64");
  ASSERT_TRUE(store->CreateSequence("t", "a").ok());
  int64_t len = 0;
  for (int step = 0; step < 120; ++step) {
    // 6 rows, then roll back the last 3 (rejected drafts) on every other step.
    const int64_t first = (step % 2 == 1) ? len - 3 : len;
    ASSERT_TRUE(Step(*store, "t", 0, "a", first, 6).ok()) << "step " << step;
    len = first + 6;
    absl::StatusOr<LayerPages> pages = store->Pages("t", "a", 0);
    ASSERT_TRUE(pages.ok());
    EXPECT_LE(pages->main.size(), 10u) << "step " << step;
    EXPECT_EQ(pages->length, len);
  }
  EXPECT_GT(len, 400);
  EXPECT_LE(store->pages_used(), 10);
  // A restart further back than the kept window is refused, naming the positions.
  absl::Status far = Step(*store, "t", 0, "a", len - 100, 1);
  EXPECT_EQ(far.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(far.message()), HasSubstr("keeps positions from"));
  // ... but the allowed rollback works.
  EXPECT_TRUE(Step(*store, "t", 0, "a", len - 16, 1).ok());
  // Truncation that would cut the window is refused and changes nothing.
  absl::Status cut = store->Truncate("t", "a", 300);
  EXPECT_EQ(cut.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*store->Length("t", "a", 0), len - 15);
  EXPECT_TRUE(store->Truncate("t", "a", 0).ok());
  EXPECT_EQ(store->pages_used(), 0);
}

TEST_F(KvStoreTest, CompressedCacheGrowsAndRollsBack) {
  // Layer 2 of dsv4.1-flash: top-k over a 1/2 cache. B = 4.
  auto store = Make("dsv4.1-flash:tp=8:page_rows=4:pool_pages=64");
  ASSERT_TRUE(store->CreateSequence("t", "a").ok());
  ASSERT_TRUE(Step(*store, "t", 2, "a", 0, 19).ok());  // 9 entries -> 3 pages; 5 main pages
  absl::StatusOr<LayerPages> pages = store->Pages("t", "a", 2);
  ASSERT_TRUE(pages.ok());
  EXPECT_EQ(pages->compressed.size(), 3u);
  EXPECT_EQ(pages->main.size(), 5u);
  ASSERT_TRUE(Step(*store, "t", 2, "a", 7, 1).ok());  // length 8: 4 entries -> 1 page
  pages = store->Pages("t", "a", 2);
  EXPECT_EQ(pages->compressed.size(), 1u);
  EXPECT_EQ(pages->main.size(), 2u);
  EXPECT_EQ(store->pages_used(), 3);
  // Other layers are untouched.
  EXPECT_EQ(*store->Length("t", "a", 3), 0);
  ASSERT_TRUE(store->Truncate("t", "a", 3).ok());
  pages = store->Pages("t", "a", 2);
  EXPECT_EQ(pages->compressed.size(), 1u);  // entry 0 (positions 0..1) stays
  EXPECT_EQ(pages->main.size(), 1u);
  EXPECT_EQ(pages->length, 3);
}

TEST_F(KvStoreTest, SequenceLimitAndUnknownLayer) {
  auto store = Make("glm-5.3-flash:tp=8:page_rows=4:pool_pages=4", /*max_sequences=*/2);
  ASSERT_TRUE(store->CreateSequence("t", "a").ok());
  ASSERT_TRUE(store->CreateSequence("u", "a").ok());
  EXPECT_EQ(store->CreateSequence("t", "b").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store->CreateSequence("t", "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Length("t", "a", 1).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace smla::server
