// End-to-end tests of the service core on the CPU backend: every output is compared bit for bit
// with a reference computed independently (tests/server/core_test_util.h) from what the test
// wrote.
#include "smla/server/service_core.h"

#include <future>
#include <limits>
#include <map>
#include <thread>

#include "core_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "smla/kernels/cpu_backend.h"
#include "smla/server/model_profile.h"

namespace smla::server {
namespace {

using testing::ControlledBackend;
using ::testing::HasSubstr;
using testing::HostLayer;
using testing::SpanData;

constexpr char kTenant[] = "tenant-a";

struct StepOptions {
  kernels::OutputFormat format = kernels::OutputFormat::kBf16;
  bool want_lse = false;
  bool inverse_rope = false;
};

class CoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<kernels::Backend>> ref =
        kernels::CreateCpuBackend({.cpu_threads = 2});
    ASSERT_TRUE(ref.ok()) << ref.status();
    ref_backend_ = *std::move(ref);
  }

  // Starts a core for the model specs (ParseModelConfig syntax) and uploads sinks.
  std::unique_ptr<ServiceCore> Start(const std::vector<std::string>& specs, Limits limits = {},
                                     ControlledBackend** controlled = nullptr,
                                     bool upload_sinks = true) {
    absl::StatusOr<std::unique_ptr<kernels::Backend>> cpu =
        kernels::CreateCpuBackend({.cpu_threads = 2});
    EXPECT_TRUE(cpu.ok()) << cpu.status();
    auto backend = std::make_unique<ControlledBackend>(*std::move(cpu));
    if (controlled != nullptr) *controlled = backend.get();
    ServerConfig config;
    config.limits = limits;
    for (const std::string& spec : specs) {
      absl::StatusOr<ModelConfig> m = ParseModelConfig(spec);
      EXPECT_TRUE(m.ok()) << m.status();
      config.models.push_back(*m);
    }
    absl::StatusOr<std::unique_ptr<ServiceCore>> core =
        ServiceCore::Create(config, std::move(backend));
    EXPECT_TRUE(core.ok()) << core.status();
    if (!core.ok()) return nullptr;
    for (const ModelConfig& m : (*core)->Info().models) {
      configs_[m.profile] = m;
      const ModelProfile& p = *FindProfile(m.profile);
      if (!p.has_sink || !upload_sinks) continue;
      std::uniform_real_distribution<float> d(-2.0f, 2.0f);
      std::vector<float> sinks(size_t{static_cast<size_t>(p.num_layers())} * m.heads_per_rank);
      for (float& v : sinks) v = d(rng_);
      EXPECT_TRUE((*core)->SetSinks(m.profile, sinks).ok());
      sinks_[m.profile] = sinks;
    }
    return *std::move(core);
  }

  SpanData Span(const std::string& model, int32_t layer, const std::string& seq, int64_t first,
                int32_t rows, int32_t topk_width = 24) {
    const ModelConfig& c = configs_.at(model);
    return testing::MakeSpan(rng_, *FindProfile(model), layer, c.heads_per_rank, seq, first, rows,
                             topk_width);
  }

  StepRequest Request(const std::string& model, int32_t layer,
                      const std::vector<const SpanData*>& spans, const StepOptions& o = {},
                      const std::string& tenant = kTenant) {
    StepRequest r;
    r.request_id = "test";
    r.tenant = tenant;
    r.model = model;
    r.layer = layer;
    for (const SpanData* s : spans) r.spans.push_back(s->View());
    r.output_format = o.format;
    r.want_lse = o.want_lse;
    r.inverse_rope = o.inverse_rope;
    return r;
  }

  // The expected result of each span (the host mirror already holds the spans' writes),
  // concatenated in span order.
  StepResult Expected(const std::string& model, int32_t layer,
                      const std::vector<const SpanData*>& spans, const StepOptions& o) {
    const ModelConfig& c = configs_.at(model);
    StepResult all;
    for (const SpanData* s : spans) {
      testing::ReferenceOptions ro;
      ro.format = o.format;
      ro.want_lse = o.want_lse;
      ro.rope = o.inverse_rope ? &rope_ : nullptr;
      if (sinks_.contains(model)) {
        const auto& sk = sinks_.at(model);
        ro.sink.assign(sk.begin() + layer * c.heads_per_rank,
                       sk.begin() + (layer + 1) * c.heads_per_rank);
      }
      absl::StatusOr<StepResult> r =
          testing::Reference(*ref_backend_, c, layer, host_[{model, s->sequence, layer}], *s, ro);
      EXPECT_TRUE(r.ok()) << r.status();
      all.num_rows += r->num_rows;
      all.num_heads = r->num_heads;
      all.output_format = r->output_format;
      all.out.insert(all.out.end(), r->out.begin(), r->out.end());
      all.mx_scales.insert(all.mx_scales.end(), r->mx_scales.begin(), r->mx_scales.end());
      all.lse.insert(all.lse.end(), r->lse.begin(), r->lse.end());
    }
    return all;
  }

  void Mirror(const std::string& model, int32_t layer, const std::vector<const SpanData*>& spans) {
    for (const SpanData* s : spans) {
      testing::Apply(host_[{model, s->sequence, layer}], *s, FindProfile(model)->layers[layer]);
    }
  }

