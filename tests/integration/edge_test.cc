// Unit tests of the edge's pieces that need no server: the metrics registry and its text
// exposition, wire parsing of steps, the status mapping, id limits, region-name errors,
// HOST:PORT parsing.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <thread>

#include "edge/edge_metrics.h"
#include "edge/id_limits.h"
#include "edge/metrics.h"
#include "edge/shm_region.h"
#include "edge/status_map.h"
#include "edge/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "prometheus_text.h"
#include "smla/client/tensor.h"

namespace smla::server::edge {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, RendersParsableTextWithConsistentHistograms) {
  Registry r;
  r.GetCounter("x_total", "A counter.", {{"method", "Step"}, {"code", "OK"}}).Inc(3);
  r.GetCounter("x_total", "A counter.", {{"method", "Step"}, {"code", "NOT_FOUND"}}).Inc();
  r.GetGauge("y", "A gauge with \"quotes\" and \\ in help.", {{"model", "a\"b"}}).Set(-2.5);
  Histogram& h = r.GetHistogram("z_seconds", "A histogram.", {0.001, 0.01, 0.1});
  for (double v : {0.0005, 0.001, 0.005, 0.5, 2.0}) h.Observe(v);
  int collected = 0;
  r.AddCollector([&] { r.GetGauge("w", "Set at scrape time.").Set(++collected); });

  auto e = smla::testing::ParsePrometheusText(r.Render());
  ASSERT_TRUE(e.ok()) << e.status() << "\n" << r.Render();
  EXPECT_EQ(e->Sum("x_total", {{"code", "OK"}}), 3);
  EXPECT_EQ(e->Sum("x_total"), 4);
  EXPECT_EQ(e->Sum("y", {{"model", "a\"b"}}), -2.5);
  EXPECT_EQ(e->Sum("z_seconds_bucket", {{"le", "0.001"}}), 2);  // le is inclusive
  EXPECT_EQ(e->Sum("z_seconds_bucket", {{"le", "0.01"}}), 3);
  EXPECT_EQ(e->Sum("z_seconds_bucket", {{"le", "0.1"}}), 3);
  EXPECT_EQ(e->Sum("z_seconds_bucket", {{"le", "+Inf"}}), 5);
  EXPECT_EQ(e->Sum("z_seconds_count"), 5);
  EXPECT_DOUBLE_EQ(e->Sum("z_seconds_sum"), 0.0005 + 0.001 + 0.005 + 0.5 + 2.0);
  EXPECT_EQ(e->Sum("w"), 1);
  EXPECT_EQ(e->types.at("z_seconds"), "histogram");
  EXPECT_EQ(e->types.at("x_total"), "counter");
}

