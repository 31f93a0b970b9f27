// The step ring (smla/v1/step_ring.h) on the real smla-server: ring steps equal the inline
// call bit for bit, read with or without protobuf; misuse (no --allow_shm, a foreign region, bad
// bounds or header, a second ring, garbage in a slot) is refused with a clear error, changes
// nothing and never takes the server down; the stream's end stops the ring; the metrics count ring
// steps exactly; resizing the region cannot fault the server, and a ring costs the server what it
// holds.
#include "smla/client/step_ring.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "harness.h"
#include "prometheus_text.h"
#include "smla/client/shm.h"
#include "smla/v1/step_ring.h"

namespace smla::testing {
namespace {

namespace ring = v1::ring;
using ::testing::HasSubstr;
using Layout = client::ShmRegion::Layout;

constexpr int32_t kLayer = 2;  // SWA + top-512 of the 1/2 cache
constexpr uint64_t kRegionBytes = 8 << 20;
constexpr uint64_t kRingOffset = 6 << 20;  // inputs and outputs live below
constexpr uint32_t kSlots = 4;
constexpr uint32_t kSlotBytes = 4096;

std::string Unique(const std::string& what) { return absl::StrCat(what, "-", getpid()); }

std::vector<client::SpanSpec> Spans(const std::vector<std::string>& ids, int64_t pos) {
  std::vector<client::SpanSpec> s;
  for (const std::string& id : ids) s.push_back({id, pos, 6, 5});
  return s;
}

// Sends a ring_attach on `stream` and returns its answer.
v1::StepResponse SendAttach(client::StepStream* stream, const v1::RingAttach& attach) {
  v1::StepRequest r;
  *r.mutable_ring_attach() = attach;
  v1::StepResponse resp;
  EXPECT_TRUE(stream->Write(r));
  EXPECT_TRUE(stream->Read(&resp));
  return resp;
}

v1::RingAttach AttachOf(const std::string& region, uint64_t offset, uint32_t slots,
                        uint32_t slot_bytes) {
  v1::RingAttach a;
  a.mutable_ring()->set_region(region);
  a.mutable_ring()->set_offset(offset);
  a.mutable_ring()->set_size(ring::RingBytes(slots, slot_bytes));
  a.set_slots(slots);
  a.set_slot_bytes(slot_bytes);
  return a;
}

void ExpectCode(const v1::StepResponse& resp, grpc::StatusCode code, const std::string& text) {
  EXPECT_EQ(resp.code(), static_cast<int>(code)) << resp.message();
  EXPECT_THAT(resp.message(), HasSubstr(text));
}

// Writes raw bytes into request `n`'s slot, as a client would, bypassing StepRing; the slot's
// request_seq becomes `seq_field` (n unless given).
void RawSubmit(uint8_t* r, uint64_t n, const std::string& bytes, uint32_t length_field,
               uint64_t seq_field = 0) {
  ring::SlotHeader* s = ring::SlotAt(r, kSlotBytes, static_cast<uint32_t>((n - 1) % kSlots));
  std::memcpy(ring::SlotData(s), bytes.data(), std::min<size_t>(bytes.size(), kSlotBytes));
  ring::Store(s->request_bytes, length_field);
  ring::Store(s->request_seq, static_cast<uint32_t>(seq_field != 0 ? seq_field : n));
  ring::Header* h = ring::HeaderAt(r);
  std::atomic_ref<uint32_t>(h->doorbell).fetch_add(1);
  ring::FutexWakeAll(&h->doorbell);
}

// Waits up to `timeout` for request `n`'s response; false when none came.
bool RawWait(uint8_t* r, uint64_t n, v1::StepResponse* resp,
             absl::Duration timeout = absl::Seconds(20)) {
  ring::SlotHeader* s = ring::SlotAt(r, kSlotBytes, static_cast<uint32_t>((n - 1) % kSlots));
  const absl::Time until = absl::Now() + timeout;
  while (ring::Load(s->response_seq) != static_cast<uint32_t>(n)) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Microseconds(200));
  }
  return resp->ParseFromArray(ring::SlotData(s), static_cast<int>(ring::Load(s->response_bytes)));
}

class StepRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(h_.Start({kDsv41, "--allow_shm"}, "dsv4.1-flash"));
    ASSERT_NO_FATAL_FAILURE(h_.UploadTables(1024));
    auto region = client::ShmRegion::Create(h_.client.get(), Unique("ring"), kRegionBytes);
    ASSERT_TRUE(region.ok()) << region.status();
    region_ = *std::move(region);
  }
  void Prefill(const std::vector<std::string>& ids) {
    for (const std::string& id : ids) {
      ASSERT_TRUE(h_.client->CreateSequence(h_.ModelName(), id).ok());
      h_.StepAndCheck(h_.Make(kLayer, {{id, 0, 64, 0}}));
    }
  }
  v1::StepRequest Packed(v1::StepRequest r, uint64_t offset = 0) {
    auto end = region_->Place(&r, offset, Layout::kPacked);
    EXPECT_TRUE(end.ok()) << end.status();
    return r;
  }
  std::unique_ptr<client::StepStream> Stream() {
    auto s = h_.client->OpenStream();
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }
  Harness h_;
  std::unique_ptr<client::ShmRegion> region_;
};