  static void ExpectSame(const StepResult& got, const StepResult& want, const std::string& what) {
    EXPECT_EQ(got.num_rows, want.num_rows) << what;
    EXPECT_EQ(got.num_heads, want.num_heads) << what;
    EXPECT_EQ(got.output_format, want.output_format) << what;
    EXPECT_TRUE(got.out == want.out) << what << ": outputs differ";
    EXPECT_TRUE(got.mx_scales == want.mx_scales) << what << ": MXFP8 scales differ";
    ASSERT_EQ(got.lse.size(), want.lse.size()) << what;
    if (!got.lse.empty()) {
      EXPECT_EQ(0, std::memcmp(got.lse.data(), want.lse.data(), got.lse.size() * 4)) << what;
    }
  }

  // Runs a step, mirrors its writes and checks the result bit for bit.
  void StepAndCheck(ServiceCore& core, const std::string& model, int32_t layer,
                    const std::vector<const SpanData*>& spans, const StepOptions& o = {}) {
    absl::StatusOr<StepResult> got = testing::RunStep(core, Request(model, layer, spans, o));
    ASSERT_TRUE(got.ok()) << got.status();
    Mirror(model, layer, spans);
    ExpectSame(
        *got, Expected(model, layer, spans, o),
        model + " layer " + std::to_string(layer) + " from " + std::to_string(spans[0]->first));
  }

  std::mt19937 rng_{20261130};
  std::unique_ptr<kernels::Backend> ref_backend_;
  std::map<std::string, ModelConfig> configs_;
  std::map<std::string, std::vector<float>> sinks_;
  std::map<std::tuple<std::string, std::string, int32_t>, HostLayer> host_;
  testing::RopeTable rope_ = testing::MakeRope(1024);
};

TEST_F(CoreTest, InfoDescribesModelsPoolsAndSequences) {
  auto core = Start({"dsv4.1-flash:tp=4:page_rows=16:pool_pages=32", "glm-5.2:tp=8:pool_pages=8"});
  ASSERT_NE(core, nullptr);
  ASSERT_TRUE(core->CreateSequence(kTenant, "glm-5.2", "s").ok());
  const ServerInfo info = core->Info();
  EXPECT_EQ(info.device.kind, kernels::BackendKind::kCpu);
  ASSERT_EQ(info.models.size(), 2u);
  EXPECT_EQ(info.models[0].profile, "dsv4.1-flash");
  EXPECT_EQ(info.models[0].heads_per_rank, 16);
  EXPECT_EQ(info.models[1].heads_per_rank, 8);
  EXPECT_EQ(info.models[1].kv_format, kernels::KvFormat::kFp8PerTensor);
  ASSERT_EQ(info.pools.size(), 2u);
  EXPECT_EQ(info.pools[0].pages_total, 32);
  EXPECT_EQ(info.pools[0].page_bytes,
            kernels::ServingPitch(kernels::KvFormat::kFp8Dsv4, kernels::Geometry::kRopeInside, 16));
  EXPECT_EQ(info.pools[1].pages_used, 0);
  EXPECT_EQ(info.sequences, 1);
  EXPECT_TRUE(core->Healthy());
}

TEST_F(CoreTest, SpeculativeDecodeWithRollbackMatchesTheReference) {
  const std::string model = "dsv4.1-flash";
  auto core = Start({"dsv4.1-flash:tp=8:page_rows=16:pool_pages=256"});
  ASSERT_NE(core, nullptr);
  ASSERT_TRUE(core->SetRopeTable(model, rope_.cos_sin, rope_.positions).ok());
  ASSERT_TRUE(core->CreateSequence(kTenant, model, "a").ok());
  ASSERT_TRUE(core->CreateSequence(kTenant, model, "b").ok());
  // SWA-only, top-k over 1/2, top-k over 1/1.
  for (int32_t layer : {0, 2, 20}) {
    SCOPED_TRACE(layer);
    SpanData pa = Span(model, layer, "a", 0, 100), pb = Span(model, layer, "b", 0, 37);
    StepAndCheck(*core, model, layer, {&pa, &pb});
    SpanData pa2 = Span(model, layer, "a", 100, 45);
    StepAndCheck(*core, model, layer, {&pa2}, {.want_lse = true});
    int64_t first_a = 145, first_b = 37;
    std::uniform_int_distribution<int> accept(0, 5);
    for (int step = 0; step < 6; ++step) {
      // 1 verified row + 5 drafts per sequence; the next step starts after the accepted ones,
      // replacing the rejected drafts.
      SpanData da = Span(model, layer, "a", first_a, 6), db = Span(model, layer, "b", first_b, 6);
      StepOptions o;
      if (step % 3 == 1) o = {.format = kernels::OutputFormat::kMxfp8, .inverse_rope = true};
      if (step % 3 == 2) o = {.want_lse = true, .inverse_rope = true};
      StepAndCheck(*core, model, layer, {&da, &db}, o);
      first_a += 1 + accept(rng_);
      first_b += 1 + accept(rng_);
      ASSERT_EQ(*core->SequenceLength(kTenant, model, "a", layer), da.first + 6);
    }
  }
  // An explicit truncate rolls back too: the next step continues from there.
  ASSERT_TRUE(core->TruncateSequence(kTenant, model, "a", 150).ok());
  EXPECT_EQ(*core->SequenceLength(kTenant, model, "a", 2), 150);
  EXPECT_EQ(*core->SequenceLength(kTenant, model, "a", 5), 0);  // never stepped
  for (int32_t layer : {0, 2, 20}) {
    SpanData t = Span(model, layer, "a", 150, 6);
    StepAndCheck(*core, model, layer, {&t});
  }
}