// Stop() right after Start() must return: the HTTP library's stop does nothing until its listen
// loop runs, and a loop started after that stop would serve forever (a SIGTERM just after start-up
// then hung the server). Each round stops before the listen thread has had much time to run.
TEST(MetricsHttpServerTest, StopRightAfterStartReturns) {
  static Registry registry;  // outlives a hung round's thread
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread([done] {
    for (int i = 0; i < 50; ++i) {
      auto s = MetricsHttpServer::Start("127.0.0.1:0", &registry);
      if (s.ok()) (*s)->Stop();
    }
    done->set_value();
  }).detach();
  ASSERT_EQ(finished.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "MetricsHttpServer::Stop() right after Start() did not return";
}

// A raw TCP connection: one that never sends a request, which an HTTP client cannot make.
int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether GET /metrics is answered 200, with `limit` for the connect and for each read.
bool AnsweredWithin(int port, std::chrono::milliseconds limit) {
  httplib::Client http("127.0.0.1", port);
  http.set_connection_timeout(limit);
  http.set_read_timeout(limit);
  const httplib::Result res = http.Get("/metrics");
  return res && res->status == 200;
}

// Connections that never send a request hold cpp-httplib workers (one per connection, for its
// keep-alive wait); more of them than the default pool has workers queued scrapes behind them
// for seconds each. Here a scrape behind 80 idle connections is answered within 3 s.
TEST(MetricsHttpServerTest, IdleConnectionsDoNotStarveScrapes) {
  Registry registry;
  registry.GetGauge("smla_test_gauge", "a gauge").Set(1);
  auto s = MetricsHttpServer::Start("127.0.0.1:0", &registry);
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<int> idle;
  for (int i = 0; i < 80; ++i) {
    const int fd = ConnectLoopback((*s)->port());
    ASSERT_GE(fd, 0) << "connection " << i;
    idle.push_back(fd);
  }
  const bool answered = AnsweredWithin((*s)->port(), std::chrono::seconds(3));
  for (int fd : idle) close(fd);
  EXPECT_TRUE(answered) << "a scrape behind idle connections was not answered within 3 s";
  (*s)->Stop();
}

TEST(StatusMapTest, KeepsCodeAndMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  const grpc::Status s = ToGrpcStatus(absl::ResourceExhaustedError("pool full"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "pool full");
  EXPECT_EQ(ToGrpcStatus(absl::FailedPreconditionError("x")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("draining")).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

// A message past kMaxStatusMessageBytes is cut (gRPC's trailer limit), saying how much was.
TEST(StatusMapTest, BoundsTheMessage) {
  const grpc::Status s = ToGrpcStatus(absl::NotFoundError(std::string(100 << 10, 'm')));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  const std::string& m = s.error_message();
  const std::string cut = "...(+101376 bytes)";
  EXPECT_EQ(m.find(cut), kMaxStatusMessageBytes);
  EXPECT_EQ(m.size(), kMaxStatusMessageBytes + cut.size());
}

TEST(IdLimitsTest, LongIdsAreRefusedNamingTheFieldAndLength) {
  EXPECT_TRUE(CheckIdLength("model", std::string(kMaxIdBytes, 'm')).ok());
  const absl::Status st = CheckIdLength("model", std::string(kMaxIdBytes + 1, 'm'));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "model: 257 bytes, at most 256");
  v1::StepRequest r;
  r.set_request_id(std::string(256, 'r'));
  r.set_model("m");
  r.add_spans()->set_sequence_id("a");
  r.add_spans()->set_sequence_id(std::string(10 << 20, 's'));
  auto check = [](const v1::StepRequest& request) {
    StepView view;
    ViewOf(request, &view);
    return CheckStepIds(view);
  };
  EXPECT_EQ(check(r).message(), "spans[1].sequence_id: 10485760 bytes, at most 256");
  r.mutable_spans(1)->set_sequence_id("b");
  EXPECT_TRUE(check(r).ok());
  r.set_request_id(std::string(300, 'r'));
  EXPECT_EQ(check(r).message(), "request_id: 300 bytes, at most 256");
}

// A region name that names no region is echoed escaped and bounded, on lookup and unregister.
TEST(RegionNameTest, ErrorsEscapeAndBoundTheName) {
  const std::string forged = "/smla-x\n2030-01-01 forged line" + std::string(100 << 10, 'n');
  RegionRegistry registry;
  const absl::Status missing = registry.Lookup("t", "q.region", forged).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  const absl::Status gone = registry.Unregister("t", forged);
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  for (const absl::Status& st : {missing, gone}) {
    const std::string m(st.message());
    EXPECT_THAT(m, HasSubstr("/smla-x\\n2030-01-01 forged line")) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_LT(m.size(), 1024u);
  }
}

TEST(SplitHostPortTest, AcceptsHostPortAndRejectsTheRest) {
  EXPECT_EQ(SplitHostPort("127.0.0.1:0")->second, 0);
  EXPECT_EQ(SplitHostPort("[::1]:8080")->first, "::1");
  EXPECT_FALSE(SplitHostPort("localhost").ok());
  EXPECT_FALSE(SplitHostPort("h:70000").ok());
  EXPECT_FALSE(SplitHostPort(":80").ok());
}

class WireTest : public ::testing::Test {
 protected:
  // One span of `rows` rows for a 2-head, 512-wide model, with a top-k of 3.
  v1::StepRequest Valid(int32_t rows) {
    v1::StepRequest r;
    r.set_request_id("r1");
    r.set_model("m");
    r.set_layer(3);
    v1::Span* s = r.add_spans();
    s->set_sequence_id("seq");
    s->set_first_position(10);
    s->set_num_rows(rows);
    std::vector<uint16_t> kv(rows * 512, 0x3f80), q(rows * 2 * 512, 0x3f80);
    *s->mutable_kv_rows() = client::PackBf16(kv, {rows, 512});
    *s->mutable_q() = client::PackBf16(q, {rows, 2, 512});
    std::vector<int32_t> ids(rows * 3, -1);
    *s->mutable_topk() = client::PackInt32(ids, {rows, 3});
    return r;
  }
  absl::Status Parse(const v1::StepRequest& r) {
    out_ = StepRequest();
    return ParseStepRequest(r, &model_, limits_, &out_, &storage_);
  }
  WireModel model_{2, 512};
  const Limits limits_ = [] {
    Limits l;
    l.max_rows_per_step = 100;
    l.max_spans_per_step = 4;
    return l;
  }();
  StepRequest out_;
  ParseStorage storage_;
};

TEST_F(WireTest, ValidRequestBecomesViewsIntoTheMessage) {
  const v1::StepRequest r = Valid(3);
  ASSERT_TRUE(Parse(r).ok());
  ASSERT_EQ(out_.spans.size(), 1u);
  const SpanInput& s = out_.spans[0];
  EXPECT_EQ(s.num_rows, 3);
  EXPECT_EQ(s.first_position, 10);
  EXPECT_EQ(s.kv_rows.size(), 3u * 512 * 2);
  EXPECT_EQ(static_cast<const void*>(s.kv_rows.data()),
            static_cast<const void*>(r.spans(0).kv_rows().inline_data().data()));
  EXPECT_EQ(s.topk_width, 3);
  EXPECT_EQ(s.topk.size(), 9u);
  EXPECT_EQ(out_.layer, 3);
}

TEST_F(WireTest, ErrorsNameTheFieldAndValue) {
  {
    v1::StepRequest r = Valid(2);
    r.mutable_spans(0)->mutable_q()->set_shape(1, 3);
    const absl::Status st = Parse(r);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(st.message()),
                HasSubstr("spans[0].q: shape [2, 3, 512] dimension 1 is 3, expected 2"));
  }
  {
    v1::StepRequest r = Valid(2);
    std::string d = r.spans(0).kv_rows().inline_data();
    d.pop_back();
    r.mutable_spans(0)->mutable_kv_rows()->set_inline_data(d);
    EXPECT_THAT(std::string(Parse(r).message()),
                HasSubstr("spans[0].kv_rows: shape [2, 512] needs 2048 bytes, got 2047"));
  }
  {
    v1::StepRequest r = Valid(2);
    r.mutable_spans(0)->mutable_topk()->set_dtype(v1::DTYPE_F32);
    EXPECT_THAT(std::string(Parse(r).message()),
                HasSubstr("spans[0].topk: dtype DTYPE_F32, expected DTYPE_INT32"));
  }
  {
    v1::StepRequest r = Valid(2);
    r.mutable_spans(0)->mutable_q()->mutable_region()->set_region("shm0");
    EXPECT_THAT(std::string(Parse(r).message()),
                HasSubstr("spans[0].q: shared-memory regions are not enabled"));
  }
  {
    v1::StepRequest r = Valid(2);
    r.mutable_spans(0)->set_first_position(-1);
    EXPECT_THAT(std::string(Parse(r).message()), HasSubstr("spans[0].first_position: -1"));
  }
  {
    v1::StepRequest r = Valid(2);
    r.mutable_spans(0)->add_roles(v1::ROW_ROLE_DRAFT);
    EXPECT_THAT(std::string(Parse(r).message()), HasSubstr("spans[0].roles: 1 roles for 2 rows"));
  }
  {
    v1::StepRequest r = Valid(60);
    *r.add_spans() = Valid(60).spans(0);
    EXPECT_THAT(std::string(Parse(r).message()),
                HasSubstr("spans[1].num_rows: 120 rows in the step, at most 100"));
  }
  {
    v1::StepRequest r = Valid(1);
    for (int i = 0; i < 4; ++i) *r.add_spans() = r.spans(0);
    EXPECT_THAT(std::string(Parse(r).message()), HasSubstr("spans: 5 spans, at most 4"));
  }
}

// Element counts are bounded before they are multiplied: [2^40, 2^40] would wrap to 0 elements,
// which an empty payload matches.
TEST_F(WireTest, ShapesWhoseCountWouldOverflowAreRefused) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_F32);
  t.add_shape(int64_t{1} << 40);
  t.add_shape(int64_t{1} << 40);
  const absl::Status st = ParseF32Tensor(t, "sinks", {-1, -1}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("sinks: shape [1099511627776, 1099511627776] is too large"));
  // A step's q for an unknown model (no extents to compare with).
  v1::StepRequest r = Valid(1);
  v1::Tensor* q = r.mutable_spans(0)->mutable_q();
  q->clear_shape();
  q->add_shape(1);
  q->add_shape(int64_t{1} << 40);
  q->add_shape(int64_t{1} << 40);
  q->clear_inline_data();
  out_ = StepRequest();
  EXPECT_THAT(std::string(ParseStepRequest(r, nullptr, limits_, &out_, &storage_).message()),
              HasSubstr("spans[0].q: shape [1, 1099511627776, 1099511627776] is too large"));
}

