#include "smla/server/scheduler.h"

#include <future>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace smla::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Records the batches it runs; while the gate is closed, a batch waits in RunBatch (the
// "backend" is busy), so that work queues behind it.
class FakeRunner : public BatchRunner {
 public:
  std::vector<absl::StatusOr<StepResult>> RunBatch(
      std::span<const StepRequest* const> steps) override {
    std::vector<std::string> ids;
    for (const StepRequest* s : steps) ids.push_back(s->request_id);
    {
      absl::MutexLock lock(&mu_);
      batches_.push_back(ids);
      ++entered_;
      mu_.Await(absl::Condition(&open_));
    }
    std::vector<absl::StatusOr<StepResult>> out;
    for (const StepRequest* s : steps) {
      StepResult r;
      r.num_rows = s->spans[0].num_rows;
      r.timings.kernel = absl::Milliseconds(1);
      out.push_back(r);
    }
    return out;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void WaitEntered(int n) {
    absl::MutexLock lock(&mu_);
    auto cond = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return entered_ >= n; };
    mu_.Await(absl::Condition(&cond));
  }
  std::vector<std::vector<std::string>> batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::vector<std::string>> batches_ ABSL_GUARDED_BY(mu_);
};

StepRequest Req(const std::string& id, const std::string& seq, int32_t rows = 1,
                int32_t layer = 0) {
  StepRequest r;
  r.request_id = id;
  r.tenant = "t";
  r.model = "m";
  r.layer = layer;
  SpanInput s;
  s.sequence_id = seq;
  s.num_rows = rows;
  r.spans.push_back(s);
  return r;
}

struct Outcome {
  std::promise<absl::StatusOr<StepResult>> promise;
  std::future<absl::StatusOr<StepResult>> future = promise.get_future();
  StepCallback Callback() {
    return [this](absl::StatusOr<StepResult> r) { promise.set_value(std::move(r)); };
  }
};

absl::Status Submit(Scheduler& s, StepRequest r, Outcome& o, int64_t bytes = 100) {
  const int64_t rows = r.spans[0].num_rows;
  return s.Submit(std::move(r), o.Callback(), rows, bytes);
}

TEST(SchedulerTest, WorkQueuedWhileBusyRunsAsOneBatch) {
  FakeRunner runner;
  Scheduler s(Limits{}, runner);
  Outcome a, b, c, d;
  ASSERT_TRUE(Submit(s, Req("a", "s1", 6), a).ok());
  runner.WaitEntered(1);
  ASSERT_TRUE(Submit(s, Req("b", "s2", 6), b).ok());
  ASSERT_TRUE(Submit(s, Req("c", "s3", 6), c).ok());
  ASSERT_TRUE(Submit(s, Req("d", "s4", 6), d).ok());
  EXPECT_EQ(s.Stats().queue_depth, 3);
  runner.Open();
  for (Outcome* o : {&a, &b, &c, &d}) ASSERT_TRUE(o->future.get().ok());
  EXPECT_THAT(runner.batches(), ElementsAre(ElementsAre("a"), ElementsAre("b", "c", "d")));
  const CoreStats stats = s.Stats();
  EXPECT_EQ(stats.batches, 2);
  EXPECT_EQ(stats.batched_requests, 4);
  EXPECT_EQ(stats.rows, 24);
  EXPECT_EQ(stats.queue_depth, 0);
}

TEST(SchedulerTest, TimingsDescribeTheBatch) {
  FakeRunner runner;
  Scheduler s(Limits{}, runner);
  Outcome a, b, c;
  ASSERT_TRUE(Submit(s, Req("a", "s1", 2), a).ok());
  runner.WaitEntered(1);
  ASSERT_TRUE(Submit(s, Req("b", "s2", 3), b).ok());
  ASSERT_TRUE(Submit(s, Req("c", "s3", 4), c).ok());
  absl::SleepFor(absl::Milliseconds(20));
  runner.Open();
  absl::StatusOr<StepResult> rb = b.future.get();
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(rb->timings.batch_requests, 2);
  EXPECT_EQ(rb->timings.batch_rows, 7);
  EXPECT_GE(rb->timings.queued, absl::Milliseconds(20));
  EXPECT_EQ(rb->timings.kernel, absl::Milliseconds(1));
  EXPECT_EQ(a.future.get()->timings.batch_requests, 1);
  EXPECT_TRUE(c.future.get().ok());
}