TEST_F(CoreTest, DenseCompressedLayerSeesEveryVisibleEntry) {
  const std::string model = "dsv4-flash";
  // swa_rollback=64: the rollback below goes back 53 positions.
  auto core = Start({"dsv4-flash:tp=8:page_rows=32:pool_pages=64:swa_rollback=64"});
  ASSERT_NE(core, nullptr);
  ASSERT_TRUE(core->CreateSequence(kTenant, model, "a").ok());
  // Layer 3: SWA + every entry of the 1/128 cache; layer 2: top-k of the 1/4 cache.
  for (int32_t layer : {3, 2}) {
    SpanData p = Span(model, layer, "a", 0, 300);
    StepAndCheck(*core, model, layer, {&p});
    SpanData d = Span(model, layer, "a", 300, 6);
    StepAndCheck(*core, model, layer, {&d}, {.want_lse = true});
    SpanData r = Span(model, layer, "a", 253, 6);  // rolls back across an entry boundary
    StepAndCheck(*core, model, layer, {&r});
  }
}

TEST_F(CoreTest, GlmChosenPositions) {
  auto core = Start({"glm-5.2:tp=8:page_rows=64:pool_pages=16:kv_scale=0.25",
                     "glm-5.3-flash:tp=4:kv=bf16:page_rows=8:pool_pages=64"});
  ASSERT_NE(core, nullptr);
  for (const std::string model : {"glm-5.2", "glm-5.3-flash"}) {
    SCOPED_TRACE(model);
    ASSERT_TRUE(core->CreateSequence(kTenant, model, "g").ok());
    SpanData p = Span(model, 0, "g", 0, 200, 64);
    StepAndCheck(*core, model, 0, {&p});
    SpanData d = Span(model, 0, "g", 200, 6, 64);
    StepAndCheck(*core, model, 0, {&d},
                 {.format = kernels::OutputFormat::kMxfp8, .want_lse = true});
    SpanData r = Span(model, 0, "g", 202, 6, 64);
    StepAndCheck(*core, model, 0, {&r});
  }
}

TEST_F(CoreTest, BatchedResultsEqualUnbatchedOnes) {
  const std::string model = "dsv4.1-flash";
  const std::string spec = "dsv4.1-flash:tp=8:page_rows=16:pool_pages=256";
  ControlledBackend* gate = nullptr;
  auto alone = Start({spec});
  auto batched = Start({spec}, Limits{}, &gate);
  ASSERT_TRUE(alone && batched);
  // Both cores get the same sinks.
  ASSERT_TRUE(alone->SetSinks(model, sinks_[model]).ok());
  constexpr int kSeqs = 6;
  constexpr int32_t kLayer = 2;
  std::vector<SpanData> prefill;
  for (int i = 0; i < kSeqs; ++i) {
    const std::string id = "s" + std::to_string(i);
    ASSERT_TRUE(alone->CreateSequence(kTenant, model, id).ok());
    ASSERT_TRUE(batched->CreateSequence(kTenant, model, id).ok());
    prefill.push_back(Span(model, kLayer, id, 0, 130 + 7 * i));
  }
  for (const SpanData& p : prefill) {
    ASSERT_TRUE(testing::RunStep(*alone, Request(model, kLayer, {&p})).ok());
    ASSERT_TRUE(testing::RunStep(*batched, Request(model, kLayer, {&p})).ok());
    Mirror(model, kLayer, {&p});
  }
  // Decode steps: one request per sequence, the last one with two spans.
  std::vector<SpanData> decode;
  for (int i = 0; i < kSeqs; ++i)
    decode.push_back(
        Span(model, kLayer, prefill[i].sequence, prefill[i].first + prefill[i].rows, 6));
  std::vector<std::vector<const SpanData*>> requests;
  for (int i = 0; i < kSeqs - 2; ++i) requests.push_back({&decode[i]});
  requests.push_back({&decode[kSeqs - 2], &decode[kSeqs - 1]});

  std::vector<StepResult> want;
  for (const auto& spans : requests) {
    absl::StatusOr<StepResult> r =
        testing::RunStep(*alone, Request(model, kLayer, spans, {.want_lse = true}));
    ASSERT_TRUE(r.ok()) << r.status();
    want.push_back(*r);
  }
  const CoreStats before = batched->Stats();
  // Hold the first launch in the backend so that the others queue behind it.
  gate->Close();
  std::vector<std::promise<absl::StatusOr<StepResult>>> promises(requests.size());
  auto submit = [&](size_t i) {
    batched->Submit(
        Request(model, kLayer, requests[i], {.want_lse = true}),
        [&promises, i](absl::StatusOr<StepResult> r) { promises[i].set_value(std::move(r)); });
  };
  submit(0);
  gate->WaitAttends(1 + kSeqs + 1);  // warm-up, prefills, this one
  for (size_t i = 1; i < requests.size(); ++i) submit(i);
  gate->Open();
  for (size_t i = 0; i < requests.size(); ++i) {
    absl::StatusOr<StepResult> got = promises[i].get_future().get();
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSame(*got, want[i], "request " + std::to_string(i));
    EXPECT_EQ(got->timings.batch_requests, i == 0 ? 1 : static_cast<int>(requests.size()) - 1);
    if (i > 0) {
      EXPECT_EQ(got->timings.batch_rows, 6 * (kSeqs - 1));
    }
  }
  const CoreStats after = batched->Stats();
  EXPECT_EQ(after.batches - before.batches, 2);
  EXPECT_EQ(after.batched_requests - before.batched_requests,
            static_cast<int64_t>(requests.size()));
  EXPECT_EQ(after.rows - before.rows, 6 * kSeqs);
  // And both equal the reference.
  for (const SpanData& d : decode) Mirror(model, kLayer, {&d});
  ExpectSame(want[0], Expected(model, kLayer, {&decode[0]}, {.want_lse = true}), "reference");
}