TEST_F(StepRingTest, OutputsEqualInlineBitForBit) {
  // Twin sequences: a* get every request inline, b* the same request through the ring.
  const std::vector<std::string> a = {"a0", "a1", "a2"}, b = {"b0", "b1", "b2"};
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(h_.client->CreateSequence(h_.ModelName(), a[i]).ok());
    ASSERT_TRUE(h_.client->CreateSequence(h_.ModelName(), b[i]).ok());
    v1::StepRequest p = h_.Make(kLayer, {{a[i], 0, 64, 0}});
    h_.StepAndCheck(p);
    p.mutable_spans(0)->set_sequence_id(b[i]);
    ASSERT_TRUE(h_.client->Step(p).ok());
  }
  auto stream = Stream();
  auto r = client::StepRing::Attach(stream.get(), region_.get(), kRingOffset, kSlots, kSlotBytes);
  ASSERT_TRUE(r.ok()) << r.status();
  client::StepRing& ring = **r;
  const client::StepOptions bf16_lse = Bf16WithLse();
  const client::StepOptions mx_rope = Mxfp8WithRope();
  const std::vector<client::StepOptions> variants = {bf16_lse, mx_rope, client::StepOptions{}};
  int64_t pos = 64;
  for (size_t v = 0; v < variants.size(); ++v, pos += 6) {
    const v1::StepRequest inline_req = h_.Make(kLayer, Spans(a, pos), variants[v]);
    const v1::StepResponse inline_resp = h_.StepAndCheck(inline_req);
    v1::StepRequest twin = inline_req;
    for (int i = 0; i < static_cast<int>(b.size()); ++i) {
      twin.mutable_spans(i)->set_sequence_id(b[i]);
    }
    // The server reads a packed request without protobuf, unless it holds what that reader
    // leaves to protobuf (packed_step_decoder.h), such as a non-ASCII request id; the second
    // call rewrites the same rows with the same bytes.
    for (const std::string id : {"ring-step", "ring-\xc3\xa9tape"}) {
      twin.set_request_id(id);
      v1::StepResponse resp;
      ASSERT_TRUE(ring.Call(Packed(twin), &resp).ok());
      ASSERT_EQ(resp.code(), 0) << resp.message();
      EXPECT_EQ(resp.request_id(), id);
      EXPECT_EQ(resp.out().data_case(), v1::Tensor::kRegion);
      EXPECT_GT(resp.timings().server_us(), 0);
      ASSERT_TRUE(region_->Inline(&resp).ok());
      ExpectSameOutputs(resp, inline_resp, absl::StrCat("variant ", v, " ", id));
    }
  }
  {  // Spans of 6, 1 and 3 rows (top-k widths padded), MXFP8 + LSE.
    const v1::StepRequest inline_req =
        h_.Make(kLayer, {{a[0], pos, 6, 5}, {a[1], pos, 1, 0}, {a[2], pos, 3, 2}}, mx_rope);
    const v1::StepResponse inline_resp = h_.StepAndCheck(inline_req);
    v1::StepRequest twin = inline_req;
    for (int i = 0; i < static_cast<int>(b.size()); ++i) {
      twin.mutable_spans(i)->set_sequence_id(b[i]);
    }
    v1::StepResponse resp;
    ASSERT_TRUE(ring.Call(Packed(twin), &resp).ok());
    ASSERT_EQ(resp.code(), 0) << resp.message();
    ASSERT_TRUE(region_->Inline(&resp).ok());
    ExpectSameOutputs(resp, inline_resp, "ragged spans");
  }
  {  // Several ring steps in flight at once (one sequence each, own output ranges), at the
     // ragged step's position again (replacing its rows), answer in their own slots.
    std::vector<v1::StepRequest> reqs;
    std::vector<v1::StepResponse> want;
    uint64_t at = 0;
    for (size_t i = 0; i < b.size(); ++i) {
      const v1::StepRequest inline_req = h_.Make(kLayer, Spans({a[i]}, pos), bf16_lse);
      want.push_back(h_.StepAndCheck(inline_req));
      v1::StepRequest twin = inline_req;
      twin.mutable_spans(0)->set_sequence_id(b[i]);
      auto end = region_->Place(&twin, at, Layout::kPacked);
      ASSERT_TRUE(end.ok()) << end.status();
      at = *end;
      reqs.push_back(twin);
    }
    std::vector<uint64_t> tickets;
    for (const auto& q : reqs) {
      auto t = ring.Submit(q);
      ASSERT_TRUE(t.ok()) << t.status();
      tickets.push_back(*t);
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      v1::StepResponse resp;
      ASSERT_TRUE(ring.Wait(tickets[i], &resp).ok());
      ASSERT_EQ(resp.code(), 0) << resp.message();
      ASSERT_TRUE(region_->Inline(&resp).ok());
      ExpectSameOutputs(resp, want[i], absl::StrCat("in flight ", i));
    }
  }
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(h_.Length(b[i], kLayer), h_.Length(a[i], kLayer));
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(StepRingTest, MisuseIsRefusedAndChangesNothing) {
  const std::vector<std::string> seqs = {"s0", "s1"};
  ASSERT_NO_FATAL_FAILURE(Prefill(seqs));
  auto stream = Stream();
  const std::string name = region_->name();
  uint8_t* base = region_->data() + kRingOffset;
  // Bad attaches, each answered on the stream, which goes on.
  ExpectCode(SendAttach(stream.get(), AttachOf("/smla-nobody", kRingOffset, kSlots, kSlotBytes)),
             grpc::StatusCode::NOT_FOUND, "'/smla-nobody' is not registered");
  ExpectCode(SendAttach(stream.get(), AttachOf(name, kRegionBytes - 4096, kSlots, kSlotBytes)),
             grpc::StatusCode::INVALID_ARGUMENT, "is outside region");
  ExpectCode(SendAttach(stream.get(), AttachOf(name, kRingOffset + 32, kSlots, kSlotBytes)),
             grpc::StatusCode::INVALID_ARGUMENT, "offset 6291488 is not a multiple of 64");
  ExpectCode(SendAttach(stream.get(), AttachOf(name, kRingOffset, 0, kSlotBytes)),
             grpc::StatusCode::INVALID_ARGUMENT, "ring_attach.slots: 0 is outside 1..256");
  ExpectCode(SendAttach(stream.get(), AttachOf(name, kRingOffset, 1000, kSlotBytes)),
             grpc::StatusCode::INVALID_ARGUMENT, "ring_attach.slots: 1000");
  ExpectCode(SendAttach(stream.get(), AttachOf(name, kRingOffset, kSlots, 1000)),
             grpc::StatusCode::INVALID_ARGUMENT, "ring_attach.slot_bytes: 1000");
  v1::RingAttach wrong_size = AttachOf(name, kRingOffset, kSlots, kSlotBytes);
  wrong_size.mutable_ring()->set_size(64);
  ExpectCode(SendAttach(stream.get(), wrong_size), grpc::StatusCode::INVALID_ARGUMENT,
             "ring_attach.ring: size 64, a ring of 4 slots of 4096 bytes takes");
  std::memset(base, 0, ring::RingBytes(kSlots, kSlotBytes));  // no header written
  ExpectCode(SendAttach(stream.get(), AttachOf(name, kRingOffset, kSlots, kSlotBytes)),
             grpc::StatusCode::INVALID_ARGUMENT, "the ring's header (magic 0x00000000");
  {
    v1::StepRequest both = h_.Make(kLayer, Spans(seqs, 64));
    *both.mutable_ring_attach() = AttachOf(name, kRingOffset, kSlots, kSlotBytes);
    v1::StepResponse resp;
    ASSERT_TRUE(stream->Write(both));
    ASSERT_TRUE(stream->Read(&resp));
    ExpectCode(resp, grpc::StatusCode::INVALID_ARGUMENT, "a ring_attach request carries no step");
  }
  // A good ring, then a second one on the same stream.
  auto r = client::StepRing::Attach(stream.get(), region_.get(), kRingOffset, kSlots, kSlotBytes);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectCode(SendAttach(stream.get(), AttachOf(name, kRingOffset, kSlots, kSlotBytes)),
             grpc::StatusCode::FAILED_PRECONDITION, "this stream already has a ring");

  // Garbage in the ring: each becomes an error response (raw writes, as a broken client).
  uint8_t* rb = (*r)->ring();
  uint64_t n = 1;
  v1::StepResponse resp;
  RawSubmit(rb, n, std::string(200, '\xff'), 200);
  ASSERT_TRUE(RawWait(rb, n++, &resp));
  ExpectCode(resp, grpc::StatusCode::INVALID_ARGUMENT, "is not a StepRequest");
  RawSubmit(rb, n, "", kSlotBytes + 1);
  ASSERT_TRUE(RawWait(rb, n++, &resp));
  ExpectCode(resp, grpc::StatusCode::INVALID_ARGUMENT, "request_bytes 4097 exceeds slot_bytes");
  RawSubmit(rb, n, h_.Make(kLayer, Spans({"s0"}, 64)).SerializeAsString(), 0);
  ASSERT_TRUE(RawWait(rb, n++, &resp));  // length 0: an empty request, no model
  EXPECT_NE(resp.code(), 0);
  {
    v1::StepRequest nested;
    *nested.mutable_ring_attach() = AttachOf(name, kRingOffset, kSlots, kSlotBytes);
    const std::string bytes = nested.SerializeAsString();
    RawSubmit(rb, n, bytes, static_cast<uint32_t>(bytes.size()));
    ASSERT_TRUE(RawWait(rb, n++, &resp));
    ExpectCode(resp, grpc::StatusCode::INVALID_ARGUMENT, "not allowed in a ring slot");
  }
  {  // Inline outputs would not fit a slot.
    v1::StepRequest r2 = Packed(h_.Make(kLayer, Spans(seqs, 64)));
    r2.clear_out_region();
    const std::string bytes = r2.SerializeAsString();
    RawSubmit(rb, n, bytes, static_cast<uint32_t>(bytes.size()));
    ASSERT_TRUE(RawWait(rb, n++, &resp));
    ExpectCode(resp, grpc::StatusCode::INVALID_ARGUMENT, "out_region: a ring request names");
  }
  // A wrong sequence number is not served; the right one then is.
  const v1::StepRequest good = Packed(h_.Make(kLayer, Spans(seqs, 64)));
  const std::string good_bytes = good.SerializeAsString();
  RawSubmit(rb, n, good_bytes, static_cast<uint32_t>(good_bytes.size()), n + 7);
  EXPECT_FALSE(RawWait(rb, n, &resp, absl::Milliseconds(300)));
  EXPECT_FALSE(RawWait(rb, n + 7, &resp, absl::Milliseconds(10)));
  for (const std::string& s : seqs) EXPECT_EQ(h_.Length(s, kLayer), 64);
  RawSubmit(rb, n, good_bytes, static_cast<uint32_t>(good_bytes.size()));
  ASSERT_TRUE(RawWait(rb, n++, &resp));
  EXPECT_EQ(resp.code(), 0) << resp.message();
  for (const std::string& s : seqs) EXPECT_EQ(h_.Length(s, kLayer), 70);
  // The stream still carries steps, and the server is healthy.
  v1::StepResponse sresp;
  ASSERT_TRUE(stream->Write(h_.Make(kLayer, Spans(seqs, 64))));
  ASSERT_TRUE(stream->Read(&sresp));
  EXPECT_EQ(sresp.code(), 0) << sresp.message();
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_TRUE(*h_.client->Health());
}