TEST(SchedulerTest, OneStepPerSequenceAndLayerPerBatchInQueueOrder) {
  FakeRunner runner;
  Scheduler s(Limits{}, runner);
  Outcome a, b, c, d, e;
  ASSERT_TRUE(Submit(s, Req("a", "x"), a).ok());
  runner.WaitEntered(1);
  ASSERT_TRUE(Submit(s, Req("b", "x"), b).ok());
  ASSERT_TRUE(Submit(s, Req("c", "y"), c).ok());
  ASSERT_TRUE(Submit(s, Req("d", "y"), d).ok());  // repeats c's sequence: next batch
  ASSERT_TRUE(Submit(s, Req("e", "z"), e).ok());
  runner.Open();
  for (Outcome* o : {&a, &b, &c, &d, &e}) ASSERT_TRUE(o->future.get().ok());
  EXPECT_THAT(runner.batches(),
              ElementsAre(ElementsAre("a"), ElementsAre("b", "c"), ElementsAre("d", "e")));
}

TEST(SchedulerTest, BatchLimitsAndFormatsSplitBatches) {
  FakeRunner runner;
  Limits limits;
  limits.max_batch_rows = 10;
  limits.max_batch_bytes = 1000;
  Scheduler s(limits, runner);
  Outcome a, b, c, d, e, f, g;
  ASSERT_TRUE(Submit(s, Req("a", "s0", 1), a).ok());
  runner.WaitEntered(1);
  ASSERT_TRUE(Submit(s, Req("b", "s1", 6), b).ok());
  ASSERT_TRUE(Submit(s, Req("c", "s2", 6), c).ok());       // 12 rows > 10: next batch
  ASSERT_TRUE(Submit(s, Req("d", "s3", 4), d, 950).ok());  // 10 rows, 1050 bytes: next batch
  StepRequest mx = Req("e", "s4", 1);
  mx.output_format = kernels::OutputFormat::kMxfp8;  // another output format: next batch
  ASSERT_TRUE(Submit(s, std::move(mx), e).ok());
  ASSERT_TRUE(Submit(s, Req("f", "s5", 20), f).ok());  // larger than a batch: runs alone
  ASSERT_TRUE(Submit(s, Req("g", "s6", 1), g).ok());
  runner.Open();
  for (Outcome* o : {&a, &b, &c, &d, &e, &f, &g}) ASSERT_TRUE(o->future.get().ok());
  EXPECT_THAT(runner.batches(),
              ElementsAre(ElementsAre("a"), ElementsAre("b"), ElementsAre("c"), ElementsAre("d"),
                          ElementsAre("e"), ElementsAre("f"), ElementsAre("g")));
}

// The executor stages one query format per launch (MXFP8 codes and scales, or bf16): steps of
// the other format wait for the next batch.
TEST(SchedulerTest, QueryFormatsSplitBatches) {
  FakeRunner runner;
  Scheduler s(Limits{}, runner);
  Outcome a, b, c, d, e;
  ASSERT_TRUE(Submit(s, Req("a", "s0"), a).ok());
  runner.WaitEntered(1);
  ASSERT_TRUE(Submit(s, Req("b", "s1"), b).ok());
  StepRequest mx = Req("c", "s2");
  mx.q_format = QFormat::kMxfp8;
  ASSERT_TRUE(Submit(s, std::move(mx), c).ok());
  mx = Req("d", "s3");
  mx.q_format = QFormat::kMxfp8;
  ASSERT_TRUE(Submit(s, std::move(mx), d).ok());
  ASSERT_TRUE(Submit(s, Req("e", "s4"), e).ok());
  runner.Open();
  for (Outcome* o : {&a, &b, &c, &d, &e}) ASSERT_TRUE(o->future.get().ok());
  EXPECT_THAT(runner.batches(), ElementsAre(ElementsAre("a"), ElementsAre("b"),
                                            ElementsAre("c", "d"), ElementsAre("e")));
}

TEST(SchedulerTest, LayersHaveTheirOwnQueues) {
  FakeRunner runner;
  Scheduler s(Limits{}, runner);
  Outcome a, b, c, d;
  ASSERT_TRUE(Submit(s, Req("a", "s0", 1, 0), a).ok());
  runner.WaitEntered(1);
  ASSERT_TRUE(Submit(s, Req("b", "s1", 1, 1), b).ok());
  ASSERT_TRUE(Submit(s, Req("c", "s2", 1, 2), c).ok());
  ASSERT_TRUE(Submit(s, Req("d", "s3", 1, 1), d).ok());
  runner.Open();
  for (Outcome* o : {&a, &b, &c, &d}) ASSERT_TRUE(o->future.get().ok());
  // Oldest waiting queue first: layer 1 (b, d), then layer 2.
  EXPECT_THAT(runner.batches(),
              ElementsAre(ElementsAre("a"), ElementsAre("b", "d"), ElementsAre("c")));
}

