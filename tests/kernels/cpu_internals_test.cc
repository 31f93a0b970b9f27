// Internals of the CPU backend: the thread pool, the per-row split rule and the chunking of
// split rows (none of which may change a result).
#include <atomic>
#include <thread>
#include <vector>

#include "attend_case.h"
#include "cpu/attend.h"
#include "cpu/thread_pool.h"
#include "gtest/gtest.h"
#include "smla/kernels/cpu_backend.h"

namespace smla::testing {
namespace {

using kernels::cpu::RowSplits;
using kernels::cpu::RunAttend;
using kernels::cpu::ThreadPool;

TEST(ThreadPoolTest, RunsEveryIndexOnceWithDistinctWorkers) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      std::vector<std::atomic<int>> busy(threads);
      std::atomic<bool> overlap{false};
      pool.ParallelFor(n, [&](int64_t i, int worker) {
        ASSERT_GE(worker, 0);
        ASSERT_LT(worker, threads);
        if (busy[worker].fetch_add(1) != 0) overlap = true;
        hits[i].fetch_add(1);
        busy[worker].fetch_sub(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
      EXPECT_FALSE(overlap.load()) << "two threads shared a worker index";
    }
  }
}

TEST(ThreadPoolTest, ConcurrentCallersAreServed) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) {
        pool.ParallelFor(100, [&](int64_t, int) { total.fetch_add(1); });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 100);
}

TEST(RowSplitsTest, OnlyForcedAndNeverPastTheRowsTiles) {
  EXPECT_EQ(RowSplits(8, false, 4096, 4096), 1);
  EXPECT_EQ(RowSplits(8, true, 0, 0), 1);
  EXPECT_EQ(RowSplits(8, true, 64, 0), 1);
  EXPECT_EQ(RowSplits(8, true, 65, 0), 2);
  EXPECT_EQ(RowSplits(8, true, 128, 1), 3);
  EXPECT_EQ(RowSplits(8, true, 1024, 0), 8);
  EXPECT_EQ(RowSplits(1, true, 1024, 0), 1);
}

TEST(RunAttendTest, IdsPastThePoolAreNeverRead) {
  // Validation rejects such ids; the compute path still treats them as sentinels, so that no
  // bug can read outside a pool.
  auto backend = *kernels::CreateCpuBackend({.cpu_threads = 2, .device_ordinal = 0});
  CaseSpec s;
  s.num_rows = 3;
  s.num_heads = 16;
  s.seed = 78;
  s.main.format = KvFormat::kFp8Dsv4;
  s.main.rows_per_page = 64;
  s.main.num_pages = 4;
  s.main.lengths = {100, 64, 7};
  s.sink = true;
  AttendCase c(*backend, s);
  ASSERT_TRUE(c.status().ok());
  kernels::AttendParams p = c.Params({});
  std::vector<int32_t> far(p.main.indices.begin(), p.main.indices.end());
  std::vector<int32_t> sentinel = far;
  for (size_t i = 0; i < far.size(); i += 3) {
    far[i] = i % 2 ? 256 : 1 << 30;  // the pool has 256 slots
    sentinel[i] = -1;
  }
  ThreadPool pool(2);
  std::vector<uint16_t> a(3 * 16 * 512), b(3 * 16 * 512);
  p.main.indices = far;
  p.out.bf16 = a.data();
  p.out.lse = nullptr;
  RunAttend(p, pool);
  p.main.indices = sentinel;
  p.out.bf16 = b.data();
  RunAttend(p, pool);
  EXPECT_EQ(a, b);
}

TEST(SplitChunksTest, ChunkingDoesNotChangeTheResult) {
  auto backend = *kernels::CreateCpuBackend({.cpu_threads = 2, .device_ordinal = 0});
  CaseSpec s;
  s.geometry = Geometry::kRopeInside;
  s.num_rows = 7;
  s.num_heads = 32;
  s.seed = 77;
  s.main.format = KvFormat::kFp8Dsv4;
  s.main.rows_per_page = 64;
  s.main.num_pages = 8;
  s.main.lengths = {128, 0, 300, 64, 65, 500, 1};
  s.sink = true;
  AttendCase c(*backend, s);
  ASSERT_TRUE(c.status().ok());
  RunOptions o;
  o.force_splits = 5;
  o.positions = true;
  absl::StatusOr<RunResult> whole = c.Run(o);
  ASSERT_TRUE(whole.ok());
  ThreadPool pool(2);
  for (int64_t budget : {1, 32 * 5, 32 * 9}) {
    kernels::AttendParams p = c.Params(o);
    std::vector<uint16_t> out(7 * 32 * 512, 0xffff);
    std::vector<float> lse(7 * 32);
    p.out.bf16 = out.data();
    p.out.lse = lse.data();
    RunAttend(p, pool, budget);
    EXPECT_EQ(out, whole->bf16) << "budget " << budget;
    EXPECT_EQ(lse, whole->lse) << "budget " << budget;
  }
}

}  // namespace
}  // namespace smla::testing