TEST_F(StepRingTest, ScribblingClientCannotHurtTheServer) {
  ASSERT_NO_FATAL_FAILURE(Prefill({"s"}));
  const std::string good = Packed(h_.Make(kLayer, Spans({"s"}, 64))).SerializeAsString();
  auto stream = Stream();
  auto r = client::StepRing::Attach(stream.get(), region_.get(), kRingOffset, kSlots, kSlotBytes);
  ASSERT_TRUE(r.ok()) << r.status();
  uint8_t* rb = (*r)->ring();
  // Requests in order, while a second thread rewrites random slots' bytes and lengths under
  // the server's reads (and, in a second phase, their sequence numbers too).
  std::atomic<bool> stop{false}, scribble_seqs{false};
  std::thread scribbler([&] {
    std::mt19937 rng(5);
    while (!stop.load()) {
      const uint32_t i = rng() % kSlots;
      ring::SlotHeader* s = ring::SlotAt(rb, kSlotBytes, i);
      uint8_t* d = ring::SlotData(s);
      for (int k = 0; k < 64; ++k) d[rng() % kSlotBytes] = static_cast<uint8_t>(rng());
      ring::Store(s->request_bytes, rng() % (kSlotBytes + 512));
      if (scribble_seqs.load() && rng() % 8 == 0) ring::Store(s->request_seq, rng() % 4096);
      absl::SleepFor(absl::Microseconds(20));
    }
  });
  uint64_t n = 1;
  auto submit_for = [&](absl::Duration d, absl::Duration patience) {
    for (const absl::Time until = absl::Now() + d; absl::Now() < until; ++n) {
      // The slot's previous request is answered first, unless that takes longer than
      // `patience`; the answers themselves are never read.
      const ring::SlotHeader* slot = ring::SlotAt(rb, kSlotBytes, (n - 1) % kSlots);
      const absl::Time give_up = absl::Now() + patience;
      while (n > kSlots && ring::Load(slot->response_seq) != n - kSlots && absl::Now() < give_up) {
        absl::SleepFor(absl::Microseconds(20));
      }
      RawSubmit(rb, n, n % 3 == 0 ? good : std::string(300, static_cast<char>(n)),
                n % 3 == 0 ? static_cast<uint32_t>(good.size()) : 300);
    }
  };
  submit_for(absl::Milliseconds(250), absl::Seconds(5));
  // Every request got an answer (an error, or OK where the bytes survived; the scribbler may
  // have garbled the answer's bytes since, so only its sequence number is checked).
  const ring::SlotHeader* last = ring::SlotAt(rb, kSlotBytes, (n - 2) % kSlots);
  for (const absl::Time until = absl::Now() + absl::Seconds(5);
       ring::Load(last->response_seq) != static_cast<uint32_t>(n - 1) && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(ring::Load(last->response_seq), static_cast<uint32_t>(n - 1));
  EXPECT_GT(n, 10u);
  // Then sequence numbers are garbled too (requests get lost; the ring may stall) and the
  // submitter laps the server.
  scribble_seqs = true;
  submit_for(absl::Milliseconds(150), absl::Milliseconds(2));
  stop = true;
  scribbler.join();
  stream->Cancel();
  stream->Finish().IgnoreError();
  const absl::Time closed_by = absl::Now() + absl::Seconds(5);
  while (ring::Load(ring::HeaderAt(rb)->closed) == 0 && absl::Now() < closed_by) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(ring::Load(ring::HeaderAt(rb)->closed), 1u);
  // The server is healthy and a fresh ring serves a good step.
  EXPECT_TRUE(*h_.client->Health());
  auto stream2 = Stream();
  auto r2 = client::StepRing::Attach(stream2.get(), region_.get(), kRingOffset, kSlots, kSlotBytes);
  ASSERT_TRUE(r2.ok()) << r2.status();
  v1::StepResponse resp;
  ASSERT_TRUE((*r2)->Call(Packed(h_.Make(kLayer, Spans({"s"}, 64))), &resp).ok());
  EXPECT_EQ(resp.code(), 0) << resp.message();
  stream2->WritesDone();
  EXPECT_TRUE(stream2->Finish().ok());
}

TEST_F(StepRingTest, StreamEndStopsTheRing) {
  ASSERT_NO_FATAL_FAILURE(Prefill({"s"}));
  const v1::StepRequest req = Packed(h_.Make(kLayer, Spans({"s"}, 64)));
  for (bool cancel : {false, true}) {
    SCOPED_TRACE(cancel ? "cancelled" : "writes done");
    auto stream = Stream();
    auto r = client::StepRing::Attach(stream.get(), region_.get(), kRingOffset, kSlots, kSlotBytes);
    ASSERT_TRUE(r.ok()) << r.status();
    v1::StepResponse resp;
    ASSERT_TRUE((*r)->Call(req, &resp).ok());
    EXPECT_EQ(resp.code(), 0) << resp.message();
    uint8_t* rb = (*r)->ring();
    if (cancel) {
      stream->Cancel();
    } else {
      stream->WritesDone();
    }
    const grpc::StatusCode want = cancel ? grpc::StatusCode::CANCELLED : grpc::StatusCode::OK;
    EXPECT_EQ(static_cast<int>(stream->Finish().code()), static_cast<int>(want));
    // The server closes the ring by the time the stream has finished.
    const absl::Time until = absl::Now() + absl::Seconds(5);
    while (ring::Load(ring::HeaderAt(rb)->closed) == 0 && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_EQ(ring::Load(ring::HeaderAt(rb)->closed), 1u);
    // A request written afterwards is never answered, and waits say why.
    const uint64_t n = (*r)->next_ticket();
    auto t = (*r)->Submit(req);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*r)->Wait(*t, &resp, absl::Seconds(5)).code(), absl::StatusCode::kUnavailable);
    EXPECT_FALSE(RawWait(rb, n, &resp, absl::Milliseconds(300)));
    EXPECT_EQ(h_.Length("s", kLayer), 70);
  }
}

