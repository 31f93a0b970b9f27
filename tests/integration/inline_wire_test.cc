// Unit tests of the inline data path at the edge: a StepRequest read from gRPC's receive buffer
// (request_reader.h) is what protobuf would parse, with every tensor's bytes landed once in
// reused staging; a StepResponse serialized with staged outputs (response_writer.h) is a plain
// protobuf message; the staging pool reuses its buffers and keeps its byte limits.
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "edge/host_staging.h"
#include "edge/request_reader.h"
#include "edge/response_writer.h"
#include "edge/wire.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "smla/v1/tensor_bytes.h"

namespace smla::server::edge {
namespace {

using ::testing::HasSubstr;

// `bytes` as a ByteBuffer of slices cut at random points (gRPC hands over messages in pieces).
grpc::ByteBuffer Sliced(const std::string& bytes, std::mt19937_64& rng) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t n = std::min<size_t>(bytes.size() - at, 1 + rng() % 4096);
    slices.emplace_back(bytes.data() + at, n);
    at += n;
  }
  if (slices.empty()) slices.emplace_back("", 0);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string RandomBytes(size_t n, std::mt19937_64& rng) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

v1::StepRequest RandomRequest(std::mt19937_64& rng) {
  v1::StepRequest r;
  r.set_request_id("req-1");
  r.set_model("dsv4.1-flash");
  r.set_layer(3);
  r.set_want_lse(true);
  for (int s = 0; s < 3; ++s) {
    v1::Span* span = r.add_spans();
    span->set_sequence_id("seq" + std::to_string(s));
    span->set_first_position(100 + s);
    span->set_num_rows(2);
    span->add_roles(v1::ROW_ROLE_VERIFY);
    span->add_roles(v1::ROW_ROLE_DRAFT);
    for (v1::Tensor* t : {span->mutable_kv_rows(), span->mutable_q(), span->mutable_topk()}) {
      t->set_dtype(v1::DTYPE_BF16);
      t->add_shape(2);
      t->add_shape(7);
      t->set_inline_data(RandomBytes(1 + rng() % 20000, rng));
    }
  }
  return r;
}

// The tensors' bytes by (span, field) and the request with them cleared.
struct Split {
  v1::StepRequest skeleton;
  std::vector<std::string> bytes;
};

Split Expected(const v1::StepRequest& r) {
  Split e{r, {}};
  for (v1::Span& s : *e.skeleton.mutable_spans()) {
    for (v1::Tensor* t : {s.mutable_kv_rows(), s.mutable_q(), s.mutable_topk()}) {
      e.bytes.push_back(t->inline_data());
      t->clear_inline_data();
    }
  }
  return e;
}

Split Landed(const v1::StepRequest& read, const LandedTensors& landed) {
  Split got{read, {}};
  for (const v1::Span& s : read.spans()) {
    for (const v1::Tensor* t : {&s.kv_rows(), &s.q(), &s.topk()}) {
      const auto it = landed.bytes.find(t);
      got.bytes.push_back(
          it == landed.bytes.end()
              ? std::string("<none>")
              : std::string(reinterpret_cast<const char*>(it->second.data()), it->second.size()));
      EXPECT_EQ(reinterpret_cast<uintptr_t>(it->second.data()) % 64, 0u);
    }
  }
  return got;
}

StagingPool Pool(StagingPool::Options o = {}) { return StagingPool(HostPinning{}, o); }

TEST(RequestReaderTest, ReadsWhatProtobufParsesWithTensorsInStaging) {
  std::mt19937_64 rng(7);
  StagingPool pool = Pool();
  for (int i = 0; i < 20; ++i) {
    const v1::StepRequest r = RandomRequest(rng);
    v1::StepRequest read;
    LandedTensors landed;
    ASSERT_TRUE(
        ReadStepRequest(Sliced(r.SerializeAsString(), rng), pool, nullptr, "t", &read, &landed, 0)
            .ok());
    const Split want = Expected(r), got = Landed(read, landed);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(want.skeleton, got.skeleton))
        << got.skeleton.DebugString();
    EXPECT_EQ(want.bytes, got.bytes);
  }
}