// The edge sizes tensors from first_position + num_rows, so it runs the core's extent rules
// (ValidateStepExtent) before any tensor: a sum that would wrap int64 is refused there.
TEST_F(WireTest, PositionsPastTheLongestContextAreRefused) {
  v1::StepRequest r = Valid(2);
  r.mutable_spans(0)->set_first_position(std::numeric_limits<int64_t>::max() - 1);
  const absl::Status st = Parse(r);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("spans[0]: 2 rows from position 9223372036854775806 exceed the longest "
                        "context"));
  r.mutable_spans(0)->set_first_position(limits_.max_context - 2);
  EXPECT_TRUE(Parse(r).ok());
}

// Enum values are the wire's to check: the core's enums cannot hold an unknown one.
TEST_F(WireTest, UnknownEnumValuesAreRefused) {
  v1::StepRequest r = Valid(2);
  r.set_output_format(static_cast<v1::OutputFormat>(7));
  EXPECT_THAT(std::string(Parse(r).message()), HasSubstr("output_format: unknown value 7"));
  r = Valid(2);
  r.mutable_spans(0)->add_roles(v1::ROW_ROLE_DRAFT);
  r.mutable_spans(0)->add_roles(static_cast<v1::RowRole>(9));
  EXPECT_THAT(std::string(Parse(r).message()), HasSubstr("spans[0].roles[1]: unknown role 9"));
}