TEST_F(StepRingTest, MetricsCountRingStepsExactly) {
  ASSERT_NO_FATAL_FAILURE(Prefill({"s0", "s1"}));
  auto scrape = [&](const std::map<std::string, std::string>& labels, const std::string& metric) {
    auto text = h_.server->ScrapeMetrics();
    EXPECT_TRUE(text.ok()) << text.status();
    auto e = ParsePrometheusText(*text);
    EXPECT_TRUE(e.ok()) << e.status();
    return e->Sum(metric, labels);
  };
  auto ok_calls = [&] {
    return scrape({{"method", "StepStream"}, {"code", "OK"}}, "smla_requests_total");
  };
  auto bad_calls = [&] {
    return scrape({{"method", "StepStream"}, {"code", "INVALID_ARGUMENT"}}, "smla_requests_total");
  };
  auto rows = [&] { return scrape({}, "smla_step_rows_total"); };
  const double ok0 = ok_calls(), bad0 = bad_calls(), rows0 = rows();
  const double attach0 = scrape({{"method", "RingAttach"}, {"code", "OK"}}, "smla_requests_total");
  auto stream = Stream();
  auto r = client::StepRing::Attach(stream.get(), region_.get(), kRingOffset, kSlots, kSlotBytes);
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::StepRequest req = Packed(h_.Make(kLayer, Spans({"s0", "s1"}, 64)));
  constexpr int kCalls = 7;
  v1::StepResponse resp;
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE((*r)->Call(req, &resp).ok());
    ASSERT_EQ(resp.code(), 0) << resp.message();
  }
  RawSubmit((*r)->ring(), (*r)->next_ticket(), std::string(64, '\xff'), 64);
  ASSERT_TRUE(RawWait((*r)->ring(), (*r)->next_ticket(), &resp));
  EXPECT_NE(resp.code(), 0);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(ok_calls() - ok0, kCalls);
  EXPECT_EQ(bad_calls() - bad0, 1);
  EXPECT_EQ(rows() - rows0, kCalls * 12);
  EXPECT_EQ(scrape({{"method", "RingAttach"}, {"code", "OK"}}, "smla_requests_total") - attach0, 1);
}