TEST(RequestReaderTest, FollowsProtobufForRepeatedFieldsOneofsAndUnknownFields) {
  std::mt19937_64 rng(8);
  v1::StepRequest a = RandomRequest(rng), b = RandomRequest(rng);
  // Spans are repeated: another span appends one.
  v1::StepRequest extra;
  extra.add_spans()->mutable_q()->set_inline_data("another span");
  std::string wire = a.SerializeAsString();
  // Region after inline bytes: the region wins; inline bytes after a region: the bytes win.
  v1::Tensor region_last;
  region_last.set_inline_data("dropped");
  region_last.mutable_region()->set_region("r1");
  v1::Tensor bytes_last;
  bytes_last.mutable_region()->set_region("r2");
  bytes_last.set_inline_data("kept");
  std::string odd = region_last.SerializeAsString();  // bytes first on the wire
  std::string odd2;
  {
    v1::Tensor r;
    r.mutable_region()->set_region("r2");
    odd2 = r.SerializeAsString();
    v1::Tensor d;
    d.set_inline_data("kept");
    odd2 += d.SerializeAsString();
  }
  v1::Span oneofs;
  oneofs.set_sequence_id("oneofs");
  std::string span_wire = oneofs.SerializeAsString();
  span_wire += v1::LengthPrefix(7, odd.size()) + odd;    // q
  span_wire += v1::LengthPrefix(8, odd2.size()) + odd2;  // topk
  // A second occurrence of a singular tensor merges into the first: its shape is appended, the
  // bytes stay; a third's bytes replace them.
  for (const char* bytes : {"first", "", "third"}) {
    v1::Tensor kv;
    kv.add_shape(1);
    if (*bytes != 0) kv.set_inline_data(bytes);
    const std::string k = kv.SerializeAsString();
    span_wire += v1::LengthPrefix(5, k.size()) + k;
  }
  // An unknown field (number 99, varint) survives as protobuf would keep it.
  std::string unknown;
  v1::AppendVarint((99 << 3) | 0, &unknown);
  v1::AppendVarint(5, &unknown);
  wire += extra.SerializeAsString() + v1::LengthPrefix(4, span_wire.size()) + span_wire + unknown;
  wire += b.SerializeAsString();  // a whole second message merged

  v1::StepRequest want;
  ASSERT_TRUE(want.ParseFromString(wire));
  StagingPool pool = Pool();
  v1::StepRequest read;
  LandedTensors landed;
  ASSERT_TRUE(ReadStepRequest(Sliced(wire, rng), pool, nullptr, "t", &read, &landed, 0).ok());
  ASSERT_EQ(read.spans_size(), want.spans_size());
  for (int i = 0; i < want.spans_size(); ++i) {
    for (auto [w, g] : {std::pair{&want.spans(i).kv_rows(), &read.spans(i).kv_rows()},
                        std::pair{&want.spans(i).q(), &read.spans(i).q()},
                        std::pair{&want.spans(i).topk(), &read.spans(i).topk()}}) {
      // The reader leaves no inline_data set: landed bytes stand for it.
      const auto inline_or_unset = [](const v1::Tensor* t) {
        return t->data_case() == v1::Tensor::kRegion ? v1::Tensor::kRegion
                                                     : v1::Tensor::kInlineData;
      };
      EXPECT_EQ(inline_or_unset(w), inline_or_unset(g)) << "span " << i;
      EXPECT_EQ(w->shape_size(), g->shape_size());
      if (w->data_case() == v1::Tensor::kRegion) {
        EXPECT_EQ(w->region().region(), g->region().region());
        continue;
      }
      const auto it = landed.bytes.find(g);
      const std::string got =
          it == landed.bytes.end()
              ? std::string()
              : std::string(reinterpret_cast<const char*>(it->second.data()), it->second.size());
      EXPECT_EQ(w->inline_data(), got) << "span " << i;
    }
  }
  EXPECT_EQ(read.request_id(), want.request_id());
  EXPECT_EQ(read.GetReflection()->GetUnknownFields(read).field_count(),
            want.GetReflection()->GetUnknownFields(want).field_count());
  EXPECT_EQ(want.GetReflection()->GetUnknownFields(want).field_count(), 1);
}

TEST(RequestReaderTest, MalformedMessagesAreInvalidArgument) {
  std::mt19937_64 rng(9);
  const std::string good = RandomRequest(rng).SerializeAsString();
  StagingPool pool = Pool();
  for (const std::string& bad :
       {good.substr(0, good.size() / 2), std::string("\xff\xff\xff", 3), std::string("\x22\x7f", 2),
        std::string("\x0b", 1) /* field 1 start-group, never ended */,
        std::string("\x07\x00", 2) /* wire type 7 */}) {
    v1::StepRequest read;
    LandedTensors landed;
    const absl::Status st =
        ReadStepRequest(Sliced(bad, rng), pool, nullptr, "t", &read, &landed, 0);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("not a valid smla.v1.StepRequest"));
  }
  EXPECT_EQ(pool.bytes_leased(), 0u);
}

