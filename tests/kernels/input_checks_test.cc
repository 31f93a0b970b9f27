// The checks of a step's inputs on the backend (input_checks.h, Backend::CheckInputs): chosen
// entries into slots, values checked, both in one call, and row writes that skip
// the groups either flagged (WriteRowsParams::groups): the semantics every backend shares, on
// the CPU backend. smla-gpu-test checks that the GPU backend flags and writes the same.
#include "smla/kernels/input_checks.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "smla/kernels/cpu_backend.h"

namespace smla::kernels {
namespace {

class TranslateTest : public ::testing::Test {
 protected:
  // Translates each of `rows` (ids, limit, group) through `table` (pages of 4 rows), held in
  // blocks of 2 pages; returns the flags of `groups` groups.
  struct Row {
    std::vector<int32_t> ids;
    int32_t limit = 0;
    int32_t group = 0;
    std::vector<int32_t> out;
  };
  std::vector<uint32_t> Translate(std::vector<Row>& rows, const std::vector<int32_t>& table,
                                  int groups) {
    // Blocks in reverse order in their own memory, so a lookup that ignored the block list
    // would read the wrong pages.
    std::vector<int32_t> heap(table.size() + 2, -7);
    std::vector<const int32_t*> blocks;
    for (size_t b = 0; 2 * b < table.size(); ++b) {
      int32_t* at = heap.data() + heap.size() - 2 * (b + 1);
      std::copy(table.begin() + 2 * b, table.begin() + std::min(table.size(), 2 * b + 2), at);
      blocks.push_back(at);
    }
    std::vector<TranslateRow> desc;
    for (Row& r : rows) {
      r.out.assign(r.ids.size(), 12345);
      desc.push_back(TranslateRow{r.ids.data(), r.out.data(), blocks.data(),
                                  static_cast<int32_t>(r.ids.size()), r.limit, r.group, 0});
    }
    std::vector<uint32_t> flags(groups, 0);
    CheckInputsParams p;
    p.entries.rows = desc.data();
    p.entries.num_rows = static_cast<int32_t>(desc.size());
    p.entries.page_shift = 2;
    p.entries.block_shift = 1;
    p.flags = flags.data();
    EXPECT_TRUE(backend_->CheckInputs(p, *stream_).ok());
    return flags;
  }