// The poller spins while its steps are in service and shortly after: once every step (served,
// pipelined, or refused) is answered it still goes to sleep on the doorbell, and the next
// request wakes it.
TEST_F(StepRingTest, PollerSleepsOnceItsStepsAreAnsweredAndWakesForTheNext) {
  const std::vector<std::string> seqs = {"s0", "s1", "s2"};
  ASSERT_NO_FATAL_FAILURE(Prefill(seqs));
  auto stream = Stream();
  auto r = client::StepRing::Attach(stream.get(), region_.get(), kRingOffset, kSlots, kSlotBytes);
  ASSERT_TRUE(r.ok()) << r.status();
  client::StepRing& ring = **r;
  const ring::Header* header = ring::HeaderAt(ring.ring());
  auto sleeps = [&] {
    const absl::Time until = absl::Now() + absl::Seconds(20);
    while (ring::Load(header->server_sleeping) == 0 && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return ring::Load(header->server_sleeping) == 1;
  };
  const v1::StepRequest one = Packed(h_.Make(kLayer, Spans({"s0"}, 64)));
  v1::StepResponse resp;
  for (int i = 0; i < 3; ++i) {  // a closed loop
    ASSERT_TRUE(ring.Call(one, &resp).ok());
    ASSERT_EQ(resp.code(), 0) << resp.message();
  }
  EXPECT_TRUE(sleeps()) << "the poller kept spinning after its steps were answered";
  // Several in flight at once (the first wakes the sleeping poller), one sequence each with its
  // own output range.
  std::vector<uint64_t> tickets;
  uint64_t at = 0;
  for (const std::string& id : seqs) {
    v1::StepRequest q = h_.Make(kLayer, Spans({id}, id == "s0" ? 70 : 64));
    auto end = region_->Place(&q, at, Layout::kPacked);
    ASSERT_TRUE(end.ok()) << end.status();
    at = *end;
    auto t = ring.Submit(q);
    ASSERT_TRUE(t.ok()) << t.status();
    tickets.push_back(*t);
  }
  for (uint64_t t : tickets) {
    ASSERT_TRUE(ring.Wait(t, &resp).ok());
    ASSERT_EQ(resp.code(), 0) << resp.message();
  }
  EXPECT_TRUE(sleeps());
  ASSERT_TRUE(ring.Call(Packed(h_.Make(kLayer, Spans({"s0"}, 76))), &resp).ok());
  ASSERT_EQ(resp.code(), 0) << resp.message();
  EXPECT_TRUE(sleeps());
  // A refused request (answered at once, never submitted) counts out as well. (RawSubmit
  // bypasses the client's tickets: the client ring is not used after it.)
  const uint64_t n = ring.next_ticket();
  RawSubmit(ring.ring(), n, std::string(64, '\xff'), 64);
  ASSERT_TRUE(RawWait(ring.ring(), n, &resp));
  EXPECT_NE(resp.code(), 0);
  EXPECT_TRUE(sleeps());
  EXPECT_EQ(h_.Length("s0", kLayer), 82);
  EXPECT_EQ(h_.Length("s2", kLayer), 70);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(StepRingServerTest, ShutdownWithAnAttachedRingIsClean) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kDsv41, "--allow_shm", "--shutdown_grace_s=1"}, "dsv4.1-flash"));
  auto region = client::ShmRegion::Create(h.client.get(), Unique("ring-shutdown"), 1 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  auto stream = h.client->OpenStream();
  ASSERT_TRUE(stream.ok());
  auto r = client::StepRing::Attach(stream->get(), region->get(), 0, kSlots, kSlotBytes);
  ASSERT_TRUE(r.ok()) << r.status();
  // The open stream is cancelled after the grace; its ring stops and the server exits 0.
  EXPECT_EQ(h.server->Terminate(), 0);
  EXPECT_EQ(ring::Load(ring::HeaderAt((*r)->ring())->closed), 1u);
}