// Below kWalkFromBytes a message is parsed whole: its tensors stay in the message.
// Large requests are copied by the ParallelCopier's helpers: the bytes land exactly as the
// single-threaded copy would put them, slice boundaries and tensor ends included.
TEST(RequestReaderTest, LargeRequestsLandTheSameThroughHelpers) {
  std::mt19937_64 rng(13);
  StagingPool pool = Pool();
  v1::ParallelCopier copier(3);
  v1::StepRequest r = RandomRequest(rng);
  for (int s = 0; s < r.spans_size(); ++s) {
    r.mutable_spans(s)->mutable_q()->set_inline_data(RandomBytes((700 << 10) + 13 * s, rng));
  }
  const std::string wire = r.SerializeAsString();
  ASSERT_GT(wire.size(), v1::ParallelCopier::kMinParallelBytes);
  for (int i = 0; i < 4; ++i) {
    v1::StepRequest read;
    LandedTensors landed;
    ASSERT_TRUE(ReadStepRequest(Sliced(wire, rng), pool, &copier, "t", &read, &landed).ok());
    const Split want = Expected(r), got = Landed(read, landed);
    EXPECT_EQ(want.bytes, got.bytes);
  }
}

// Each kind of tensor lands contiguous in span order, so the executor copies a kind to the
// device in one copy (it merges copies that continue each other on both sides).
TEST(RequestReaderTest, TensorsLandGroupedByKindInSpanOrder) {
  std::mt19937_64 rng(14);
  StagingPool pool = Pool();
  v1::StepRequest r;
  for (int s = 0; s < 4; ++s) {
    v1::Span* span = r.add_spans();
    span->mutable_kv_rows()->set_inline_data(RandomBytes(1152 * (s + 1), rng));
    span->mutable_q()->set_inline_data(RandomBytes(9216 * 6, rng));
    span->mutable_topk()->set_inline_data(RandomBytes(2048 * 6, rng));
  }
  v1::StepRequest read;
  LandedTensors landed;
  ASSERT_TRUE(
      ReadStepRequest(Sliced(r.SerializeAsString(), rng), pool, nullptr, "t", &read, &landed, 0)
          .ok());
  for (auto field : {&v1::Span::q, &v1::Span::kv_rows, &v1::Span::topk}) {
    for (int s = 0; s + 1 < read.spans_size(); ++s) {
      const auto a = landed.bytes.at(&(read.spans(s).*field)());
      const auto b = landed.bytes.at(&(read.spans(s + 1).*field)());
      EXPECT_EQ(a.data() + a.size(), b.data()) << "span " << s;
    }
  }
  const Split want = Expected(r), got = Landed(read, landed);
  EXPECT_EQ(want.bytes, got.bytes);
}