TEST_F(WireTest, UnalignedInt32DataIsCopied) {
  v1::StepRequest r = Valid(1);
  // A 3-entry top-k fits in a short string; whatever its alignment, the parsed view must
  // hold the same values.
  const int32_t ids[3] = {5, -1, 7};
  r.mutable_spans(0)->mutable_topk()->set_inline_data(ids, sizeof ids);
  ASSERT_TRUE(Parse(r).ok());
  ASSERT_EQ(out_.spans[0].topk.size(), 3u);
  EXPECT_EQ(out_.spans[0].topk[0], 5);
  EXPECT_EQ(out_.spans[0].topk[2], 7);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(out_.spans[0].topk.data()) % alignof(int32_t), 0u);
}

TEST(WireResponseTest, FillsTensorsAndTimings) {
  StepResult res;
  res.num_rows = 2;
  res.num_heads = 1;
  res.output_format = kernels::OutputFormat::kMxfp8;
  res.out.assign(2 * 512, 0x38);
  res.mx_scales.assign(2 * 16, 127);
  res.lse = {1.5f, -2.0f};
  res.timings.queued = absl::Microseconds(12);
  res.timings.kernel = absl::Microseconds(345);
  res.timings.batch_requests = 3;
  res.timings.batch_rows = 18;
  res.timings.batch = absl::Microseconds(401);
  res.timings.prep = absl::Microseconds(23);
  res.timings.attend = absl::Microseconds(56);
  res.timings.copy_in = absl::Microseconds(71);
  res.timings.copy_out = absl::Microseconds(33);
  res.timings.phases = true;
  v1::StepResponse pb;
  FillStepResponse(res, &pb);
  EXPECT_EQ(pb.out().dtype(), v1::DTYPE_E4M3);
  EXPECT_THAT(pb.out().shape(), ::testing::ElementsAre(2, 512));
  EXPECT_THAT(pb.mx_scales().shape(), ::testing::ElementsAre(2, 16));
  EXPECT_EQ(pb.lse().inline_data().size(), 8u);
  EXPECT_EQ(pb.timings().queued_us(), 12);
  EXPECT_EQ(pb.timings().kernel_us(), 345);
  EXPECT_EQ(pb.timings().batch_requests(), 3);
  EXPECT_EQ(pb.timings().batch_rows(), 18);
  EXPECT_EQ(pb.timings().batch_us(), 401);
  EXPECT_EQ(pb.timings().prep_us(), 23);
  EXPECT_EQ(pb.timings().attend_us(), 56);
  EXPECT_EQ(pb.timings().copy_in_us(), 71);
  EXPECT_EQ(pb.timings().copy_out_us(), 33);
  EXPECT_TRUE(pb.timings().phases_measured());
  EXPECT_EQ(pb.code(), 0);
  // A batch whose phases were not sampled says so, and carries none of them.
  res.timings.phases = false;
  pb.Clear();
  FillStepResponse(res, &pb);
  EXPECT_FALSE(pb.timings().phases_measured());
  EXPECT_EQ(pb.timings().attend_us(), 0);
  EXPECT_EQ(pb.timings().copy_out_us(), 0);
  EXPECT_EQ(pb.timings().copy_in_us(), 71);
  EXPECT_EQ(pb.timings().kernel_us(), 345);
}

}  // namespace
}  // namespace smla::server::edge