TEST_F(CoreTest, InvalidStepsChangeNothing) {
  const std::string model = "dsv4.1-flash";
  auto core = Start({"dsv4.1-flash:tp=8:page_rows=16:pool_pages=64"});
  ASSERT_NE(core, nullptr);
  ASSERT_TRUE(core->CreateSequence(kTenant, model, "a").ok());
  ASSERT_TRUE(core->CreateSequence("tenant-b", model, "b").ok());
  constexpr int32_t kLayer = 2;  // top-k over a 1/2 cache
  SpanData prefill = Span(model, kLayer, "a", 0, 140);
  StepAndCheck(*core, model, kLayer, {&prefill});
  const int64_t pages_before = core->Info().pools[0].pages_used;

  struct Case {
    std::string name;
    std::function<void(StepRequest&, SpanData&)> edit;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"short kv", [](StepRequest&, SpanData& s) { s.kv.resize(s.kv.size() - 1); },
       absl::StatusCode::kInvalidArgument,
       "spans[0].kv_rows: 6 rows x 1024 bytes expected, got 6142 bytes"},
      {"short q", [](StepRequest&, SpanData& s) { s.q.resize(10); },
       absl::StatusCode::kInvalidArgument, "spans[0].q: 6 rows x 8 heads x 1024 bytes expected"},
      {"compressed count", [](StepRequest&, SpanData& s) { s.compressed.resize(512); },
       absl::StatusCode::kInvalidArgument,
       "spans[0].compressed_rows: 3 entries x 1024 bytes expected (entries 70..72"},
      {"topk invisible", [](StepRequest&, SpanData& s) { s.topk[3 * 24 + 17] = 73; },
       absl::StatusCode::kInvalidArgument,
       "spans[0].topk[3][17]: entry 73 not visible at position 143 (sequence has 72 visible "
       "entries)"},
      {"topk negative", [](StepRequest&, SpanData& s) { s.topk[5] = -7; },
       absl::StatusCode::kInvalidArgument, "spans[0].topk[0][5]: entry -7 is invalid"},
      {"topk width", [](StepRequest& r, SpanData&) { r.spans[0].topk_width = 600; },
       absl::StatusCode::kInvalidArgument, "spans[0].topk_width: 600 outside [1, 512]"},
      {"nan kv", [](StepRequest&, SpanData& s) { s.kv[2 * 512 + 9] = 0x7fc0; },
       absl::StatusCode::kInvalidArgument, "spans[0].kv_rows[2][9]: nan"},
      {"inf compressed", [](StepRequest&, SpanData& s) { s.compressed[512 + 3] = 0xff80; },
       absl::StatusCode::kInvalidArgument, "spans[0].compressed_rows[1][3]: -inf"},
      {"roles", [](StepRequest& r, SpanData&) { r.spans[0].roles.assign(2, RowRole::kDraft); },
       absl::StatusCode::kInvalidArgument, "spans[0].roles: 2 roles for 6 rows"},
      {"gap", [](StepRequest& r, SpanData&) { r.spans[0].first_position = 141; },
       absl::StatusCode::kInvalidArgument,
       "spans[0].first_position 141 leaves a gap after stored length 140"},
      {"negative position", [](StepRequest& r, SpanData&) { r.spans[0].first_position = -1; },
       absl::StatusCode::kInvalidArgument, "spans[0].first_position: -1 is negative"},
      {"past the longest context",
       [](StepRequest& r, SpanData&) { r.spans[0].first_position = Limits{}.max_context - 5; },
       absl::StatusCode::kInvalidArgument, "exceed the longest context"},
      // first_position + num_rows does not fit in int64: the check must not wrap.
      {"position at the int64 limit",
       [](StepRequest& r, SpanData&) {
         r.spans[0].first_position = std::numeric_limits<int64_t>::max();
       },
       absl::StatusCode::kInvalidArgument, "exceed the longest context"},
      {"unknown sequence", [](StepRequest& r, SpanData&) { r.spans[0].sequence_id = "zz"; },
       absl::StatusCode::kNotFound, "spans[0].sequence_id: sequence 'zz'"},
      {"other tenant's sequence", [](StepRequest& r, SpanData&) { r.spans[0].sequence_id = "b"; },
       absl::StatusCode::kNotFound, "sequence 'b' of model dsv4.1-flash not found"},
      {"empty sequence id", [](StepRequest& r, SpanData&) { r.spans[0].sequence_id.clear(); },
       absl::StatusCode::kInvalidArgument, "spans[0].sequence_id: empty"},
      {"no rows", [](StepRequest& r, SpanData&) { r.spans[0].num_rows = 0; },
       absl::StatusCode::kInvalidArgument, "spans[0].num_rows: 0, must be positive"},
      {"repeated sequence", [](StepRequest& r, SpanData&) { r.spans.push_back(r.spans[0]); },
       absl::StatusCode::kInvalidArgument, "spans[1].sequence_id 'a' repeats spans[0]"},
      {"unknown model", [](StepRequest& r, SpanData&) { r.model = "gpt"; },
       absl::StatusCode::kNotFound, "model 'gpt' not found"},
      {"unknown layer", [](StepRequest& r, SpanData&) { r.layer = 40; },
       absl::StatusCode::kNotFound, "layer 40 not found"},
      {"no table", [](StepRequest& r, SpanData&) { r.inverse_rope = true; },
       absl::StatusCode::kFailedPrecondition, "no cos/sin table"},
      {"no spans", [](StepRequest& r, SpanData&) { r.spans.clear(); },
       absl::StatusCode::kInvalidArgument, "spans: a step needs at least one span"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SpanData s = Span(model, kLayer, "a", 140, 6);
    StepRequest r = Request(model, kLayer, {&s});
    c.edit(r, s);
    if (!r.spans.empty()) {  // the edit may have resized the data
      const SpanInput fresh = s.View();
      r.spans[0].kv_rows = fresh.kv_rows;
      r.spans[0].q = fresh.q;
      r.spans[0].compressed_rows = fresh.compressed_rows;
      r.spans[0].topk = s.topk;
    }
    absl::StatusOr<StepResult> got = testing::RunStep(*core, std::move(r));
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), c.code) << got.status();
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.message));
    EXPECT_EQ(*core->SequenceLength(kTenant, model, "a", kLayer), 140);
    EXPECT_EQ(core->Info().pools[0].pages_used, pages_before);
  }
  // Chosen entries on a layer without them, compressed rows on a layer without a cache.
  SpanData swa = Span(model, 0, "a", 0, 4);
  StepRequest r = Request(model, 0, {&swa});
  r.spans[0].topk = std::span<const int32_t>(prefill.topk.data(), 4);
  r.spans[0].topk_width = 1;
  absl::StatusOr<StepResult> got = testing::RunStep(*core, std::move(r));
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("takes no chosen entries"));
  r = Request(model, 0, {&swa});
  r.spans[0].compressed_rows = prefill.View().compressed_rows;
  got = testing::RunStep(*core, std::move(r));
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("has no compressed cache"));
  // The store is as it was: a valid step gives the reference answer.
  SpanData ok = Span(model, kLayer, "a", 140, 6);
  StepAndCheck(*core, model, kLayer, {&ok});
}

