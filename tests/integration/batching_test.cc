// N concurrent streams stepping the same layer: the server batches them, and every result is
// identical to the same call made alone.
#include <barrier>
#include <thread>

#include "absl/strings/str_cat.h"
#include "harness.h"
#include "prometheus_text.h"

namespace smla::testing {
namespace {

TEST(BatchingTest, ConcurrentStreamsBatchAndMatchUnbatchedCalls) {
  constexpr int kStreams = 4;
  constexpr int kSteps = 5;
  constexpr int32_t kLayer = 2;  // SWA + top-512 of the 1/2 cache
  Harness h;
  // A 30 ms wait lets the four streams' calls, sent together, meet in one launch.
  ASSERT_NO_FATAL_FAILURE(h.Start({kDsv41, "--batch_wait_us=30000"}, "dsv4.1-flash"));
  ASSERT_NO_FATAL_FAILURE(h.UploadTables(1024));

  // Stream i steps sequence "a<i>"; "b<i>" receives the identical requests one at a time.
  std::vector<std::vector<v1::StepRequest>> requests(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    const std::string a = absl::StrCat("a", i), b = absl::StrCat("b", i);
    ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), a).ok());
    ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), b).ok());
    v1::StepRequest prefill = h.Make(kLayer, {{a, 0, 64, 0}});
    h.StepAndCheck(prefill);
    prefill.mutable_spans(0)->set_sequence_id(b);
    ASSERT_TRUE(h.client->Step(prefill).ok());
    for (int s = 0; s < kSteps; ++s) {
      client::StepOptions o;
      o.inverse_rope = true;
      o.want_lse = true;
      requests[i].push_back(h.Make(kLayer, {{a, 64 + 6 * s, 6, 5}}, o));
    }
  }

  std::vector<std::vector<v1::StepResponse>> batched(kStreams);
  std::barrier sync(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      auto stream = h.client->OpenStream();
      ASSERT_TRUE(stream.ok());
      for (const auto& req : requests[i]) {
        sync.arrive_and_wait();  // every stream sends its next step at the same moment
        ASSERT_TRUE((*stream)->Write(req));
        v1::StepResponse resp;
        ASSERT_TRUE((*stream)->Read(&resp));
        batched[i].push_back(resp);
      }
      (*stream)->WritesDone();
      EXPECT_TRUE((*stream)->Finish().ok());
    });
  }
  for (auto& t : threads) t.join();

  int32_t most_batched = 0;
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_EQ(batched[i].size(), static_cast<size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      const v1::StepResponse& got = batched[i][s];
      ASSERT_EQ(got.code(), 0) << got.message();
      h.Check(requests[i][s], got);
      most_batched = std::max(most_batched, got.timings().batch_requests());
      // The same call alone, on the twin sequence.
      v1::StepRequest alone = requests[i][s];
      alone.mutable_spans(0)->set_sequence_id(absl::StrCat("b", i));
      auto single = h.client->Step(alone);
      ASSERT_TRUE(single.ok()) << single.status();
      EXPECT_EQ(single->timings().batch_requests(), 1);
      EXPECT_TRUE(single->out().inline_data() == got.out().inline_data())
          << "stream " << i << " step " << s << ": batched output differs from the call alone";
      EXPECT_TRUE(single->lse().inline_data() == got.lse().inline_data());
    }
  }
  EXPECT_GT(most_batched, 1);

  auto text = h.server->ScrapeMetrics();
  ASSERT_TRUE(text.ok()) << text.status();
  auto m = ParsePrometheusText(*text);
  ASSERT_TRUE(m.ok()) << m.status();
  const double steps = m->Sum("smla_step_batch_requests_count");
  const double alone = m->Sum("smla_step_batch_requests_bucket", {{"le", "1"}});
  EXPECT_GT(steps, alone) << "no step was carried by a batch of more than one request";
  EXPECT_GT(m->Sum("smla_batched_requests_total"), m->Sum("smla_batches_total"));
  EXPECT_EQ(m->Sum("smla_requests_total", {{"method", "StepStream"}, {"code", "OK"}}),
            kStreams * kSteps);
}

}  // namespace
}  // namespace smla::testing