TEST(ParallelCopierTest, ConcurrentCallersEachGetTheirBytes) {
  v1::ParallelCopier copier(2);
  EXPECT_EQ(copier.helpers(), 2);
  constexpr int kCallers = 4;
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      std::mt19937_64 rng(100 + c);
      for (int round = 0; round < 8; ++round) {
        // Pieces of odd sizes (small and multi-chunk), 1 to 3 MiB in all.
        std::string src = RandomBytes((1 << 20) + rng() % (2 << 20), rng);
        std::string dst(src.size(), '\0');
        std::vector<v1::CopyPiece> pieces;
        for (size_t at = 0; at < src.size();) {
          const size_t n = std::min<size_t>(src.size() - at, 1 + rng() % (600 << 10));
          pieces.push_back(v1::CopyPiece{reinterpret_cast<uint8_t*>(dst.data()) + at,
                                         reinterpret_cast<const uint8_t*>(src.data()) + at, n});
          at += n;
        }
        copier.Copy(pieces);
        if (dst != src) ++wrong;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(RequestReaderTest, SmallMessagesAreParsedWhole) {
  std::mt19937_64 rng(12);
  StagingPool pool = Pool();
  const v1::StepRequest r = RandomRequest(rng);
  const std::string wire = r.SerializeAsString();
  ASSERT_LT(wire.size(), kWalkFromBytes);
  v1::StepRequest read;
  LandedTensors landed;
  ASSERT_TRUE(ReadStepRequest(Sliced(wire, rng), pool, nullptr, "t", &read, &landed).ok());
  EXPECT_TRUE(landed.bytes.empty());
  EXPECT_EQ(pool.bytes_leased(), 0u);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(r, read));
}

TEST(RequestReaderTest, SteadyReadsReuseStagingBuffers) {
  std::mt19937_64 rng(10);
  StagingPool pool = Pool();
  const v1::StepRequest r = RandomRequest(rng);
  const std::string wire = r.SerializeAsString();
  for (int i = 0; i < 50; ++i) {
    v1::StepRequest read;
    LandedTensors landed;
    ASSERT_TRUE(ReadStepRequest(Sliced(wire, rng), pool, nullptr, "t", &read, &landed, 0).ok());
  }
  EXPECT_EQ(pool.buffers_mapped(), 1u);
  EXPECT_EQ(pool.bytes_leased(), 0u);
  EXPECT_GT(pool.bytes_cached(), 0u);
}

TEST(StagingPoolTest, KeepsServerAndTenantLimits) {
  StagingPool::Options o;
  o.max_bytes = 1 << 20;
  o.max_tenant_bytes = 512 << 10;
  o.max_cached_bytes = 256 << 10;
  StagingPool pool = Pool(o);
  auto a = pool.Lease(300 << 10, "a");  // rounds up to 512 KiB
  ASSERT_TRUE(a.ok());
  auto a2 = pool.Lease(1, "a");
  EXPECT_EQ(a2.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(a2.status().message()), HasSubstr("tenant's limit"));
  auto b = pool.Lease(400 << 10, "b");
  ASSERT_TRUE(b.ok());
  auto c = pool.Lease(1, "c");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("server's limit"));
  EXPECT_EQ(pool.tenant_bytes_leased("a"), 512u << 10);
  a->reset();
  b->reset();
  EXPECT_EQ(pool.bytes_leased(), 0u);
  EXPECT_EQ(pool.tenant_bytes_leased("a"), 0u);
  EXPECT_LE(pool.bytes_cached(), o.max_cached_bytes);  // the second buffer was unmapped
  EXPECT_TRUE(pool.Lease(1, "c").ok());
}

TEST(ResponseWriterTest, StagedOutputsMakeAPlainProtobufResponse) {
  std::mt19937_64 rng(11);
  StagingPool pool = Pool();
  for (bool mx : {false, true}) {
    auto buffer = pool.Lease(3 << 20, "t");
    ASSERT_TRUE(buffer.ok());
    StagedOutputs staged;
    staged.buffer = *buffer;
    uint8_t* p = staged.buffer->data();
    staged.out = {p, size_t{2} << 20};
    staged.mx_scales = mx ? std::span<uint8_t>{p + (2 << 20), 4096} : std::span<uint8_t>{};
    staged.lse = {p + (2 << 20) + 8192, 256};
    for (uint8_t& b : std::span<uint8_t>(p, (2 << 20) + 8192 + 256))
      b = static_cast<uint8_t>(rng());
    v1::StepResponse r;
    r.set_request_id("r");
    r.mutable_out()->set_dtype(mx ? v1::DTYPE_E4M3 : v1::DTYPE_BF16);
    r.mutable_out()->add_shape(4);
    if (mx) r.mutable_mx_scales()->set_dtype(v1::DTYPE_E8M0);
    r.mutable_lse()->set_dtype(v1::DTYPE_F32);
    r.mutable_timings()->set_kernel_us(17);
    v1::StepResponse want = r;
    want.mutable_out()->set_inline_data(staged.out.data(), staged.out.size());
    if (mx) want.mutable_mx_scales()->set_inline_data(staged.mx_scales.data(), 4096);
    want.mutable_lse()->set_inline_data(staged.lse.data(), staged.lse.size());
    grpc::ByteBuffer bytes;
    SerializeStepResponse(&r, staged, &bytes);
    staged = {};
    buffer->reset();
    EXPECT_GT(pool.bytes_leased(), 0u);  // the slices still hold the buffer
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(bytes.Dump(&slices).ok());
    std::string wire;
    for (const grpc::Slice& s : slices)
      wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
    v1::StepResponse got;
    ASSERT_TRUE(got.ParseFromString(wire));
    std::string diff;
    google::protobuf::util::MessageDifferencer d;
    d.ReportDifferencesToString(&diff);
    EXPECT_TRUE(d.Compare(want, got)) << diff.substr(0, 2000);
    slices.clear();
    bytes.Clear();
    EXPECT_EQ(pool.bytes_leased(), 0u);
  }
}

}  // namespace
}  // namespace smla::server::edge