  std::unique_ptr<Backend> backend_ = *CreateCpuBackend({.cpu_threads = 1});
  std::unique_ptr<Stream> stream_ = *backend_->CreateStream();
};

TEST_F(TranslateTest, SentinelsPagesAndTheRowLimit) {
  const std::vector<int32_t> table = {7, 2, 9};  // entries 0..11
  std::vector<Row> rows = {{{0, 3, 4, -1, 11, 5, -1, 8}, 12, 0, {}}, {{-1, -1}, 0, 1, {}}};
  EXPECT_EQ(Translate(rows, table, 2), (std::vector<uint32_t>{0, 0}));
  EXPECT_EQ(rows[0].out, (std::vector<int32_t>{28, 31, 8, -1, 39, 9, -1, 36}));
  EXPECT_EQ(rows[1].out, (std::vector<int32_t>{-1, -1}));
}

// The row's own limit decides, not the table's end, and only -1 is a sentinel: a bad id
// becomes -1 (nothing outside the table is read) and flags its group alone.
TEST_F(TranslateTest, BadIdsFlagTheirGroupOnly) {
  const std::vector<int32_t> table = {7, 2, 9, 4};  // entries 0..15
  for (const int32_t bad : {10, 16, -2, INT32_MIN, INT32_MAX}) {
    SCOPED_TRACE(bad);
    std::vector<Row> rows = {{{0, 1, 2}, 10, 0, {}}, {{3, bad, 9}, 10, 1, {}}, {{9}, 10, 2, {}}};
    EXPECT_EQ(Translate(rows, table, 3), (std::vector<uint32_t>{0, kFlagChosenEntry, 0}));
    EXPECT_EQ(rows[1].out, (std::vector<int32_t>{31, -1, 37}));
    EXPECT_EQ(rows[2].out, (std::vector<int32_t>{37}));
  }
  // Two rows of one group, one bad: the group is flagged once; an empty table takes only -1.
  std::vector<Row> rows = {{{0}, 1, 1, {}}, {{1}, 1, 1, {}}, {{-1, 0}, 0, 0, {}}};
  EXPECT_EQ(Translate(rows, table, 2), (std::vector<uint32_t>{kFlagChosenEntry, kFlagChosenEntry}));
  EXPECT_EQ(rows[2].out, (std::vector<int32_t>{-1, -1}));
}

TEST_F(TranslateTest, RefusesBadParams) {
  uint32_t flag = 0;
  CheckInputsParams p;
  p.flags = &flag;
  p.entries.num_rows = 1;  // rows null
  EXPECT_EQ(backend_->CheckInputs(p, *stream_).code(), absl::StatusCode::kInvalidArgument);
  p.entries.num_rows = 0;
  p.entries.page_shift = 31;
  EXPECT_EQ(backend_->CheckInputs(p, *stream_).code(), absl::StatusCode::kInvalidArgument);
  p.entries.page_shift = 0;
  p.num_ranges = -1;
  EXPECT_EQ(backend_->CheckInputs(p, *stream_).code(), absl::StatusCode::kInvalidArgument);
  const TranslateRow row{};
  p.num_ranges = 0;
  p.entries.rows = &row;
  p.entries.num_rows = 1;
  p.flags = nullptr;  // work without flags
  EXPECT_EQ(backend_->CheckInputs(p, *stream_).code(), absl::StatusCode::kInvalidArgument);
  p.flags = &flag;
  EXPECT_TRUE(backend_->CheckInputs(p, *stream_).ok());  // a row of width 0
}

// KV values: finite and |x| <= 2^64 (bf16 0x5f80), either sign; e4m3 codes 0x7f / 0xff and the
// scale byte 0xff are NaN. A refused value flags its range's group alone, with the value bit.
TEST_F(TranslateTest, ValueChecksFlagTheirGroupOnly) {
  struct Case {
    InputCheck check;
    std::vector<uint8_t> ok, bad;
  };
  auto bf16 = [](std::initializer_list<uint16_t> v) {
    std::vector<uint8_t> b(v.size() * 2);
    std::memcpy(b.data(), std::data(v), b.size());
    return b;
  };
  const Case cases[] = {
      {InputCheck::kKvRows, bf16({0x3f80, 0x5f80, 0xdf80, 0x0001, 0x8000}), bf16({0x3f80, 0x5f81})},
      {InputCheck::kKvRows, bf16({0}), bf16({0x7f80})},  // inf
      {InputCheck::kKvRows, bf16({0}), bf16({0xffc1})},  // a NaN
      {InputCheck::kE4m3Codes, {0x7e, 0xfe, 0x00, 0x80}, {0x00, 0x7f}},
      {InputCheck::kE4m3Codes, {0x01}, {0xff}},
      {InputCheck::kE8m0Scales, {0x00, 0xfe, 0x7f}, {0x7f, 0xff}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.check));
    const CheckRange ranges[] = {
        {c.ok.data(), static_cast<int64_t>(c.ok.size()), c.check, 0},
        {c.bad.data(), static_cast<int64_t>(c.bad.size()), c.check, 2},
        {c.bad.data(), 0, c.check, 1},  // empty: nothing to refuse
    };
    std::vector<uint32_t> flags = {0, 0, kFlagChosenEntry};
    CheckInputsParams p;
    p.ranges = ranges;
    p.num_ranges = 3;
    p.flags = flags.data();
    ASSERT_TRUE(backend_->CheckInputs(p, *stream_).ok());
    EXPECT_EQ(flags, (std::vector<uint32_t>{0, 0, kFlagChosenEntry | kFlagInputValue}));
  }
  CheckInputsParams p;
  p.num_ranges = 1;
  EXPECT_EQ(backend_->CheckInputs(p, *stream_).code(), absl::StatusCode::kInvalidArgument);
}

// One call checks values and translates entries: each flags its own group with its own bit.
TEST_F(TranslateTest, OneCallChecksValuesAndTranslatesEntries) {
  const std::vector<uint8_t> nan_row = {0xc0, 0x7f};  // bf16 NaN
  const CheckRange range{nan_row.data(), 2, InputCheck::kKvRows, 0};
  const std::vector<int32_t> table = {5};
  const int32_t* const blocks[] = {table.data()};
  const std::vector<int32_t> ids = {1, 4, 2};  // 4 is past the limit of 3
  std::vector<int32_t> out(3, 12345);
  const TranslateRow row{ids.data(), out.data(), blocks, 3, 3, 1, 0};
  std::vector<uint32_t> flags(3, 0);
  CheckInputsParams p;
  p.ranges = &range;
  p.num_ranges = 1;
  p.entries.rows = &row;
  p.entries.num_rows = 1;
  p.entries.page_shift = 2;
  p.flags = flags.data();
  ASSERT_TRUE(backend_->CheckInputs(p, *stream_).ok());
  EXPECT_EQ(flags, (std::vector<uint32_t>{kFlagInputValue, kFlagChosenEntry, 0}));
  EXPECT_EQ(out, (std::vector<int32_t>{21, -1, 22}));
}

// The same pass writes changed table blocks where they are kept, whole blocks, while rows read
// the changed blocks' copies.
TEST_F(TranslateTest, WritesTableBlocksInTheSamePass) {
  std::vector<int32_t> kept(12);  // three blocks of 4 pages as kept: pages 20..31
  std::iota(kept.begin(), kept.end(), 20);
  const std::vector<int32_t> fresh = {3, 8, 1, 6, 0, 2, 9, 4};  // two blocks of new contents
  const TableBlockWrite writes[] = {{fresh.data(), kept.data() + 8},
                                    {fresh.data() + 4, kept.data()}};
  const int32_t* const blocks[] = {fresh.data(), kept.data() + 4};
  const std::vector<int32_t> ids = {0, 3, 5};
  std::vector<int32_t> out(3, 12345);
  const TranslateRow row{ids.data(), out.data(), blocks, 3, 8, 0, 0};
  uint32_t flags = 0;
  CheckInputsParams p;
  p.entries.rows = &row;
  p.entries.num_rows = 1;
  p.entries.page_shift = 0;
  p.entries.block_shift = 2;
  p.entries.num_block_writes = 2;
  p.entries.block_writes = writes;
  p.flags = &flags;
  ASSERT_TRUE(backend_->CheckInputs(p, *stream_).ok());
  EXPECT_EQ(flags, 0u);
  EXPECT_EQ(out, (std::vector<int32_t>{3, 6, 25}));  // entry 5: the kept second block
  EXPECT_EQ(kept, (std::vector<int32_t>{0, 2, 9, 4, 24, 25, 26, 27, 3, 8, 1, 6}));
}

// A row's window: consecutive positions through the span's page list, from an offset into its
// first page, across page boundaries.
TEST_F(TranslateTest, WritesWindowRuns) {
  const std::vector<int32_t> pages = {7, 2, 9};  // pages of 4 rows
  std::vector<int32_t> a(6, 12345), b(2, 12345);
  const PositionRun runs[] = {{pages.data(), a.data(), 3, 6},       // positions 3..8
                              {pages.data() + 2, b.data(), 1, 2}};  // page 9, rows 1..2
  CheckInputsParams p;
  p.entries.page_shift = 2;
  p.entries.runs = runs;
  p.entries.num_runs = 2;
  ASSERT_TRUE(backend_->CheckInputs(p, *stream_).ok());
  EXPECT_EQ(a, (std::vector<int32_t>{31, 8, 9, 10, 11, 36}));
  EXPECT_EQ(b, (std::vector<int32_t>{37, 38}));
  p.entries.runs = nullptr;
  EXPECT_EQ(backend_->CheckInputs(p, *stream_).code(), absl::StatusCode::kInvalidArgument);
}

// Ranges with a copy are checked as copied (kNone only copies); rows with `seen` keep the ids
// they translated.
TEST_F(TranslateTest, ChecksCopyWhatTheyRead) {
  const std::vector<uint8_t> kv = {0x80, 0x3f, 0xc0, 0x7f};  // 1.0, NaN
  const std::vector<uint8_t> q = {1, 2, 3, 0x7f};            // not checked: only copied
  std::vector<uint8_t> kv_copy(4, 0), q_copy(4, 0);
  const CheckRange ranges[] = {{kv.data(), 4, InputCheck::kKvRows, 0, kv_copy.data()},
                               {q.data(), 4, InputCheck::kNone, 1, q_copy.data()}};
  const std::vector<int32_t> table = {5};
  const int32_t* const blocks[] = {table.data()};
  const std::vector<int32_t> ids = {1, -1, 9};
  std::vector<int32_t> out(3, 0), seen(3, 0);
  TranslateRow row{ids.data(), out.data(), blocks, 3, 4, 2, 0};
  row.seen = seen.data();
  std::vector<uint32_t> flags(3, 0);
  CheckInputsParams p;
  p.ranges = ranges;
  p.num_ranges = 2;
  p.entries.rows = &row;
  p.entries.num_rows = 1;
  p.entries.page_shift = 2;
  p.flags = flags.data();
  ASSERT_TRUE(backend_->CheckInputs(p, *stream_).ok());
  EXPECT_EQ(flags, (std::vector<uint32_t>{kFlagInputValue, 0, kFlagChosenEntry}));
  EXPECT_EQ(kv_copy, kv);
  EXPECT_EQ(q_copy, q);
  EXPECT_EQ(seen, ids);
  EXPECT_EQ(out, (std::vector<int32_t>{21, -1, -1}));
}

// Rows of a flagged group are not written; the others are, and groups come one per slot. The
// flags are handed over where the caller asks (flags_out), and only with them.
TEST_F(TranslateTest, RowWritesSkipFlaggedGroups) {
  std::vector<uint8_t> pool(4 * 1024, 0);
  std::vector<uint16_t> rows(3 * 512);
  for (int i = 0; i < 3 * 512; ++i) rows[i] = static_cast<uint16_t>(0x3f80 + i / 512);
  const std::vector<int64_t> slots = {0, 1, 2};
  const std::vector<int32_t> groups = {0, 1, 0};
  const std::vector<uint32_t> flags = {0, 1};
  std::vector<uint32_t> handed(2, 7);
  WriteRowsParams p;
  p.cache = {pool.data(), KvFormat::kBf16, Geometry::kRopeFree, 1, 4, 4096, 1.0f};
  p.slots = slots;
  p.rows = rows.data();
  p.groups = groups;
  p.group_flags = flags.data();
  p.flags_out = handed;
  ASSERT_TRUE(backend_->WriteRows(p, *stream_).ok());
  EXPECT_EQ(handed, flags);
  uint16_t v[3];
  for (int s = 0; s < 3; ++s) std::memcpy(&v[s], pool.data() + s * 1024, 2);
  EXPECT_EQ(v[0], 0x3f80);
  EXPECT_EQ(v[1], 0) << "the flagged group's row was written";
  EXPECT_EQ(v[2], 0x3f82);
  const std::vector<int32_t> short_groups = {0};
  p.groups = short_groups;
  EXPECT_EQ(backend_->WriteRows(p, *stream_).code(), absl::StatusCode::kInvalidArgument);
  p.groups = groups;
  p.group_flags = nullptr;
  EXPECT_EQ(backend_->WriteRows(p, *stream_).code(), absl::StatusCode::kInvalidArgument);
  p.groups = {};
  EXPECT_EQ(backend_->WriteRows(p, *stream_).code(), absl::StatusCode::kInvalidArgument)
      << "flags_out without group_flags";
}

}  // namespace
}  // namespace smla::kernels