// The launch checks the inputs' contents while the device copies them: in a batch, a step with
// a chosen entry its row may not see, or a non-finite KV row, fails alone and changes nothing,
// and the other steps get their reference answers.
TEST_F(CoreTest, BadContentsFailOnlyTheirStepInABatch) {
  const std::string model = "dsv4.1-flash";
  ControlledBackend* gate = nullptr;
  auto core = Start({"dsv4.1-flash:tp=8:page_rows=16:pool_pages=256"}, Limits{}, &gate);
  ASSERT_NE(core, nullptr);
  constexpr int32_t kLayer = 2;  // top-k over a 1/2 cache
  constexpr int kSeqs = 4;
  for (int i = 0; i < kSeqs; ++i) {
    const std::string id = "s" + std::to_string(i);
    ASSERT_TRUE(core->CreateSequence(kTenant, model, id).ok());
    SpanData prefill = Span(model, kLayer, id, 0, 140);
    StepAndCheck(*core, model, kLayer, {&prefill});
  }
  std::vector<SpanData> decode;
  for (int i = 0; i < kSeqs; ++i) {
    decode.push_back(Span(model, kLayer, "s" + std::to_string(i), 140, 6));
  }
  SpanData bad_id = decode[1];
  bad_id.topk[3 * 24 + 17] = 73;  // row 3 sits at position 143: 72 entries visible
  SpanData bad_row = decode[2];
  bad_row.kv[2 * 512 + 9] = 0x7fc0;  // a NaN

  gate->Close();  // the first step holds the backend so that the others batch behind it
  std::vector<std::promise<absl::StatusOr<StepResult>>> promises(kSeqs);
  const SpanData* sent[kSeqs] = {&decode[0], &bad_id, &bad_row, &decode[3]};
  auto submit = [&](int i) {
    core->Submit(Request(model, kLayer, {sent[i]}), [&promises, i](absl::StatusOr<StepResult> r) {
      promises[i].set_value(std::move(r));
    });
  };
  submit(0);
  gate->WaitAttends(1 + kSeqs + 1);  // warm-up, prefills, this one
  for (int i = 1; i < kSeqs; ++i) submit(i);
  gate->Open();
  std::vector<absl::StatusOr<StepResult>> got;
  for (auto& p : promises) got.push_back(p.get_future().get());
  EXPECT_EQ(got[1].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got[1].status().message()),
              HasSubstr("spans[0].topk[3][17]: entry 73 not visible at position 143 (sequence "
                        "has 72 visible entries)"));
  EXPECT_EQ(got[2].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got[2].status().message()),
              HasSubstr("spans[0].kv_rows[2][9]: nan (KV rows must be finite)"));
  EXPECT_EQ(*core->SequenceLength(kTenant, model, "s1", kLayer), 140);
  EXPECT_EQ(*core->SequenceLength(kTenant, model, "s2", kLayer), 140);
  for (int i : {0, 3}) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    Mirror(model, kLayer, {&decode[i]});
    ExpectSame(*got[i], Expected(model, kLayer, {&decode[i]}, {}), "step " + std::to_string(i));
    EXPECT_EQ(*core->SequenceLength(kTenant, model, decode[i].sequence, kLayer), 146);
  }
  // The failed sequences go on from where they were.
  for (int i : {1, 2}) StepAndCheck(*core, model, kLayer, {&decode[i]});
  // A rewrite of committed positions (137..142 of s0, stored up to 146) with an inf is refused,
  // and the stored rows it overwrote are put back: the next step, which sees those positions in
  // its window, gets the reference answer.
  SpanData rewrite = Span(model, kLayer, "s0", 137, 6);
  rewrite.kv[4 * 512 + 1] = 0x7f80;  // +inf
  absl::StatusOr<StepResult> refused = testing::RunStep(*core, Request(model, kLayer, {&rewrite}));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("spans[0].kv_rows[4][1]: inf"));
  EXPECT_EQ(*core->SequenceLength(kTenant, model, "s0", kLayer), 146);
  SpanData next = Span(model, kLayer, "s0", 146, 6);
  StepAndCheck(*core, model, kLayer, {&next});
}

