#include "smla/server/kv_store.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "smla/kernels/cpu_backend.h"

namespace smla::server {
namespace {

using ::testing::HasSubstr;

// Tables compared entry by entry (LayerPages has no operator==).
void ExpectSame(const LayerPages& got, const LayerPages& want, const std::string& what) {
  EXPECT_EQ(got.length, want.length) << what;
  EXPECT_EQ(got.main_first_page, want.main_first_page) << what;
  EXPECT_EQ(std::vector<int32_t>(got.main.begin(), got.main.end()),
            std::vector<int32_t>(want.main.begin(), want.main.end()))
      << what;
  EXPECT_EQ(got.compressed, want.compressed) << what;
}

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
  EXPECT_EQ(c.pitch_bytes, 19008);  // docs/operator.md: ceil(32*584/576)*576
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

// Prepare edits the live tables; Abort must put them back exactly, and while the step is pending
// Length() and Pages() show the committed state, pages() the state after the step.
TEST_F(KvStoreTest, AbortRestoresTablesExactly) {
  const std::string dsv4 = "dsv4.1-flash:tp=8:page_rows=16:pool_pages=256";
  const std::string glm = "glm-5.3-flash:tp=8:page_rows=16:pool_pages=256";
  struct Case {
    const char* what;
    std::string spec;
    int32_t layer;
    std::vector<SpanWrite> spans;
    int64_t added;     // new pages
    int64_t released;  // pages the step moves out of the tables
  };
  // From length 300 on both sequences. dsv4.1-flash layer 0: window only; layer 20: window +
  // 1/1 compressed. W = 128, B = 16, rollback 16 unless set.
  const std::vector<Case> cases = {
      // 300 -> 306: from page 18 (positions 288..303) into page 19 of each table.
      {"append", dsv4, 20, {{"a", 300, 6}}, 2, 0},
      // Restart at 286 (14 back) with one row: page 18 of main and of compressed go.
      {"rollback", dsv4, 20, {{"a", 286, 1}}, 0, 2},
      // Restart at 240: pages 16..18 of main and of compressed go, so their order matters.
      {"rollback of pages", dsv4 + ":swa_rollback=64", 20, {{"a", 240, 1}}, 0, 6},
      // A full cache restarting far back: pages 13..18 go.
      {"full cache rollback", glm, 0, {{"b", 200, 3}}, 0, 6},
      // A window-only layer, crossing two page boundaries (300 -> 340: pages 19..21).
      {"window crossing pages", dsv4, 0, {{"b", 300, 40}}, 3, 0},
      // Both at once in one request, on different sequences.
      {"append and rollback", dsv4, 20, {{"a", 300, 40}, {"b", 285, 2}}, 6, 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto store = Make(c.spec);
    const bool window = store->profile().layers[c.layer].has_window();
    const bool compressed = store->profile().layers[c.layer].has_compressed();
    for (const char* id : {"a", "b"}) {
      ASSERT_TRUE(store->CreateSequence("t", id).ok());
      for (int64_t at = 0; at < 300; at += 50) {
        ASSERT_TRUE(Step(*store, "t", c.layer, id, at, 50).ok());
      }
    }
    std::vector<LayerPages> before;
    for (const SpanWrite& w : c.spans) before.push_back(*store->Pages("t", w.sequence_id, c.layer));
    const int64_t used = store->pages_used();
    EXPECT_EQ(store->tenant_pages("t"), used);
    for (const bool commit : {false, true}) {
      SCOPED_TRACE(commit ? "commit" : "abort");
      store->BeginBatch();
      absl::StatusOr<std::unique_ptr<PreparedStep>> p = store->Prepare("t", c.layer, c.spans);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ((*p)->new_pages(), c.added);
      EXPECT_EQ(store->pages_used(), used + c.added);
      std::vector<LayerPages> next;
      for (size_t i = 0; i < c.spans.size(); ++i) {
        const SpanWrite& w = c.spans[i];
        const int64_t end = w.first_position + w.num_rows;
        next.push_back((*p)->pages(i));
        EXPECT_EQ(next[i].length, end);
        EXPECT_EQ(next[i].main_first_page, before[i].main_first_page);
        EXPECT_EQ(next[i].main_first_page + static_cast<int64_t>(next[i].main.size()),
                  (end - 1) / 16 + 1);
        if (compressed) {
          EXPECT_EQ(static_cast<int64_t>(next[i].compressed.size()), (end + 15) / 16);
        }
        EXPECT_EQ((*p)->MainSlot(i, end - 1), int64_t{next[i].main.back()} * 16 + (end - 1) % 16);
        // The committed state is what other callers see until Commit.
        EXPECT_EQ(*store->Length("t", w.sequence_id, c.layer), before[i].length);
        ExpectSame(*store->Pages("t", w.sequence_id, c.layer), before[i], "Pages() while prepared");
      }
      if (!commit) {
        store->Abort(**p);
        store->EndBatch();
        for (size_t i = 0; i < c.spans.size(); ++i) {
          ExpectSame(*store->Pages("t", c.spans[i].sequence_id, c.layer), before[i], "after Abort");
        }
        EXPECT_EQ(store->pages_used(), used);
        EXPECT_EQ(store->tenant_pages("t"), used);
        continue;
      }
      store->Commit(**p);
      store->EndBatch();
      // The step's tables, less the window pages that slid out.
      int64_t slid_total = 0;
      for (size_t i = 0; i < c.spans.size(); ++i) {
        const LayerPages got = *store->Pages("t", c.spans[i].sequence_id, c.layer);
        const int64_t keep_from =
            std::max<int64_t>(0, next[i].length - store->config().swa_rollback - 127);
        const int64_t slid =
            window ? std::max<int64_t>(0, keep_from / 16 - next[i].main_first_page) : 0;
        slid_total += slid;
        next[i].main.erase(next[i].main.begin(), next[i].main.begin() + slid);
        next[i].main_first_page += slid;
        ExpectSame(got, next[i], "after Commit");
        EXPECT_EQ(*store->Length("t", c.spans[i].sequence_id, c.layer), next[i].length);
      }
      EXPECT_EQ(store->pages_used(), used + c.added - c.released - slid_total);
      EXPECT_EQ(store->tenant_pages("t"), store->pages_used());
    }
  }
}

// Random steps, rollbacks, refusals, aborts and truncations against a direct model of the
// tables (copy the table, change the copy, keep it at Commit), checking every table after every
// batch and the committed view while steps are pending.
TEST_F(KvStoreTest, MatchesAModelOfTheTables) {
  for (const std::string spec : {"dsv4.1-flash:tp=8:page_rows=8:pool_pages=4096",
                                 "glm-5.3-flash:tp=8:page_rows=8:pool_pages=4096"}) {
    SCOPED_TRACE(spec);
    auto store = Make(spec, 8);
    const ModelProfile& profile = store->profile();
    const int32_t B = store->config().page_rows;
    const int64_t W = profile.swa_window;
    const int64_t rollback = store->config().swa_rollback;
    std::vector<int32_t> layers;
    for (int32_t l : {0, 2, 20}) {
      if (l < profile.num_layers()) layers.push_back(l);
    }
    const std::vector<std::string> ids = {"a", "b", "c", "d", "e"};
    // model[id][layer]
    std::map<std::string, std::map<int32_t, LayerPages>> model;
    for (const std::string& id : ids) {
      ASSERT_TRUE(store->CreateSequence("t", id).ok());
      for (int32_t l = 0; l < profile.num_layers(); ++l) model[id][l] = LayerPages();
    }
    auto check_all = [&](const std::string& when) {
      std::set<int32_t> held;
      int64_t total = 0;
      for (const std::string& id : ids) {
        for (int32_t l : layers) {
          const LayerPages& m = model[id][l];
          ExpectSame(*store->Pages("t", id, l), m, absl::StrCat(when, " ", id, "/", l));
          EXPECT_EQ(*store->Length("t", id, l), m.length);
          held.insert(m.main.begin(), m.main.end());
          held.insert(m.compressed.begin(), m.compressed.end());
          total += static_cast<int64_t>(m.main.size() + m.compressed.size());
        }
      }
      EXPECT_EQ(static_cast<int64_t>(held.size()), total) << when << ": a page in two places";
      return total;
    };
    std::mt19937 rng(20261130);
    auto uniform = [&](int64_t lo, int64_t hi) {
      return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
    };
    int commits = 0, aborts = 0, refusals = 0, rollbacks = 0;
    for (int batch = 0; batch < 400; ++batch) {
      const std::string when = absl::StrCat("batch ", batch);
      const int32_t layer = layers[uniform(0, layers.size() - 1)];
      const LayerSpec& ls = profile.layers[layer];
      // Requests of 1..2 spans over distinct sequences.
      std::vector<std::string> order = ids;
      std::shuffle(order.begin(), order.end(), rng);
      const size_t used_seqs = uniform(1, ids.size());
      std::vector<std::vector<SpanWrite>> requests;
      for (size_t k = 0; k < used_seqs;) {
        const size_t n = std::min<size_t>(uniform(1, 2), used_seqs - k);
        std::vector<SpanWrite> r;
        for (size_t j = 0; j < n; ++j, ++k) {
          const LayerPages& m = model[order[k]][layer];
          int64_t first = m.length;
          const int64_t kind = uniform(0, 9);
          if (kind < 3) {
            first = std::max<int64_t>(0, m.length - uniform(1, rollback + 3));
          } else if (kind == 3) {
            first = m.length + uniform(1, 3);  // a gap: refused
          } else if (kind == 4 && !ls.has_window()) {
            first = uniform(0, m.length);  // full caches restart anywhere
          }
          r.push_back(SpanWrite{order[k], first, static_cast<int32_t>(uniform(1, 40))});
        }
        requests.push_back(std::move(r));
      }
      std::vector<std::unique_ptr<PreparedStep>> prepared;
      std::vector<size_t> prepared_of;
      store->BeginBatch();
      for (size_t r = 0; r < requests.size(); ++r) {
        bool valid = true;
        for (const SpanWrite& w : requests[r]) {
          const LayerPages& m = model[std::string(w.sequence_id)][layer];
          valid = valid && w.first_position <= m.length;
          if (ls.has_window()) {
            valid =
                valid && std::max<int64_t>(0, w.first_position - (W - 1)) >= m.main_first_page * B;
          }
        }
        const int64_t used = store->pages_used();
        absl::StatusOr<std::unique_ptr<PreparedStep>> p = store->Prepare("t", layer, requests[r]);
        ASSERT_EQ(p.ok(), valid) << when << ": " << p.status();
        if (!p.ok()) {
          EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
          EXPECT_EQ(store->pages_used(), used);
          ++refusals;
          continue;
        }
        // The prepared tables are the model's table after the step, new pages at the ends.
        for (size_t i = 0; i < requests[r].size(); ++i) {
          const SpanWrite& w = requests[r][i];
          const LayerPages& m = model[std::string(w.sequence_id)][layer];
          const LayerPages& next = (*p)->pages(i);
          const int64_t end = w.first_position + w.num_rows;
          if (end < m.length) ++rollbacks;
          const int64_t main_pages = (end - 1) / B + 1 - m.main_first_page;
          EXPECT_EQ(next.length, end);
          EXPECT_EQ(next.main_first_page, m.main_first_page);
          ASSERT_EQ(static_cast<int64_t>(next.main.size()), main_pages) << when;
          const size_t main_kept = std::min(next.main.size(), m.main.size());
          EXPECT_TRUE(std::equal(m.main.begin(), m.main.begin() + main_kept, next.main.begin()))
              << when;
          const int64_t comp_pages = ls.has_compressed() ? (end / ls.ratio + B - 1) / B : 0;
          ASSERT_EQ(static_cast<int64_t>(next.compressed.size()), comp_pages) << when;
          const size_t comp_kept = std::min(next.compressed.size(), m.compressed.size());
          EXPECT_TRUE(std::equal(m.compressed.begin(), m.compressed.begin() + comp_kept,
                                 next.compressed.begin()))
              << when;
        }
        prepared.push_back(*std::move(p));
        prepared_of.push_back(r);
      }
      check_all(when + " (prepared)");
      for (size_t k = 0; k < prepared.size(); ++k) {
        if (uniform(0, 3) == 0) {
          store->Abort(*prepared[k]);
          ++aborts;
          continue;
        }
        const std::vector<SpanWrite>& req = requests[prepared_of[k]];
        std::vector<LayerPages> next;
        for (size_t i = 0; i < req.size(); ++i) next.push_back(prepared[k]->pages(i));
        store->Commit(*prepared[k]);
        ++commits;
        for (size_t i = 0; i < req.size(); ++i) {
          LayerPages& m = model[std::string(req[i].sequence_id)][layer];
          m = next[i];
          if (ls.has_window()) {
            const int64_t first_page = std::max<int64_t>(0, m.length - rollback - (W - 1)) / B;
            while (m.main_first_page < first_page && !m.main.empty()) {
              m.main.pop_front();
              ++m.main_first_page;
            }
          }
        }
      }
      store->EndBatch();
      const int64_t total = check_all(when);
      EXPECT_EQ(store->pages_used(), total) << when;
      EXPECT_EQ(store->tenant_pages("t"), total) << when;
      // Now and then a sequence that grew long starts over.
      for (const std::string& id : ids) {
        if (model[id][layer].length > 500 && uniform(0, 1) == 0) {
          ASSERT_TRUE(store->Truncate("t", id, 0).ok());
          for (auto& [l, m] : model[id]) m = LayerPages();
        }
      }
      if (HasFailure()) break;
    }
    EXPECT_GT(commits, 100);
    EXPECT_GT(aborts, 30);
    EXPECT_GT(refusals, 10);
    EXPECT_GT(rollbacks, 30);
  }
}

// Prints (never asserts on) the store's share of a decode batch: 32 sequences at 128K context
// on dsv4.1-flash layer 20 (window + 1/1 compressed cache: 2,048 compressed pages each), one
// 6-row span per request, Prepare then Commit (or Abort) of every request.
TEST_F(KvStoreTest, PrepareCommitTimeOfTheDecodeCell) {
  auto store = Make("dsv4.1-flash:tp=4:page_rows=64:pool_pages=70000", 32);
  const int32_t layer = 20;
  const int64_t context = 128 * 1024;
  std::vector<std::string> ids;
  for (int i = 0; i < 32; ++i) {
    ids.push_back(absl::StrCat("s", i));
    ASSERT_TRUE(store->CreateSequence("t", ids.back()).ok());
    for (int64_t at = 0; at < context; at += 16384) {
      ASSERT_TRUE(Step(*store, "t", layer, ids.back(), at, 16384).ok());
    }
  }
  int64_t length = context;
  std::vector<std::unique_ptr<PreparedStep>> prepared(ids.size());
  auto batch_us = [&](bool commit) {
    std::vector<double> t;
    for (int k = 0; k < 41; ++k) {
      const auto a = std::chrono::steady_clock::now();
      store->BeginBatch();
      for (size_t i = 0; i < ids.size(); ++i) {
        SpanWrite w{ids[i], length, 6};
        absl::StatusOr<std::unique_ptr<PreparedStep>> p = store->Prepare("t", layer, {&w, 1});
        if (!p.ok()) std::abort();
        prepared[i] = *std::move(p);
      }
      for (auto& p : prepared) commit ? store->Commit(*p) : store->Abort(*p);
      store->EndBatch();
      t.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
      if (commit) length += 6;
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double abort_us = batch_us(false);
  const double commit_us = batch_us(true);
  EXPECT_EQ(*store->Length("t", ids[0], layer), length);
  std::printf("decode C=32 at 128K, layer %d: Prepare+Commit %.1f us, Prepare+Abort %.1f us\n",
              layer, commit_us, abort_us);
}

}  // namespace
}  // namespace smla::server