// A server started with --allow_shm and `flags`, sequence "s" stored up to position 64, and a
// ring attached to a stream over a fresh region named after `what`.
struct RingServer {
  void Start(std::vector<std::string> flags, const std::string& what) {
    flags.insert(flags.begin(), {kDsv41, "--allow_shm"});
    ASSERT_NO_FATAL_FAILURE(h.Start(flags, "dsv4.1-flash"));
    ASSERT_NO_FATAL_FAILURE(h.UploadTables(1024));
    ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "s").ok());
    h.StepAndCheck(h.Make(kLayer, {{"s", 0, 64, 0}}));
    auto r = client::ShmRegion::Create(h.client.get(), Unique(what), kRegionBytes);
    ASSERT_TRUE(r.ok()) << r.status();
    region = *std::move(r);
    auto s = h.client->OpenStream();
    ASSERT_TRUE(s.ok()) << s.status();
    stream = *std::move(s);
    auto a = client::StepRing::Attach(stream.get(), region.get(), kRingOffset, kSlots, kSlotBytes);
    ASSERT_TRUE(a.ok()) << a.status();
    ring = *std::move(a);
  }
  // The step of `s`'s next 6 rows from `position`, placed in the region.
  v1::StepRequest Next(int64_t position) {
    v1::StepRequest q = h.Make(kLayer, Spans({"s"}, position));
    EXPECT_TRUE(region->Place(&q, 0, Layout::kPacked).ok());
    return q;
  }
  void Finish() {
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }

  Harness h;
  std::unique_ptr<client::ShmRegion> region;
  std::unique_ptr<client::StepStream> stream;
  std::unique_ptr<client::StepRing> ring;
};