// KV values are accepted up to |x| <= 2^64 (kernels::kKvMaxLog2): past it a finite bf16 value
// could decode to inf in an fp8 pool (3.3e38 rounds to 2^128 in fp8_dsv4) or sum past f32, so
// a row with one is refused naming the tensor, row, column, value and bound, and the step
// changes nothing; values at the bound are served like any other.
TEST_F(CoreTest, KvValuesPastTheAcceptedMagnitudeAreRefused) {
  const std::string model = "dsv4.1-flash";
  auto core = Start({"dsv4.1-flash:tp=8:page_rows=16:pool_pages=64"});
  ASSERT_NE(core, nullptr);
  constexpr int32_t kLayer = 2;  // top-k over a 1/2 cache: KV and compressed rows
  ASSERT_TRUE(core->CreateSequence(kTenant, model, "s").ok());
  SpanData prefill = Span(model, kLayer, "s", 0, 40);
  StepAndCheck(*core, model, kLayer, {&prefill});

  SpanData huge = Span(model, kLayer, "s", 40, 4);
  huge.kv[1 * 512 + 300] = 0x7f78;  // 3.296e38, finite
  absl::StatusOr<StepResult> r = testing::RunStep(*core, Request(model, kLayer, {&huge}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("spans[0].kv_rows[1][300]: 3.29649e+38 (KV values must satisfy |x| <= "
                        "2^64 = 1.84467e+19)"));
  SpanData past = Span(model, kLayer, "s", 40, 4);
  ASSERT_EQ(past.compressed.size(), 2u * 512);
  past.compressed[512 + 5] = 0xdf81;  // -(2^64 + one bf16 step)
  r = testing::RunStep(*core, Request(model, kLayer, {&past}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("spans[0].compressed_rows[1][5]: -1.85909e+19 (KV values must satisfy"));
  EXPECT_EQ(*core->SequenceLength(kTenant, model, "s", kLayer), 40);

  SpanData edge = Span(model, kLayer, "s", 40, 4);
  edge.kv[2 * 512 + 7] = 0x5f80;          // 2^64
  edge.kv[3 * 512 + 500] = 0xdf80;        // -2^64, a rope lane
  edge.compressed[0 * 512 + 9] = 0x5f80;  // 2^64
  StepAndCheck(*core, model, kLayer, {&edge}, {.want_lse = true});
  EXPECT_EQ(*core->SequenceLength(kTenant, model, "s", kLayer), 44);
}

TEST_F(CoreTest, PoolFilledExactlyThenOnePageMore) {
  const std::string model = "glm-5.3-flash";
  auto core = Start({"glm-5.3-flash:tp=8:page_rows=16:pool_pages=4"});  // 64 positions
  ASSERT_NE(core, nullptr);
  ASSERT_TRUE(core->CreateSequence(kTenant, model, "a").ok());
  ASSERT_TRUE(core->CreateSequence(kTenant, model, "b").ok());
  SpanData fill = Span(model, 0, "a", 0, 60, 16);
  StepAndCheck(*core, model, 0, {&fill});
  SpanData last = Span(model, 0, "a", 60, 4, 16);
  StepAndCheck(*core, model, 0, {&last});
  EXPECT_EQ(core->Info().pools[0].pages_used, 4);
  // One page more: refused, nothing written, for both spans of the request.
  SpanData more = Span(model, 0, "a", 64, 1, 16), other = Span(model, 0, "b", 0, 1, 1);
  absl::StatusOr<StepResult> got = testing::RunStep(*core, Request(model, 0, {&other, &more}));
  ASSERT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("needs 2 new pages, 0 of 4 are free"));
  EXPECT_EQ(*core->SequenceLength(kTenant, model, "a", 0), 64);
  EXPECT_EQ(*core->SequenceLength(kTenant, model, "b", 0), 0);
  EXPECT_EQ(core->Info().pools[0].pages_used, 4);
  // Rewriting stored positions needs no page; releasing frees them all.
  SpanData redo = Span(model, 0, "a", 58, 6, 16);
  StepAndCheck(*core, model, 0, {&redo});
  ASSERT_TRUE(core->ReleaseSequence(kTenant, model, "a").ok());
  EXPECT_EQ(core->Info().pools[0].pages_used, 0);
  SpanData b0 = Span(model, 0, "b", 0, 5, 4);
  StepAndCheck(*core, model, 0, {&b0});
}

TEST_F(CoreTest, QueueFullCancelAndDeadlineWhileQueued) {
  const std::string model = "glm-5.3-flash";
  Limits limits;
  limits.max_queued_requests = 2;
  ControlledBackend* gate = nullptr;
  auto core = Start({"glm-5.3-flash:tp=8:page_rows=16:pool_pages=16"}, limits, &gate);
  ASSERT_NE(core, nullptr);
  for (const char* id : {"a", "b", "c", "d"})
    ASSERT_TRUE(core->CreateSequence(kTenant, model, id).ok());
  SpanData sa = Span(model, 0, "a", 0, 3, 4), sb = Span(model, 0, "b", 0, 3, 4),
           sc = Span(model, 0, "c", 0, 3, 4), sd = Span(model, 0, "d", 0, 3, 4);
  gate->Close();
  std::promise<absl::StatusOr<StepResult>> pa, pb, pc, pd;
  auto to = [](std::promise<absl::StatusOr<StepResult>>& p) {
    return [&p](absl::StatusOr<StepResult> r) { p.set_value(std::move(r)); };
  };
  core->Submit(Request(model, 0, {&sa}), to(pa));
  gate->WaitAttends(2);  // warm-up + a
  StepRequest rb = Request(model, 0, {&sb});
  rb.cancelled = std::make_shared<std::atomic<bool>>(false);
  CancelFlag cancel_b = rb.cancelled;
  core->Submit(std::move(rb), to(pb));
  StepRequest rc = Request(model, 0, {&sc});
  rc.deadline = absl::Now() + absl::Milliseconds(50);
  core->Submit(std::move(rc), to(pc));
  // The queue holds 2 steps: one more is refused at once.
  core->Submit(Request(model, 0, {&sd}), to(pd));
  absl::StatusOr<StepResult> rd = pd.get_future().get();
  EXPECT_EQ(rd.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(core->Stats().queue_depth, 2);
  cancel_b->store(true);
  absl::SleepFor(absl::Milliseconds(80));
  gate->Open();
  ASSERT_TRUE(pa.get_future().get().ok());
  EXPECT_EQ(pb.get_future().get().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(pc.get_future().get().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*core->SequenceLength(kTenant, model, "a", 0), 3);
  for (const char* id : {"b", "c", "d"}) EXPECT_EQ(*core->SequenceLength(kTenant, model, id, 0), 0);
}

TEST_F(CoreTest, DrainFinishesQueuedWork) {
  const std::string model = "glm-5.3-flash";
  ControlledBackend* gate = nullptr;
  auto core = Start({"glm-5.3-flash:tp=8:page_rows=16:pool_pages=16"}, Limits{}, &gate);
  ASSERT_NE(core, nullptr);
  std::vector<SpanData> spans;
  for (int i = 0; i < 3; ++i) {
    const std::string id = "s" + std::to_string(i);
    ASSERT_TRUE(core->CreateSequence(kTenant, model, id).ok());
    spans.push_back(Span(model, 0, id, 0, 4, 4));
  }
  gate->Close();
  std::vector<std::promise<absl::StatusOr<StepResult>>> done(3);
  for (int i = 0; i < 3; ++i) {
    core->Submit(Request(model, 0, {&spans[i]}),
                 [&done, i](absl::StatusOr<StepResult> r) { done[i].set_value(std::move(r)); });
    if (i == 0) gate->WaitAttends(2);
  }
  std::thread drainer([&] { core->Drain(); });
  absl::SleepFor(absl::Milliseconds(20));
  std::promise<absl::StatusOr<StepResult>> late;
  core->Submit(Request(model, 0, {&spans[0]}),
               [&late](absl::StatusOr<StepResult> r) { late.set_value(std::move(r)); });
  EXPECT_EQ(late.get_future().get().status().code(), absl::StatusCode::kUnavailable);
  gate->Open();
  drainer.join();
  for (int i = 0; i < 3; ++i) {
    auto f = done[i].get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::ready);
    absl::StatusOr<StepResult> r = f.get();
    ASSERT_TRUE(r.ok()) << r.status();
    Mirror(model, 0, {&spans[i]});
    ExpectSame(*r, Expected(model, 0, {&spans[i]}, {}), "drained step");
  }
}

TEST_F(CoreTest, BackendFailureFailsTheBatchAndTurnsUnhealthy) {
  const std::string model = "glm-5.3-flash";
  ControlledBackend* backend = nullptr;
  auto core = Start({"glm-5.3-flash:tp=8:page_rows=16:pool_pages=16"}, Limits{}, &backend);
  ASSERT_NE(core, nullptr);
  ASSERT_TRUE(core->CreateSequence(kTenant, model, "a").ok());
  SpanData s = Span(model, 0, "a", 0, 20, 4);
  StepAndCheck(*core, model, 0, {&s});
  const int64_t used = core->Info().pools[0].pages_used;
  backend->FailAttends(true);
  SpanData t = Span(model, 0, "a", 20, 20, 4);
  absl::StatusOr<StepResult> got = testing::RunStep(*core, Request(model, 0, {&t}));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("injected device failure"));
  EXPECT_FALSE(core->Healthy());
  EXPECT_EQ(*core->SequenceLength(kTenant, model, "a", 0), 20);
  EXPECT_EQ(core->Info().pools[0].pages_used, used);
  backend->FailAttends(false);
  got = testing::RunStep(*core, Request(model, 0, {&t}));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(CoreTest, SinksAndRopeTablePreconditions) {
  auto core = Start({"dsv4.1-flash:tp=8:page_rows=16:pool_pages=16", "glm-5.2:tp=8:pool_pages=4"},
                    Limits{}, nullptr, /*upload_sinks=*/false);
  ASSERT_NE(core, nullptr);
  const std::string model = "dsv4.1-flash";
  ASSERT_TRUE(core->CreateSequence(kTenant, model, "a").ok());
  SpanData s = Span(model, 0, "a", 0, 4);
  absl::StatusOr<StepResult> got = testing::RunStep(*core, Request(model, 0, {&s}));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("SetSinks"));

  std::vector<float> sinks(40 * 8, 0.5f);
  EXPECT_EQ(core->SetSinks(model, std::span<const float>(sinks.data(), 10)).code(),
            absl::StatusCode::kInvalidArgument);
  sinks[17] = std::nanf("");
  absl::Status bad = core->SetSinks(model, sinks);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("sinks[2][1]"));
  sinks[17] = 0.5f;
  EXPECT_TRUE(core->SetSinks(model, sinks).ok());
  EXPECT_EQ(core->SetSinks("glm-5.2", sinks).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core->SetSinks("nope", sinks).code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(core->SetRopeTable("glm-5.2", rope_.cos_sin, rope_.positions).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core->SetRopeTable(model, rope_.cos_sin, rope_.positions + 1).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(
      core->SetRopeTable(model, std::span<const float>(rope_.cos_sin.data(), 64 * 3), 3).ok());
  StepRequest r = Request(model, 0, {&s}, {.inverse_rope = true});
  got = testing::RunStep(*core, std::move(r));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("spans[0] row 3: position 3 outside the cos/sin table (3 positions)"));

  SpanData g = Span("glm-5.2", 0, "g", 0, 4, 4);
  ASSERT_TRUE(core->CreateSequence(kTenant, "glm-5.2", "g").ok());
  got = testing::RunStep(*core, Request("glm-5.2", 0, {&g}, {.inverse_rope = true}));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("applies only to rope_inside"));
}

