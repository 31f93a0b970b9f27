// Cancel and deadline while queued, SIGTERM with work in flight, health, reflection and the
// metrics endpoint, against the real server.
#include <signal.h>

#include <chrono>
#include <future>
#include <thread>

#include "google/protobuf/descriptor.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "harness.h"
#include "heavy_step.h"
#include "prometheus_text.h"

namespace smla::testing {
namespace {

using std::chrono::milliseconds;

absl::StatusOr<Exposition> Scrape(const ServerProcess& s) {
  auto text = s.ScrapeMetrics();
  if (!text.ok()) return text.status();
  return ParsePrometheusText(*text);
}

TEST(LifecycleTest, CancelAndDeadlineWhileQueued) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kGlm53, kHoldBackend}, "glm-5.3-flash"));
  const v1::StepRequest heavy = PrepareHeavy(h);
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "q").ok());
  h.StepAndCheck(h.Make(0, {{"q", 0, 8, 0}}));
  auto running = LaunchHeavy(h, heavy);

  // All three calls below are sent while the heavy step runs, and none waits for the end of it.
  // A server-side deadline (timeout_us) that expires while the request is queued.
  auto timed = h.client->OpenStream();
  ASSERT_TRUE(timed.ok());
  v1::StepRequest r = h.Make(0, {{"q", 8, 6, 5}});
  r.set_timeout_us(150000);
  ASSERT_TRUE((*timed)->Write(r));
  // The client's own deadline.
  auto late = h.client->Step(h.Make(0, {{"q", 8, 6, 5}}), absl::Milliseconds(150));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  // A stream cancelled by its client while its request waits.
  {
    auto stream = h.client->OpenStream();
    ASSERT_TRUE(stream.ok());
    ASSERT_TRUE((*stream)->Write(h.Make(0, {{"q", 8, 6, 5}})));
    std::this_thread::sleep_for(milliseconds(150));
    (*stream)->Cancel();
    EXPECT_EQ((*stream)->Finish().code(), absl::StatusCode::kCancelled);
  }
  EXPECT_EQ(h.Length("heavy", 0), kHeavyBase) << "the heavy step ended before the calls queued";
  {
    v1::StepResponse resp;
    ASSERT_TRUE((*timed)->Read(&resp));
    EXPECT_EQ(resp.code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded)) << resp.message();
    (*timed)->WritesDone();
    EXPECT_TRUE((*timed)->Finish().ok());
  }
  auto heavy_result = running.get();
  ASSERT_TRUE(heavy_result.ok()) << heavy_result.status();
  std::printf("heavy step: %lld us kernel\n",
              static_cast<long long>(heavy_result->timings().kernel_us()));
  h.Check(heavy, *heavy_result);

  // The server dropped all three from its queue, each with its own code.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  double step_dropped = 0, stream_expired = 0, stream_cancelled = 0;
  while (std::chrono::steady_clock::now() < until) {
    auto m = Scrape(*h.server);
    ASSERT_TRUE(m.ok()) << m.status();
    step_dropped =
        m->Sum("smla_requests_total", {{"method", "Step"}, {"code", "DEADLINE_EXCEEDED"}});
    stream_expired =
        m->Sum("smla_requests_total", {{"method", "StepStream"}, {"code", "DEADLINE_EXCEEDED"}});
    stream_cancelled =
        m->Sum("smla_requests_total", {{"method", "StepStream"}, {"code", "CANCELLED"}});
    if (step_dropped >= 1 && stream_expired >= 1 && stream_cancelled >= 1) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(step_dropped, 1);
  EXPECT_EQ(stream_expired, 1);
  EXPECT_EQ(stream_cancelled, 1);
  // Nothing of theirs was written.
  EXPECT_EQ(h.Length("q", 0), 8);
  h.StepAndCheck(h.Make(0, {{"q", 8, 6, 5}}));
}

TEST(LifecycleTest, SigtermFinishesWorkInFlightThenExitsZero) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kGlm53, kHoldBackend}, "glm-5.3-flash"));
  const v1::StepRequest heavy = PrepareHeavy(h);
  auto running = LaunchHeavy(h, heavy);
  const auto signalled = std::chrono::steady_clock::now();
  h.server->Signal(SIGTERM);
  // Draining: readiness turns NOT_SERVING while the heavy step still runs.
  bool saw_not_serving = false;
  for (int i = 0; i < 200 && !saw_not_serving; ++i) {
    auto serving = h.client->Health();
    if (serving.ok() && !*serving) saw_not_serving = true;
    if (!serving.ok()) break;
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_TRUE(saw_not_serving);
  auto result = running.get();
  ASSERT_TRUE(result.ok()) << result.status();
  const auto answered = std::chrono::steady_clock::now();
  EXPECT_EQ(h.server->WaitExit(30), 0);
  const auto exited = std::chrono::steady_clock::now();
  std::printf("after SIGTERM: answered in %lld ms, exited in %lld ms\n",
              static_cast<long long>((answered - signalled) / milliseconds(1)),
              static_cast<long long>((exited - signalled) / milliseconds(1)));
  h.Check(heavy, *result);
}