TEST(SchedulerTest, QueueFullAtTheExactBoundary) {
  FakeRunner runner;
  Limits limits;
  limits.max_queued_requests = 3;
  limits.max_queued_rows = 10;
  Scheduler s(limits, runner);
  Outcome running, q1, q2, q3, extra, rows_extra, other_layer;
  ASSERT_TRUE(Submit(s, Req("run", "s0"), running).ok());
  runner.WaitEntered(1);  // taken off the queue: the queue is empty again
  ASSERT_TRUE(Submit(s, Req("q1", "s1", 6), q1).ok());
  ASSERT_TRUE(Submit(s, Req("q2", "s2", 4), q2).ok());  // exactly 10 rows
  absl::Status rows_full = Submit(s, Req("r", "s3", 1), rows_extra);
  EXPECT_EQ(rows_full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(rows_full.message()), HasSubstr("10 rows queued"));
  ASSERT_TRUE(Submit(s, Req("o", "s4", 1, 5), other_layer).ok());  // another queue
  runner.Open();
  for (Outcome* o : {&running, &q1, &q2, &other_layer}) ASSERT_TRUE(o->future.get().ok());

  // Request count: 3 fit, the 4th does not.
  FakeRunner runner2;
  Scheduler s2(limits, runner2);
  Outcome r0, r1, r2, r3, r4;
  ASSERT_TRUE(Submit(s2, Req("r0", "s0"), r0).ok());
  runner2.WaitEntered(1);
  ASSERT_TRUE(Submit(s2, Req("r1", "s1"), r1).ok());
  ASSERT_TRUE(Submit(s2, Req("r2", "s2"), r2).ok());
  ASSERT_TRUE(Submit(s2, Req("r3", "s3"), r3).ok());
  absl::Status full = Submit(s2, Req("r4", "s4"), r4);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()), HasSubstr("3 steps queued"));
  runner2.Open();
  for (Outcome* o : {&r0, &r1, &r2, &r3}) ASSERT_TRUE(o->future.get().ok());
  EXPECT_EQ(s2.Stats().batched_requests, 4);
}