TEST_F(CoreTest, PipelinedStepsOfOneSequenceApplyInOrder) {
  // Steps t and t+1 of one sequence submitted without waiting: the second is checked against
  // the stored length when it is launched, after the first has been applied.
  const std::string model = "glm-5.2";
  auto core = Start({"glm-5.2:tp=8:page_rows=16:pool_pages=32"});
  ASSERT_NE(core, nullptr);
  ASSERT_TRUE(core->CreateSequence(kTenant, model, "p").ok());
  SpanData s0 = Span(model, 3, "p", 0, 40, 8), s1 = Span(model, 3, "p", 40, 6, 8),
           s2 = Span(model, 3, "p", 44, 6, 8);
  std::vector<std::promise<absl::StatusOr<StepResult>>> done(3);
  const std::vector<const SpanData*> spans = {&s0, &s1, &s2};
  for (int i = 0; i < 3; ++i) {
    core->Submit(Request(model, 3, {spans[i]}),
                 [&done, i](absl::StatusOr<StepResult> r) { done[i].set_value(std::move(r)); });
  }
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<StepResult> r = done[i].get_future().get();
    ASSERT_TRUE(r.ok()) << r.status();
    Mirror(model, 3, {spans[i]});
    ExpectSame(*r, Expected(model, 3, {spans[i]}, {}), "pipelined step " + std::to_string(i));
  }
  EXPECT_EQ(*core->SequenceLength(kTenant, model, "p", 3), 50);
  // The example of docs/architecture.md's error table, on 576-wide rows.
  SpanData bad = Span(model, 3, "p", 50, 5, 8);
  StepRequest r = Request(model, 3, {&bad});
  r.spans[0].kv_rows = r.spans[0].kv_rows.subspan(0, 5000);
  absl::StatusOr<StepResult> got = testing::RunStep(*core, std::move(r));
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("spans[0].kv_rows: 5 rows x 1152 bytes expected, got 5000 bytes"));
}

