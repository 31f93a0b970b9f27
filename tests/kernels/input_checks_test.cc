// The checks of a step's inputs on the backend (input_checks.h, Backend::CheckInputs): chosen
// entries into slots, values checked, both in one call, and the new rows written with their
// checks (RowWrites): the semantics every backend shares, on the CPU backend. smla-gpu-test
// checks that the GPU backend flags and writes the same.
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

// The checks write their rows as WriteRows does, each checked and copied as read, whatever its
// group's flags: a refused row is written too, after its slot's old bytes were saved. A slot
// outside the pool is not written.
TEST_F(TranslateTest, RowsAreCheckedCopiedSavedAndWritten) {
  constexpr int kWidth = 512;  // rope_inside
  constexpr int64_t kPitch = 4 * (kDsv4DataBytes + kDsv4ScaleBytes);
  const MutableCacheView empty{nullptr, KvFormat::kFp8Dsv4, Geometry::kRopeInside, 2, 4, kPitch,
                               1.0f};
  std::vector<uint8_t> before(2 * kPitch);
  for (size_t i = 0; i < before.size(); ++i) before[i] = static_cast<uint8_t>(i % 251);
  std::vector<uint16_t> copies(4 * kWidth, 0);
  std::vector<uint16_t> elsewhere(kWidth);
  for (int i = 0; i < 3 * kWidth; ++i) copies[i] = static_cast<uint16_t>(0x3f80 + (i * 7) % 97);
  for (int i = 0; i < kWidth; ++i) elsewhere[i] = static_cast<uint16_t>(0xbf00 + i % 61);
  copies[kWidth + 9] = 0x7fc0;  // row 1: a NaN
  const std::vector<uint16_t> rows_in = copies;
  const RowWrite writes[] = {{copies.data(), 1, 0, 0},
                             {copies.data() + kWidth, 6, 1, 0},
                             {elsewhere.data(), 3, 0, 0},
                             {copies.data() + 3 * kWidth, 100, 2, 0}};  // outside the pool

  // What WriteRows writes for the same rows, on a copy of the pool.
  std::vector<uint8_t> expected = before;
  std::vector<uint16_t> plain(rows_in.begin(), rows_in.begin() + 2 * kWidth);
  plain.insert(plain.end(), elsewhere.begin(), elsewhere.end());
  const std::vector<int64_t> slots = {1, 6, 3};
  WriteRowsParams w;
  w.cache = empty;
  w.cache.base = expected.data();
  w.slots = slots;
  w.rows = plain.data();
  ASSERT_TRUE(backend_->WriteRows(w, *stream_).ok());

  std::vector<uint8_t> pool = before;
  std::vector<uint8_t> old(4 * RowBytes(KvFormat::kFp8Dsv4, Geometry::kRopeInside), 0xee);
  std::vector<uint32_t> flags(3, 0);
  CheckInputsParams p;
  p.rows.cache = empty;
  p.rows.cache.base = pool.data();
  p.rows.rows = writes;
  p.rows.num_rows = 4;
  p.rows.copies = copies.data();
  p.rows.old = old.data();
  p.flags = flags.data();
  ASSERT_TRUE(backend_->CheckInputs(p, *stream_).ok());
  EXPECT_EQ(flags, (std::vector<uint32_t>{0, kFlagInputValue, 0}));
  EXPECT_EQ(pool, expected) << "every row in the pool written, the refused one too";
  EXPECT_TRUE(std::equal(elsewhere.begin(), elsewhere.end(), copies.begin() + 2 * kWidth))
      << "a row read elsewhere is copied";
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    const int64_t slot = writes[i].slot;
    const uint8_t* saved = old.data() + i * (kDsv4DataBytes + kDsv4ScaleBytes);
    EXPECT_EQ(0,
              std::memcmp(saved, before.data() + (slot / 4) * kPitch + (slot % 4) * kDsv4DataBytes,
                          kDsv4DataBytes));
    EXPECT_EQ(0, std::memcmp(saved + kDsv4DataBytes,
                             before.data() + (slot / 4) * kPitch + 4 * kDsv4DataBytes +
                                 (slot % 4) * kDsv4ScaleBytes,
                             kDsv4ScaleBytes));
  }
  EXPECT_EQ(old[3 * (kDsv4DataBytes + kDsv4ScaleBytes)], 0xee) << "nothing saved for no slot";

  p.rows.copies = nullptr;
  EXPECT_EQ(backend_->CheckInputs(p, *stream_).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace smla::kernels