TEST(SchedulerTest, CancelledAndExpiredStepsAreDroppedWhileQueued) {
  FakeRunner runner;
  Scheduler s(Limits{}, runner);
  Outcome a, cancelled, expired, kept;
  ASSERT_TRUE(Submit(s, Req("a", "s0"), a).ok());
  runner.WaitEntered(1);
  StepRequest c = Req("c", "s1");
  c.cancelled = std::make_shared<std::atomic<bool>>(false);
  CancelFlag flag = c.cancelled;
  ASSERT_TRUE(Submit(s, std::move(c), cancelled).ok());
  StepRequest e = Req("e", "s2");
  e.deadline = absl::Now() + absl::Milliseconds(30);
  ASSERT_TRUE(Submit(s, std::move(e), expired).ok());
  ASSERT_TRUE(Submit(s, Req("k", "s3"), kept).ok());
  flag->store(true);
  absl::SleepFor(absl::Milliseconds(60));
  runner.Open();
  EXPECT_EQ(cancelled.future.get().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(expired.future.get().status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(kept.future.get().ok());
  ASSERT_TRUE(a.future.get().ok());
  EXPECT_THAT(runner.batches(), ElementsAre(ElementsAre("a"), ElementsAre("k")));
  // Already cancelled or expired at admission: refused at once.
  StepRequest late = Req("l", "s4");
  late.deadline = absl::Now() - absl::Seconds(1);
  Outcome unused;
  EXPECT_EQ(Submit(s, std::move(late), unused).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(SchedulerTest, DrainFinishesQueuedWorkThenRefuses) {
  FakeRunner runner;
  Scheduler s(Limits{}, runner);
  Outcome a, b, c;
  ASSERT_TRUE(Submit(s, Req("a", "s0"), a).ok());
  runner.WaitEntered(1);
  ASSERT_TRUE(Submit(s, Req("b", "s1"), b).ok());
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    s.Drain();
    drained = true;
  });
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_FALSE(drained.load());  // work is still queued
  EXPECT_TRUE(s.draining());
  EXPECT_EQ(Submit(s, Req("c", "s2"), c).code(), absl::StatusCode::kUnavailable);
  runner.Open();
  drainer.join();
  EXPECT_TRUE(drained.load());
  // Drain returned only after both callbacks ran.
  EXPECT_EQ(a.future.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(b.future.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_TRUE(b.future.get().ok());
}

TEST(SchedulerTest, BatchWaitGathersStepsArrivingSoonAfter) {
  FakeRunner runner;
  runner.Open();
  Limits limits;
  limits.batch_wait = absl::Milliseconds(200);
  Scheduler s(limits, runner);
  Outcome a, b;
  ASSERT_TRUE(Submit(s, Req("a", "s0"), a).ok());
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(Submit(s, Req("b", "s1"), b).ok());
  ASSERT_TRUE(a.future.get().ok());
  ASSERT_TRUE(b.future.get().ok());
  EXPECT_THAT(runner.batches(), ElementsAre(ElementsAre("a", "b")));
}

// The executor spins for Limits::scheduler_spin after each batch before parking: with no spin,
// the default, and one far longer than the test (the executor is always spinning when a step
// arrives, and Drain and destruction must end the spin), steps batch, complete and drain alike.
class SchedulerSpinTest : public ::testing::TestWithParam<absl::Duration> {};

TEST_P(SchedulerSpinTest, StepsBatchCompleteAndDrain) {
  FakeRunner runner;
  Limits limits;
  limits.scheduler_spin = GetParam();
  Scheduler s(limits, runner);
  Outcome a, b, c;
  ASSERT_TRUE(Submit(s, Req("a", "s1", 2), a).ok());
  runner.WaitEntered(1);
  ASSERT_TRUE(Submit(s, Req("b", "s2", 3), b).ok());
  ASSERT_TRUE(Submit(s, Req("c", "s3", 4), c).ok());
  runner.Open();
  for (Outcome* o : {&a, &b, &c}) ASSERT_TRUE(o->future.get().ok());
  EXPECT_THAT(runner.batches(), ElementsAre(ElementsAre("a"), ElementsAre("b", "c")));
  // A closed loop: each step submitted right after the previous one's answer.
  constexpr int kLoop = 50;
  for (int i = 0; i < kLoop; ++i) {
    Outcome o;
    ASSERT_TRUE(Submit(s, Req(absl::StrCat("l", i), "s1"), o).ok());
    ASSERT_TRUE(o.future.get().ok());
  }
  // Steps queued together while the executor spins still batch.
  Outcome d, e;
  {
    std::vector<std::thread> submitters;
    submitters.emplace_back([&] { ASSERT_TRUE(Submit(s, Req("d", "s4"), d).ok()); });
    submitters.emplace_back([&] { ASSERT_TRUE(Submit(s, Req("e", "s5"), e).ok()); });
    for (std::thread& t : submitters) t.join();
  }
  ASSERT_TRUE(d.future.get().ok());
  ASSERT_TRUE(e.future.get().ok());
  EXPECT_EQ(s.Stats().batched_requests, 3 + kLoop + 2);
  EXPECT_EQ(s.Stats().queue_depth, 0);
  // Drain right after work (the executor spinning) returns and refuses new steps; destruction
  // follows while it may still spin.
  s.Drain();
  Outcome late;
  EXPECT_EQ(Submit(s, Req("z", "s6"), late).code(), absl::StatusCode::kUnavailable);
}

TEST_P(SchedulerSpinTest, DrainWaitsForWorkQueuedWhileSpinning) {
  FakeRunner runner;
  Limits limits;
  limits.scheduler_spin = GetParam();
  auto s = std::make_unique<Scheduler>(limits, runner);
  runner.Open();
  Outcome a, b;
  ASSERT_TRUE(Submit(*s, Req("a", "s0"), a).ok());
  ASSERT_TRUE(a.future.get().ok());
  ASSERT_TRUE(Submit(*s, Req("b", "s1"), b).ok());
  s.reset();  // drains: b has completed by the time the destructor returns
  EXPECT_EQ(b.future.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_TRUE(b.future.get().ok());
}

INSTANTIATE_TEST_SUITE_P(Spin, SchedulerSpinTest,
                         ::testing::Values(absl::ZeroDuration(), Limits{}.scheduler_spin,
                                           absl::Hours(1)),
                         [](const ::testing::TestParamInfo<absl::Duration>& info) {
                           return info.index == 0   ? std::string("None")
                                  : info.index == 1 ? std::string("Default")
                                                    : std::string("OneHour");
                         });

// Once the spin after a batch has run out, the executor parks; a step arriving later wakes it.
TEST(SchedulerTest, StepAfterTheSpinRanOutWakesTheParkedExecutor) {
  FakeRunner runner;
  runner.Open();
  Limits limits;
  limits.scheduler_spin = absl::Microseconds(100);
  Scheduler s(limits, runner);
  for (int i = 0; i < 3; ++i) {
    Outcome o;
    ASSERT_TRUE(Submit(s, Req(absl::StrCat("p", i), "s0"), o).ok());
    ASSERT_TRUE(o.future.get().ok());
    absl::SleepFor(absl::Milliseconds(20));  // well past the spin: the executor has parked
  }
  EXPECT_EQ(s.Stats().batches, 3);
}

TEST(SchedulerTest, LimitsSpinByDefault) {
  EXPECT_EQ(Limits{}.scheduler_spin, absl::Microseconds(200));
}

}  // namespace
}  // namespace smla::server