TEST_F(CoreTest, ReleaseWaitsForTheRunningBatch) {
  // A sequence released while its step runs keeps its pages until the launch is done, so no
  // other step can be handed (and overwrite) a page the running launch reads.
  const std::string model = "glm-5.3-flash";
  ControlledBackend* gate = nullptr;
  auto core = Start({"glm-5.3-flash:tp=8:page_rows=16:pool_pages=4"}, Limits{}, &gate);
  ASSERT_NE(core, nullptr);
  ASSERT_TRUE(core->CreateSequence(kTenant, model, "a").ok());
  SpanData s = Span(model, 0, "a", 0, 48, 8);
  gate->Close();
  std::promise<absl::StatusOr<StepResult>> done;
  core->Submit(Request(model, 0, {&s}),
               [&done](absl::StatusOr<StepResult> r) { done.set_value(std::move(r)); });
  gate->WaitAttends(2);  // warm-up + the step
  std::atomic<bool> released{false};
  std::thread releaser([&] {
    EXPECT_TRUE(core->ReleaseSequence(kTenant, model, "a").ok());
    released = true;
  });
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_FALSE(released.load());
  EXPECT_EQ(core->Info().pools[0].pages_used, 3);
  gate->Open();
  releaser.join();
  absl::StatusOr<StepResult> r = done.get_future().get();
  ASSERT_TRUE(r.ok()) << r.status();
  Mirror(model, 0, {&s});
  ExpectSame(*r, Expected(model, 0, {&s}, {}), "step of a sequence released meanwhile");
  EXPECT_EQ(core->Info().pools[0].pages_used, 0);
  EXPECT_EQ(core->Info().sequences, 0);
}

TEST_F(CoreTest, CreateRejectsBadConfigurations) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> cpu =
      kernels::CreateCpuBackend({.cpu_threads = 1});
  ASSERT_TRUE(cpu.ok());
  ServerConfig config;
  EXPECT_EQ(ServiceCore::Create(config, *std::move(cpu)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelConfig m;
  m.profile = "glm-5.2";
  m.kv_format = kernels::KvFormat::kFp8Dsv4;  // cannot store 576-wide rows
  m.pool_pages = 4;
  config.models = {m};
  cpu = kernels::CreateCpuBackend({.cpu_threads = 1});
  absl::StatusOr<std::unique_ptr<ServiceCore>> core = ServiceCore::Create(config, *std::move(cpu));
  EXPECT_EQ(core.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(core.status().message()), HasSubstr("cannot store rope_appended rows"));
  m.kv_format = kernels::KvFormat::kFp8PerTensor;
  config.models = {m, m};
  cpu = kernels::CreateCpuBackend({.cpu_threads = 1});
  core = ServiceCore::Create(config, *std::move(cpu));
  EXPECT_THAT(std::string(core.status().message()), HasSubstr("configured twice"));
}

}  // namespace
}  // namespace smla::server