// --scheduler_spin_us: with the scheduler parking at once (0) or spinning long after each batch,
// ring steps in a closed loop are answered and applied alike.
TEST(StepRingServerTest, SchedulerSpinFlagServesRingStepsEitherWay) {
  for (const char* spin : {"0", "50000"}) {
    SCOPED_TRACE(absl::StrCat("--scheduler_spin_us=", spin));
    RingServer rs;
    ASSERT_NO_FATAL_FAILURE(
        rs.Start({absl::StrCat("--scheduler_spin_us=", spin)}, absl::StrCat("spin", spin)));
    v1::StepResponse resp;
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(rs.ring->Call(rs.Next(64 + 6 * i), &resp).ok());
      ASSERT_EQ(resp.code(), 0) << resp.message();
    }
    EXPECT_EQ(rs.h.Length("s", kLayer), 64 + 4 * 6);
    rs.Finish();
  }
}

// A step in service longer than StepRing::kBusySpin is waited for asleep: the poller sleeps
// before the answer comes, and the completion wakes it for the next request.
TEST(StepRingServerTest, PollerSleepsThroughALongStep) {
  RingServer rs;
  ASSERT_NO_FATAL_FAILURE(rs.Start({"--inject_attend_delay_ms=400"}, "long-step"));
  client::StepRing& ring = *rs.ring;
  const ring::Header* header = ring::HeaderAt(ring.ring());
  v1::StepResponse resp;
  for (int i = 0; i < 2; ++i) {
    auto ticket = ring.Submit(rs.Next(64 + 6 * i));
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    const ring::SlotHeader* slot =
        ring::SlotAt(ring.ring(), kSlotBytes, static_cast<uint32_t>((*ticket - 1) % kSlots));
    // The step is held 400 ms in the backend: sampled until its answer, the poller is asleep
    // nearly all along (spinning through it, it would be awake in every sample).
    const uint32_t seq = static_cast<uint32_t>(*ticket);
    const absl::Time until = absl::Now() + absl::Seconds(20);
    int samples = 0, asleep = 0;
    while (absl::Now() < until && ring::Load(slot->response_seq) != seq) {
      const bool sleeping = ring::Load(header->server_sleeping) == 1;
      if (ring::Load(slot->response_seq) == seq) break;
      ++samples;
      asleep += sleeping ? 1 : 0;
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_GE(samples, 10);
    EXPECT_GT(asleep * 2, samples)
        << asleep << " of " << samples << " samples asleep: the poller spun through a 400 ms step";
    ASSERT_TRUE(ring.Wait(*ticket, &resp).ok());
    ASSERT_EQ(resp.code(), 0) << resp.message();
  }
  EXPECT_EQ(rs.h.Length("s", kLayer), 64 + 2 * 6);
  rs.Finish();
}

// A client cannot resize its region under the server: the memfd's size is sealed, so the
// server, which would die of SIGBUS touching a shrunk mapping, never sees one. Tried with the
// ring attached and idle, and over and over while ring steps read their inputs and write their
// outputs (punching holes in the outputs is allowed: the pages read back as zeros, no fault).
TEST(StepRingServerTest, ResizingTheRegionCannotFaultTheServer) {
  RingServer rs;
  ASSERT_NO_FATAL_FAILURE(rs.Start({}, "resize"));
  const int fd = rs.region->fd();
  errno = 0;
  EXPECT_EQ(ftruncate(fd, 0), -1);
  EXPECT_EQ(errno, EPERM);
  absl::SleepFor(absl::Milliseconds(300));  // the old server died within this, idle
  ASSERT_TRUE(rs.h.client->Info().ok()) << "the server died";
  const v1::RegionRef out = rs.Next(64).out_region();
  std::atomic<bool> done{false};
  std::atomic<int> tries{0}, resized{0}, punched{0};
  std::thread attacker([&] {
    while (!done.load() && tries.load() < 1000000) {
      ++tries;
      for (off_t size : {off_t{0}, off_t{4096}, static_cast<off_t>(2 * kRegionBytes)}) {
        if (ftruncate(fd, size) == 0) ++resized;
      }
      if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    static_cast<off_t>(out.offset()), static_cast<off_t>(out.size())) == 0) {
        ++punched;
      }
    }
  });
  v1::StepResponse resp;
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(rs.ring->Call(rs.Next(64 + 6 * i), &resp).ok());
    EXPECT_EQ(resp.code(), 0) << resp.message();
  }
  done = true;
  attacker.join();
  EXPECT_GT(tries.load(), 0);
  EXPECT_EQ(resized.load(), 0);
  EXPECT_GT(punched.load(), 0);
  // Alive, and serving: the ring's sequence holds its 8 steps, and a fresh sequence's inline
  // step (another client) matches the reference.
  EXPECT_EQ(rs.h.Length("s", kLayer), 64 + 8 * 6);
  auto other = rs.h.server->Connect();
  ASSERT_TRUE(other->CreateSequence(rs.h.ModelName(), "other").ok());
  rs.h.StepAndCheck(rs.h.Make(kLayer, {{"other", 0, 64, 0}}));
  rs.Finish();
}