TEST(LifecycleTest, HealthReflectionAndMetrics) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kGlm53}, "glm-5.3-flash"));
  auto serving = h.client->Health();
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
  serving = h.client->Health("smla.v1.Smla");
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
  EXPECT_EQ(h.client->Health("no.such.Service").status().code(), absl::StatusCode::kNotFound);

  // Reflection lists the service and serves the descriptor of its messages.
  {
    auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(h.client->channel());
    grpc::ClientContext ctx;
    auto rpc = stub->ServerReflectionInfo(&ctx);
    grpc::reflection::v1alpha::ServerReflectionRequest req;
    req.set_list_services("");
    ASSERT_TRUE(rpc->Write(req));
    grpc::reflection::v1alpha::ServerReflectionResponse resp;
    ASSERT_TRUE(rpc->Read(&resp));
    std::vector<std::string> services;
    for (const auto& s : resp.list_services_response().service()) services.push_back(s.name());
    EXPECT_THAT(services, ::testing::Contains("smla.v1.Smla"));
    req.set_file_containing_symbol("smla.v1.StepRequest");
    ASSERT_TRUE(rpc->Write(req));
    ASSERT_TRUE(rpc->Read(&resp));
    ASSERT_GT(resp.file_descriptor_response().file_descriptor_proto_size(), 0);
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(resp.file_descriptor_response().file_descriptor_proto(0)));
    EXPECT_EQ(file.name(), "smla/v1/step.proto");
    rpc->WritesDone();
    EXPECT_TRUE(rpc->Finish().ok());
  }

  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "m").ok());
  h.StepAndCheck(h.Make(0, {{"m", 0, 20, 0}}));
  auto stream = h.client->OpenStream();
  ASSERT_TRUE(stream.ok());
  // The stream's opening reaches the server's handler in its own time: scrape until it counts.
  absl::StatusOr<Exposition> m;
  for (int i = 0; i < 200; ++i) {
    m = Scrape(*h.server);
    ASSERT_TRUE(m.ok()) << m.status();
    if (m->Sum("smla_open_streams") == 1) break;
    std::this_thread::sleep_for(milliseconds(25));
  }
  EXPECT_EQ(m->types.at("smla_requests_total"), "counter");
  EXPECT_EQ(m->types.at("smla_step_queue_seconds"), "histogram");
  EXPECT_EQ(m->types.at("smla_step_kernel_seconds"), "histogram");
  EXPECT_EQ(m->types.at("smla_step_prep_seconds"), "histogram");
  EXPECT_EQ(m->types.at("smla_step_batch_requests"), "histogram");
  EXPECT_EQ(m->types.at("smla_pool_pages_used"), "gauge");
  EXPECT_EQ(m->Sum("smla_requests_total", {{"method", "Step"}, {"code", "OK"}}), 1);
  EXPECT_EQ(m->Sum("smla_step_rows_total"), 20);
  EXPECT_EQ(m->Sum("smla_step_kernel_seconds_count"), 1);
  EXPECT_EQ(m->Sum("smla_step_prep_seconds_count"), 1);
  EXPECT_EQ(m->Sum("smla_pool_pages_used", {{"model", "glm-5.3-flash"}}), 2);  // 20 rows / 16
  EXPECT_EQ(m->Sum("smla_pool_pages_total", {{"model", "glm-5.3-flash"}}),
            h.model_.pool().pages_total());
  EXPECT_EQ(m->Sum("smla_sequences"), 1);
  EXPECT_EQ(m->Sum("smla_open_streams"), 1);
  (*stream)->WritesDone();
  EXPECT_TRUE((*stream)->Finish().ok());

  // The parser is strict: a malformed exposition is refused.
  EXPECT_FALSE(ParsePrometheusText("smla_x 1\n").ok());  // no # TYPE
  EXPECT_FALSE(ParsePrometheusText("# TYPE a counter\na{b=\"c} 1\n").ok());
}

}  // namespace
}  // namespace smla::testing