// A ring's server memory follows what the ring holds, not its size: attaching the largest
// ring (256 slots of 1 MiB) and serving steps through it adds a few MiB of RSS at most.
TEST(StepRingServerTest, LargeRingCostsTheServerWhatItHolds) {
  if (!kRssMeaningful) GTEST_SKIP() << "RSS does not follow live memory under AddressSanitizer";
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kDsv41, "--allow_shm"}, "dsv4.1-flash"));
  ASSERT_NO_FATAL_FAILURE(h.UploadTables(1024));
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "s").ok());
  h.StepAndCheck(h.Make(kLayer, {{"s", 0, 64, 0}}));
  constexpr uint64_t kRingAt = 2 << 20;  // inputs and outputs below
  const uint64_t ring_bytes = ring::RingBytes(ring::kMaxSlots, ring::kMaxSlotBytes);
  auto region = client::ShmRegion::Create(h.client.get(), Unique("big-ring"), kRingAt + ring_bytes);
  ASSERT_TRUE(region.ok()) << region.status();
  auto next = [&](int64_t position) {
    v1::StepRequest q = h.Make(kLayer, Spans({"s"}, position));
    EXPECT_TRUE((*region)->Place(&q, 0, Layout::kPacked).ok());
    return q;
  };
  // One step through the region first, so the baseline holds what any region step costs.
  ASSERT_TRUE(h.client->Step(next(64)).ok());
  auto stream = h.client->OpenStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const int64_t before = RssBytes(h.server->pid());
  auto r = client::StepRing::Attach(stream->get(), region->get(), kRingAt, ring::kMaxSlots,
                                    ring::kMaxSlotBytes);
  ASSERT_TRUE(r.ok()) << r.status();
  v1::StepResponse resp;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE((*r)->Call(next(70 + 6 * i), &resp).ok());
    ASSERT_EQ(resp.code(), 0) << resp.message();
  }
  const int64_t after = RssBytes(h.server->pid());
  ASSERT_GT(before, 0);
  EXPECT_LT(after - before, int64_t{16} << 20)
      << "RSS " << before / 1024 << " KiB before the attach, " << after / 1024 << " KiB after";
  (*stream)->WritesDone();
  EXPECT_TRUE((*stream)->Finish().ok());
}

TEST(StepRingServerTest, WithoutAllowShmAttachIsRefused) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kDsv41}, "dsv4.1-flash"));
  auto stream = h.client->OpenStream();
  ASSERT_TRUE(stream.ok());
  ExpectCode(SendAttach(stream->get(), AttachOf("/smla-x", 0, kSlots, kSlotBytes)),
             grpc::StatusCode::FAILED_PRECONDITION,
             "ring_attach: shared-memory regions are not enabled on this server (start it with "
             "--allow_shm)");
  (*stream)->WritesDone();
  EXPECT_TRUE((*stream)->Finish().ok());
}

TEST(StepRingServerTest, ForeignRegionIsPermissionDenied) {
  const std::string tokens = ::testing::TempDir() + "/ring_tokens.txt";
  std::ofstream(tokens) << "token-alice alice\ntoken-bob bob\n";
  chmod(tokens.c_str(), 0600);
  auto server = ServerProcess::Start({kDsv41, "--allow_shm", "--token_file=" + tokens});
  ASSERT_TRUE(server.ok()) << server.status();
  auto connect = [&](const std::string& token) {
    client::ClientOptions o;
    o.target = (*server)->target();
    o.token = token;
    auto c = client::Client::Connect(o);
    EXPECT_TRUE(c.ok());
    return *std::move(c);
  };
  std::unique_ptr<client::Client> alice = connect("token-alice"), bob = connect("token-bob");
  auto alices = client::ShmRegion::Create(alice.get(), Unique("ring-alice"), 1 << 20);
  ASSERT_TRUE(alices.ok()) << alices.status();
  auto stream = bob->OpenStream();
  ASSERT_TRUE(stream.ok());
  auto r = client::StepRing::Attach(stream->get(), alices->get(), 0, kSlots, kSlotBytes);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("belongs to another tenant"));
  // Alice's own stream can attach it.
  auto astream = alice->OpenStream();
  ASSERT_TRUE(astream.ok());
  EXPECT_TRUE(client::StepRing::Attach(astream->get(), alices->get(), 0, kSlots, kSlotBytes).ok());
  (*astream)->WritesDone();
  EXPECT_TRUE((*astream)->Finish().ok());
  (*stream)->WritesDone();
  EXPECT_TRUE((*stream)->Finish().ok());
}

}  // namespace
}  // namespace smla::testing
