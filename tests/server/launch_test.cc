// The executor's launch seen from outside: its timings (device time, attention, host prep) and
// where it copies inputs from. A wrapper of the CPU backend stands in for a GPU backend that
// has page-locked memory, so the executor copies registered inputs straight from the caller's
// memory (one copy per contiguous range) and gathers the others into its arena; the outputs
// are the same bit for bit either way.
#include <cstring>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "core_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "smla/kernels/cpu_backend.h"
#include "smla/server/model_profile.h"
#include "smla/server/service_core.h"
#include "smla/server/step_executor.h"

namespace smla::server {
namespace {

using testing::SpanData;

constexpr char kTenant[] = "t";
constexpr char kModel[] = "dsv4.1-flash";
constexpr int32_t kLayer = 20;  // SWA 128 + top-512 of the 1/1 cache

// The CPU backend with "page-locked" host memory, recording the sources of copies to the
// device that the executor batches.
class PinningBackend : public testing::ControlledBackend {
 public:
  explicit PinningBackend(std::unique_ptr<kernels::Backend> inner)
      : ControlledBackend(std::move(inner)) {}

  absl::StatusOr<kernels::Buffer> AllocateHost(size_t bytes) override {
    absl::StatusOr<kernels::Buffer> b = Allocate(bytes);
    if (b.ok()) {
      absl::MutexLock lock(&mu_);
      arena_ = {b->as<uint8_t>(), bytes};
    }
    return b;
  }
  absl::Status CopyBatch(std::span<const kernels::CopyOp> copies, kernels::CopyDirection d,
                         kernels::Stream& s) override {
    {
      absl::MutexLock lock(&mu_);
      batching_ = true;
    }
    absl::Status st = kernels::Backend::CopyBatch(copies, d, s);
    absl::MutexLock lock(&mu_);
    batching_ = false;
    if (d == kernels::CopyDirection::kToDevice) {
      to_device_.assign(copies.begin(), copies.end());
      if (poison_) Poison(copies);
    }
    if (d == kernels::CopyDirection::kOnDevice) {
      for (const kernels::CopyOp& c : copies) {
        if (InArena(c.src)) {
          upload_bytes_ = c.bytes;  // the launch's arrays, read in the page-locked arena
        } else {
          on_device_.push_back(c);
        }
      }
    }
    return st;
  }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes, kernels::Stream& s) override {
    {
      absl::MutexLock lock(&mu_);
      if (InArena(src) && !batching_) ++engine_uploads_;
    }
    return ControlledBackend::CopyToDevice(dst, src, bytes, s);
  }
  // Single copies from the arena outside a batch: uploads a copy engine would run.
  int engine_uploads() {
    absl::MutexLock lock(&mu_);
    return engine_uploads_;
  }
  // The bytes of the last copy within the device from the arena: the launch's one upload of
  // its arrays, which the device reads in the page-locked arena.
  size_t last_upload_bytes() {
    absl::MutexLock lock(&mu_);
    return upload_bytes_;
  }
  // Every copy within the device since the last call (inputs and outputs of a GPU region).
  std::vector<kernels::CopyOp> take_on_device() {
    absl::MutexLock lock(&mu_);
    return std::exchange(on_device_, {});
  }
  // Once the input copies are enqueued, fills every byte of the page-locked arena that they do
  // not read: a launch that built anything there before its input copies loses it.
  void set_poison(bool on) {
    absl::MutexLock lock(&mu_);
    poison_ = on;
  }
  // The last batch of copies to the device since the last call (none: empty).
  std::vector<kernels::CopyOp> take_to_device() {
    absl::MutexLock lock(&mu_);
    return std::exchange(to_device_, {});
  }
  absl::Status Attend(const kernels::AttendParams& p, kernels::Stream& s) override {
    {
      absl::MutexLock lock(&mu_);
      rows_per_group_ = p.rows_per_group;
    }
    return ControlledBackend::Attend(p, s);
  }
  int32_t last_rows_per_group() {
    absl::MutexLock lock(&mu_);
    return rows_per_group_;
  }
  absl::Status CheckInputs(const kernels::CheckInputsParams& p, kernels::Stream& s) override {
    absl::Cleanup after = [this] {
      absl::MutexLock lock(&mu_);
      if (after_checks_) after_checks_();
    };
    {
      absl::MutexLock lock(&mu_);
      block_writes_.push_back(p.entries.num_block_writes);
      for (int32_t r = 0; r < p.num_ranges; ++r) {
        const kernels::CheckRange& c = p.ranges[r];
        if (c.copy_to != nullptr && c.bytes > 0) {
          checked_copies_.push_back({c.copy_to, c.data, static_cast<size_t>(c.bytes)});
        }
      }
      for (int32_t r = 0; r < p.entries.num_rows; ++r) {
        const kernels::TranslateRow& t = p.entries.rows[r];
        if (t.seen != nullptr && t.width > 0) {
          checked_copies_.push_back({t.seen, t.ids, t.width * sizeof(int32_t)});
        }
      }
      const kernels::RowWrites& w = p.rows;
      const int width = kernels::QkWidth(w.cache.geometry);
      for (int32_t r = 0; r < w.num_rows; ++r) {
        uint16_t* copy = w.copies + int64_t{r} * width;
        if (w.rows[r].from != copy) {
          checked_copies_.push_back({copy, w.rows[r].from, size_t{2} * width});
        }
      }
    }
    return ControlledBackend::CheckInputs(p, s);
  }
  // Runs after every CheckInputs: a client rewriting its region once the device has read it.
  void set_after_checks(std::function<void()> f) {
    absl::MutexLock lock(&mu_);
    after_checks_ = std::move(f);
  }
  // Every copy the checks made as they read (CheckRange::copy_to, TranslateRow::seen, the rows
  // RowWrites reads elsewhere) since the last call.
  std::vector<kernels::CopyOp> take_checked_copies() {
    absl::MutexLock lock(&mu_);
    return std::exchange(checked_copies_, {});
  }
  // The table blocks each launch's checks wrote into the device's copy of the tables.
  std::vector<int32_t> take_block_writes() {
    absl::MutexLock lock(&mu_);
    return std::exchange(block_writes_, {});
  }

 private:
  bool InArena(const void* p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto* b = static_cast<const uint8_t*>(p);
    return b >= arena_.data() && b < arena_.data() + arena_.size();
  }
  void Poison(std::span<const kernels::CopyOp> copies) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<bool> read(arena_.size(), false);
    for (const kernels::CopyOp& c : copies) {
      if (!InArena(c.src)) continue;
      const size_t at = static_cast<size_t>(static_cast<const uint8_t*>(c.src) - arena_.data());
      for (size_t i = 0; i < c.bytes; ++i) read[at + i] = true;
    }
    for (size_t i = 0; i < arena_.size(); ++i) {
      if (!read[i]) arena_[i] = 0xee;
    }
  }

  absl::Mutex mu_;
  std::vector<kernels::CopyOp> to_device_ ABSL_GUARDED_BY(mu_);
  std::vector<kernels::CopyOp> on_device_ ABSL_GUARDED_BY(mu_);
  std::span<uint8_t> arena_ ABSL_GUARDED_BY(mu_);
  bool poison_ ABSL_GUARDED_BY(mu_) = false;
  int32_t rows_per_group_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int32_t> block_writes_ ABSL_GUARDED_BY(mu_);
  std::vector<kernels::CopyOp> checked_copies_ ABSL_GUARDED_BY(mu_);
  std::function<void()> after_checks_ ABSL_GUARDED_BY(mu_);
  size_t upload_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int engine_uploads_ ABSL_GUARDED_BY(mu_) = 0;
  bool batching_ ABSL_GUARDED_BY(mu_) = false;  // inside CopyBatch
};

struct Core {
  std::unique_ptr<ServiceCore> core;
  PinningBackend* backend = nullptr;
};

Core Start(bool pinning, int32_t phase_timings_every = 1) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> cpu =
      kernels::CreateCpuBackend({.cpu_threads = 2});
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  Core c;
  std::unique_ptr<kernels::Backend> backend;
  if (pinning) {
    auto p = std::make_unique<PinningBackend>(*std::move(cpu));
    c.backend = p.get();
    backend = std::move(p);
  } else {
    backend = *std::move(cpu);
  }
  ServerConfig config;
  config.phase_timings_every = phase_timings_every;
  absl::StatusOr<ModelConfig> m = ParseModelConfig("dsv4.1-flash:tp=4:page_rows=16:pool_pages=512");
  EXPECT_TRUE(m.ok()) << m.status();
  config.models.push_back(*m);
  absl::StatusOr<std::unique_ptr<ServiceCore>> core =
      ServiceCore::Create(config, std::move(backend));
  EXPECT_TRUE(core.ok()) << core.status();
  c.core = *std::move(core);
  const ModelProfile& p = *FindProfile(kModel);
  if (p.has_sink) {
    std::vector<float> sinks(size_t{static_cast<size_t>(p.num_layers())} * 16, 0.25f);
    EXPECT_TRUE(c.core->SetSinks(kModel, sinks).ok());
  }
  return c;
}

// Two sequences with some context, then one decode step over both whose tensors of each kind
// lie back to back in one buffer (as a packed shared-memory request's do).
class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ModelProfile& p = *FindProfile(kModel);
    for (const char* seq : {"a", "b"}) {
      prefill_.push_back(testing::MakeSpan(rng_, p, kLayer, 16, seq, 0, 150, 512));
    }
    for (int i = 0; i < 2; ++i) {
      decode_.push_back(testing::MakeSpan(rng_, p, kLayer, 16, prefill_[i].sequence, 150, 6, 512));
    }
    // One buffer: all q, then all KV rows, then all compressed entries, then all top-k ids.
    for (const SpanData& s : decode_) Append(s.q);
    for (const SpanData& s : decode_) Append(s.kv);
    for (const SpanData& s : decode_) Append(s.compressed);
    for (const SpanData& s : decode_) Append(s.topk);
  }

  template <typename T>
  void Append(const std::vector<T>& v) {
    const size_t at = region_.size();
    region_.resize(at + v.size() * sizeof(T));
    std::memcpy(region_.data() + at, v.data(), v.size() * sizeof(T));
  }

  StepRequest Request(const std::vector<SpanData>& spans, bool from_region) {
    StepRequest r;
    r.tenant = std::string(kTenant);
    r.model = std::string(kModel);
    r.model_index = 0;
    r.layer = kLayer;
    r.output_format = kernels::OutputFormat::kMxfp8;
    r.want_lse = true;
    size_t q_at = 0, kv_at = 0, c_at = 0, t_at = 0;
    for (const SpanData& s : spans) kv_at += s.q.size() * 2;
    c_at = kv_at;
    for (const SpanData& s : spans) c_at += s.kv.size() * 2;
    t_at = c_at;
    for (const SpanData& s : spans) t_at += s.compressed.size() * 2;
    for (const SpanData& s : spans) {
      SpanInput in = s.View();
      if (from_region) {
        in.q = {region_.data() + q_at, s.q.size() * 2};
        in.kv_rows = {region_.data() + kv_at, s.kv.size() * 2};
        in.compressed_rows = {region_.data() + c_at, s.compressed.size() * 2};
        in.topk = {reinterpret_cast<const int32_t*>(region_.data() + t_at), s.topk.size()};
        t_at += s.topk.size() * 4;
        q_at += s.q.size() * 2;
        kv_at += s.kv.size() * 2;
        c_at += s.compressed.size() * 2;
      }
      r.spans.push_back(in);
    }
    return r;
  }

  StepResult Run(ServiceCore& core, bool from_region) {
    for (const SpanData& s : prefill_) {
      EXPECT_TRUE(core.CreateSequence(kTenant, kModel, s.sequence).ok());
    }
    absl::StatusOr<StepResult> pre = testing::RunStep(core, Request(prefill_, false));
    EXPECT_TRUE(pre.ok()) << pre.status();
    absl::StatusOr<StepResult> got = testing::RunStep(core, Request(decode_, from_region));
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? *std::move(got) : StepResult();
  }

  // The executor alone over a PinningBackend, the fixture's sequences pre-filled, so that its
  // copy paths and checks can be read.
  struct Direct {
    std::unique_ptr<PinningBackend> backend;
    std::unique_ptr<ModelRuntime> model;
    std::unique_ptr<StepExecutor> executor;
  };
  // With `region_on_device`, the fixture's region is registered as a GPU region's memory.
  void StartDirect(Direct& d, bool region_on_device = false) {
    absl::StatusOr<std::unique_ptr<kernels::Backend>> cpu =
        kernels::CreateCpuBackend({.cpu_threads = 2});
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    d.backend = std::make_unique<PinningBackend>(*std::move(cpu));
    absl::StatusOr<ModelConfig> config =
        ParseModelConfig("dsv4.1-flash:tp=4:page_rows=16:pool_pages=512");
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<std::unique_ptr<KvStore>> store = KvStore::Create(*config, *d.backend, 8);
    ASSERT_TRUE(store.ok()) << store.status();
    d.model = std::make_unique<ModelRuntime>(0, *config, *std::move(store));
    absl::StatusOr<std::unique_ptr<StepExecutor>> executor =
        StepExecutor::Create(*d.backend, {d.model.get()});
    ASSERT_TRUE(executor.ok()) << executor.status();
    d.executor = *std::move(executor);
    for (const SpanData& s : prefill_) {
      ASSERT_TRUE(d.model->store().CreateSequence(kTenant, s.sequence).ok());
    }
    const StepRequest pre = Request(prefill_, false);
    ASSERT_TRUE(d.executor->RunBatch({std::vector<const StepRequest*>{&pre}})[0].ok());
    if (region_on_device) {
      d.executor->host_ranges().Add(region_.data(), region_.size(), HostRanges::Kind::kDevice);
    }
  }

  // Truncates the decode spans' sequences back to their first positions, so that the same
  // decode step can run again.
  absl::Status Rewind(KvStore& store) const {
    for (const SpanData& s : decode_) {
      if (absl::Status st = store.Truncate(kTenant, s.sequence, s.first); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  bool InRegion(const void* p) const {
    const auto* b = static_cast<const uint8_t*>(p);
    return b >= region_.data() && b < region_.data() + region_.size();
  }

  std::mt19937 rng_{7};
  std::vector<SpanData> prefill_, decode_;
  std::vector<uint8_t> region_;
};

TEST_F(LaunchTest, TimingsArePresentAndConsistent) {
  Core c = Start(false);
  const StepResult r = Run(*c.core, true);
  const StepTimings& t = r.timings;
  EXPECT_TRUE(t.phases);
  EXPECT_GT(t.kernel, absl::ZeroDuration());
  EXPECT_GT(t.attend, absl::ZeroDuration());
  EXPECT_LE(t.attend, t.kernel);
  EXPECT_GT(t.prep, absl::ZeroDuration());
  // The batch holds page reservations, prep, device work and commits.
  EXPECT_LE(t.prep + t.kernel, t.batch);
  // Copies in, row writes + attention, copies out: consecutive parts of the device time.
  EXPECT_GT(t.copy_in, absl::ZeroDuration());
  EXPECT_GT(t.copy_out, absl::ZeroDuration());
  EXPECT_LE(t.copy_in + t.attend + t.copy_out, t.kernel);
}

// The attention's and the output copies' events go on one launch in phase_timings_every (the
// first, then every n-th); the others measure the launch's whole device time only.
TEST_F(LaunchTest, PhaseTimingsAreSampled) {
  Core c = Start(false, 3);
  Run(*c.core, true);  // launches 0 (prefill) and 1
  std::vector<bool> phases;
  for (int i = 0; i < 5; ++i) {  // launches 2..6
    for (const SpanData& s : decode_) {
      ASSERT_TRUE(c.core->TruncateSequence(kTenant, kModel, s.sequence, s.first).ok());
    }
    absl::StatusOr<StepResult> r = testing::RunStep(*c.core, Request(decode_, true));
    ASSERT_TRUE(r.ok()) << r.status();
    phases.push_back(r->timings.phases);
    EXPECT_GT(r->timings.kernel, absl::ZeroDuration());
    if (!r->timings.phases) {
      EXPECT_EQ(r->timings.attend, absl::ZeroDuration());
      EXPECT_EQ(r->timings.copy_out, absl::ZeroDuration());
    } else {
      EXPECT_GT(r->timings.attend, absl::ZeroDuration());
    }
  }
  EXPECT_EQ(phases, (std::vector<bool>{false, true, false, false, true}));
}

TEST_F(LaunchTest, RegisteredInputsAreCopiedInPlaceOnePerRange) {
  Core plain = Start(false);
  const StepResult want = Run(*plain.core, true);

  Core gathered = Start(true);
  const StepResult staged = Run(*gathered.core, true);
  const std::vector<kernels::CopyOp> staged_copies = gathered.backend->take_to_device();

  Core direct = Start(true);
  ASSERT_TRUE(direct.core->RegisterHostMemory(region_.data(), region_.size()).ok());
  const StepResult in_place = Run(*direct.core, true);
  const std::vector<kernels::CopyOp> direct_copies = direct.backend->take_to_device();
  direct.core->UnregisterHostMemory(region_.data());

  for (const StepResult* r : {&staged, &in_place}) {
    EXPECT_TRUE(r->out == want.out);
    EXPECT_TRUE(r->mx_scales == want.mx_scales);
    ASSERT_EQ(r->lse.size(), want.lse.size());
    EXPECT_EQ(0, std::memcmp(r->lse.data(), want.lse.data(), want.lse.size() * 4));
  }
  // q, KV rows, compressed entries, top-k ids: one copy each, from the region or from the arena.
  ASSERT_EQ(direct_copies.size(), 4u);
  for (const kernels::CopyOp& c : direct_copies) EXPECT_TRUE(InRegion(c.src));
  ASSERT_EQ(staged_copies.size(), 4u);
  for (const kernels::CopyOp& c : staged_copies) EXPECT_FALSE(InRegion(c.src));
}

// The executor alone, so that its copy paths can be read: inputs and output destinations inside
// a registered range are copied in place (within the device when the range is a GPU region's),
// the others are gathered (inputs) or go through plain memory (outputs); the outputs are the
// same bit for bit.
TEST_F(LaunchTest, CopyStatsFollowTheRegisteredRanges) {
  Direct d;
  ASSERT_NO_FATAL_FAILURE(StartDirect(d));
  PinningBackend& backend = *d.backend;
  ModelRuntime& model = *d.model;
  StepExecutor& ex = *d.executor;

  const size_t inputs = region_.size();
  int64_t rows = 0;
  size_t q_bytes = 0;
  for (const SpanData& s : decode_) {
    rows += s.rows;
    q_bytes += s.q.size() * 2;
  }
  const size_t out_bytes = static_cast<size_t>(rows) * 16 * kernels::kValueWidth;
  const size_t scale_bytes = static_cast<size_t>(rows) * 16 * kernels::kMxGroupsPerHead;
  const size_t lse_bytes = static_cast<size_t>(rows) * 16 * sizeof(float);
  std::vector<uint8_t> outputs(out_bytes + scale_bytes + lse_bytes);
  using Kind = HostRanges::Kind;
  auto run = [&](Kind kind) {
    std::fill(outputs.begin(), outputs.end(), 0xee);  // a launch that wrote nothing shows
    if (kind != Kind::kNone) {
      ex.host_ranges().Add(region_.data(), region_.size(), kind);
      ex.host_ranges().Add(outputs.data(), outputs.size(), kind);
    }
    StepRequest r = Request(decode_, true);
    r.destination.out = {outputs.data(), out_bytes};
    r.destination.mx_scales = {outputs.data() + out_bytes, scale_bytes};
    r.destination.lse = {outputs.data() + out_bytes + scale_bytes, lse_bytes};
    std::vector<absl::StatusOr<StepResult>> got =
        ex.RunBatch({std::vector<const StepRequest*>{&r}});
    EXPECT_TRUE(got[0].ok()) << got[0].status();
    ex.host_ranges().Remove(region_.data());
    ex.host_ranges().Remove(outputs.data());
    // Run the same positions again next time.
    std::vector<uint8_t> written = outputs;
    EXPECT_TRUE(Rewind(model.store()).ok());
    return written;
  };
  const std::vector<uint8_t> plain = run(Kind::kNone);
  StepExecutor::CopyStats st = ex.last_copy_stats();
  EXPECT_EQ(st.in_direct, 0);
  EXPECT_EQ(st.in_gathered, static_cast<int64_t>(inputs));
  EXPECT_EQ(st.out_direct, 0);
  EXPECT_EQ(st.out_pageable, static_cast<int64_t>(outputs.size()));
  EXPECT_EQ(st.out_in_place, 0);
  EXPECT_EQ(st.q_in_place, 0);

  EXPECT_TRUE(backend.take_on_device().empty());
  EXPECT_TRUE(backend.take_checked_copies().empty());
  for (const Kind kind : {Kind::kHost, Kind::kDevice}) {
    const std::vector<uint8_t> in_place = run(kind);
    st = ex.last_copy_stats();
    const bool device = kind == Kind::kDevice;
    EXPECT_EQ(st.in_direct, static_cast<int64_t>(inputs));
    EXPECT_EQ(st.in_gathered, 0);
    EXPECT_EQ(st.out_direct, device ? 0 : static_cast<int64_t>(outputs.size()));
    EXPECT_EQ(st.out_pageable, 0);
    EXPECT_EQ(st.out_in_place, device ? static_cast<int64_t>(outputs.size()) : 0);
    EXPECT_EQ(st.q_in_place, device ? static_cast<int64_t>(q_bytes) : 0);
    EXPECT_TRUE(plain == in_place);
    // A GPU region's inputs are copied by the checks that read them (every byte but the bf16
    // queries, which lie one after another and which the attention reads there, and none by a
    // copy of its own); the one step's outputs there are written by the attention, and the
    // checks write their flags where the host reads them: nothing is copied within the device.
    size_t to_outputs = 0, others = 0;
    for (const kernels::CopyOp& c : backend.take_on_device()) {
      const auto* dst = static_cast<const uint8_t*>(c.dst);
      EXPECT_FALSE(InRegion(c.src));
      if (dst >= outputs.data() && dst < outputs.data() + outputs.size()) {
        to_outputs += c.bytes;
      } else {
        ++others;
        EXPECT_EQ(c.bytes, sizeof(uint32_t));
      }
    }
    size_t checked = 0;
    for (const kernels::CopyOp& c : backend.take_checked_copies()) {
      EXPECT_TRUE(InRegion(c.src));
      EXPECT_FALSE(InRegion(c.dst));
      checked += c.bytes;
    }
    EXPECT_EQ(checked, device ? inputs - q_bytes : 0);
    EXPECT_EQ(others, 0u);
    EXPECT_EQ(to_outputs, 0u);
    for (const kernels::CopyOp& c : backend.take_to_device()) {
      EXPECT_EQ(InRegion(c.src), !device);
    }
  }
}

// The attention writes a launch's outputs where they go when the launch holds one step whose
// every destination the device can write (a GPU region here, 16-byte aligned): nothing is copied
// after it, and the bytes are those of a launch that copies them. Two steps in a launch, or a
// destination the kernels' 16-byte stores cannot reach, are copied as before; a step the checks
// flag still fails alone with its message (the checks write the flags where the host reads them).
TEST_F(LaunchTest, OneStepsOutputsAreWrittenInPlace) {
  Direct d;
  ASSERT_NO_FATAL_FAILURE(StartDirect(d, /*region_on_device=*/true));
  PinningBackend& backend = *d.backend;
  ModelRuntime& model = *d.model;
  StepExecutor& ex = *d.executor;
  // Per span: bf16-sized room for its MXFP8 outputs, scales and LSE; one more span's worth so
  // that a destination can start off the 16-byte grid.
  const size_t rows = static_cast<size_t>(decode_[0].rows);
  const size_t out_bytes = rows * 16 * kernels::kValueWidth;
  const size_t scale_bytes = rows * 16 * kernels::kMxGroupsPerHead;
  const size_t lse_bytes = rows * 16 * sizeof(float);
  const size_t span_bytes = out_bytes + scale_bytes + lse_bytes;
  std::vector<uint8_t> outputs(3 * span_bytes + 64);
  ex.host_ranges().Add(outputs.data(), outputs.size(), HostRanges::Kind::kDevice);
  auto aim = [&](StepRequest& r, uint8_t* at, size_t n) {
    r.destination.out = {at, n * out_bytes};
    r.destination.mx_scales = {at + n * out_bytes, n * scale_bytes};
    r.destination.lse = {at + n * (out_bytes + scale_bytes), n * lse_bytes};
  };
  auto rewind = [&] { ASSERT_TRUE(Rewind(model.store()).ok()); };
  // Both spans in one step: written in place.
  std::fill(outputs.begin(), outputs.end(), 0xee);
  StepRequest both = Request(decode_, true);
  aim(both, outputs.data(), 2);
  ASSERT_TRUE(ex.RunBatch({std::vector<const StepRequest*>{&both}})[0].ok());
  const std::vector<uint8_t> in_place(outputs.begin(), outputs.begin() + 2 * span_bytes);
  StepExecutor::CopyStats st = ex.last_copy_stats();
  EXPECT_EQ(st.out_in_place, static_cast<int64_t>(2 * span_bytes));
  EXPECT_EQ(st.out_direct + st.out_pageable, 0);
  EXPECT_TRUE(backend.take_on_device().empty());
  ASSERT_NO_FATAL_FAILURE(rewind());
  // The same step into result vectors: the same bytes.
  StepRequest plain = Request(decode_, true);
  absl::StatusOr<StepResult> copied = ex.RunBatch({std::vector<const StepRequest*>{&plain}})[0];
  ASSERT_TRUE(copied.ok()) << copied.status();
  std::vector<uint8_t> want = copied->out;
  want.insert(want.end(), copied->mx_scales.begin(), copied->mx_scales.end());
  const auto* lse = reinterpret_cast<const uint8_t*>(copied->lse.data());
  want.insert(want.end(), lse, lse + copied->lse.size() * sizeof(float));
  EXPECT_TRUE(in_place == want);
  ASSERT_NO_FATAL_FAILURE(rewind());
  // Off the 16-byte grid: copied within the device.
  std::fill(outputs.begin(), outputs.end(), 0xee);
  StepRequest shifted = Request(decode_, true);
  aim(shifted, outputs.data() + 8, 2);
  ASSERT_TRUE(ex.RunBatch({std::vector<const StepRequest*>{&shifted}})[0].ok());
  EXPECT_EQ(ex.last_copy_stats().out_in_place, 0);
  EXPECT_EQ(backend.take_on_device().size(), 3u);
  EXPECT_TRUE(std::equal(in_place.begin(), in_place.end(), outputs.begin() + 8));
  ASSERT_NO_FATAL_FAILURE(rewind());
  // Two steps of one span each in one launch: each copied to its own destination.
  std::fill(outputs.begin(), outputs.end(), 0xee);
  StepRequest first = Request({decode_[0]}, true), second = Request({decode_[1]}, true);
  aim(first, outputs.data(), 1);
  aim(second, outputs.data() + span_bytes, 1);
  // Request() lays out the tensors of the spans it is given: take each span's from the step of
  // both, whose layout is the region's.
  first.spans[0] = both.spans[0];
  second.spans[0] = both.spans[1];
  std::vector<absl::StatusOr<StepResult>> two =
      ex.RunBatch({std::vector<const StepRequest*>{&first, &second}});
  ASSERT_TRUE(two[0].ok()) << two[0].status();
  ASSERT_TRUE(two[1].ok()) << two[1].status();
  EXPECT_EQ(ex.last_copy_stats().out_in_place, 0);
  EXPECT_EQ(backend.take_on_device().size(), 6u);
  // Span by span the same rows: out, scales and LSE of span 0, then of span 1.
  for (size_t k = 0; k < 2; ++k) {
    const uint8_t* got = outputs.data() + k * span_bytes;
    EXPECT_EQ(0, std::memcmp(got, in_place.data() + k * out_bytes, out_bytes)) << k;
    EXPECT_EQ(0, std::memcmp(got + out_bytes, in_place.data() + 2 * out_bytes + k * scale_bytes,
                             scale_bytes))
        << k;
    EXPECT_EQ(
        0, std::memcmp(got + out_bytes + scale_bytes,
                       in_place.data() + 2 * (out_bytes + scale_bytes) + k * lse_bytes, lse_bytes))
        << k;
  }
  ASSERT_NO_FATAL_FAILURE(rewind());
  // A refused id: the step fails with its message and changes nothing; then it runs.
  const std::vector<uint8_t> valid = region_;
  const int32_t far = 1 << 30;
  std::memcpy(region_.data() + region_.size() - sizeof(int32_t), &far, sizeof(int32_t));
  StepRequest bad = Request(decode_, true);
  aim(bad, outputs.data(), 2);
  absl::StatusOr<StepResult> refused = ex.RunBatch({std::vector<const StepRequest*>{&bad}})[0];
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("spans[1].topk"));
  region_ = valid;
  EXPECT_TRUE(ex.RunBatch({std::vector<const StepRequest*>{&bad}})[0].ok());
  EXPECT_TRUE(std::equal(in_place.begin(), in_place.end(), outputs.begin()));
  ex.host_ranges().Remove(outputs.data());
  ex.host_ranges().Remove(region_.data());
}

// The attention reads a launch's bf16 queries in a GPU region when they lie there one after
// another in the launch's row order; where one span's lie elsewhere, every span's are copied as
// before. The outputs are the same bit for bit.
TEST_F(LaunchTest, QueriesAreReadInPlaceOnlyInRowOrder) {
  Direct d;
  ASSERT_NO_FATAL_FAILURE(StartDirect(d, /*region_on_device=*/true));
  ModelRuntime& model = *d.model;
  StepExecutor& ex = *d.executor;
  size_t q_bytes = 0;
  for (const SpanData& s : decode_) q_bytes += s.q.size() * 2;
  auto run = [&](const StepRequest& r) {
    absl::StatusOr<StepResult> got = ex.RunBatch({std::vector<const StepRequest*>{&r}})[0];
    EXPECT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(Rewind(model.store()).ok());
    return got.ok() ? got->out : std::vector<uint8_t>();
  };
  const std::vector<uint8_t> in_place = run(Request(decode_, true));
  EXPECT_EQ(ex.last_copy_stats().q_in_place, static_cast<int64_t>(q_bytes));
  // Span 1's queries from plain memory (the same values): both spans' are copied.
  StepRequest mixed = Request(decode_, true);
  const std::vector<uint16_t> q1 = decode_[1].q;
  mixed.spans[1].q = {reinterpret_cast<const uint8_t*>(q1.data()), q1.size() * 2};
  const std::vector<uint8_t> copied = run(mixed);
  EXPECT_EQ(ex.last_copy_stats().q_in_place, 0);
  ASSERT_FALSE(in_place.empty());
  EXPECT_TRUE(copied == in_place);
  // Both spans in the region, in the other order: not the launch's row order, so copied.
  StepRequest swapped = Request(decode_, true);
  std::swap(swapped.spans[0], swapped.spans[1]);
  const std::vector<uint8_t> reordered = run(swapped);
  EXPECT_EQ(ex.last_copy_stats().q_in_place, 0);
  ASSERT_EQ(reordered.size(), in_place.size());
  const size_t half = in_place.size() / 2;  // both spans have six rows
  EXPECT_TRUE(std::equal(reordered.begin(), reordered.begin() + half, in_place.begin() + half));
  EXPECT_TRUE(std::equal(reordered.begin() + half, reordered.end(), in_place.begin()));
  ex.host_ranges().Remove(region_.data());
}

// Inputs in a GPU region are checked as the device copies them, so a client that rewrites its
// region once they are read changes nothing: a refused id and a refused value fail their step
// with the message of the inputs the device read, even though the region holds valid ones by
// the time the host explains the flag.
TEST_F(LaunchTest, RegionInputsAreExplainedAsTheChecksReadThem) {
  Direct d;
  ASSERT_NO_FATAL_FAILURE(StartDirect(d, /*region_on_device=*/true));
  PinningBackend& backend = *d.backend;
  ModelRuntime& model = *d.model;
  StepExecutor& ex = *d.executor;

  const std::vector<uint8_t> valid = region_;
  const size_t ids_at = region_.size() - decode_[1].topk.size() * sizeof(int32_t);
  const size_t kv_at = [&] {
    size_t at = 0;
    for (const SpanData& s : decode_) at += s.q.size() * 2;
    return at + decode_[0].kv.size() * 2;  // span 1's first KV value
  }();
  struct Case {
    const char* what;
    size_t at;
    std::vector<uint8_t> bad;
    const char* message;
  };
  const int32_t far = 1 << 30;
  const uint16_t nan = 0x7fc0;
  const Case cases[] = {
      {"id",
       ids_at,
       {reinterpret_cast<const uint8_t*>(&far), reinterpret_cast<const uint8_t*>(&far) + 4},
       "spans[1].topk"},
      {"value",
       kv_at,
       {reinterpret_cast<const uint8_t*>(&nan), reinterpret_cast<const uint8_t*>(&nan) + 2},
       "spans[1].kv_rows"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::memcpy(region_.data() + c.at, c.bad.data(), c.bad.size());
    backend.set_after_checks([&] { region_ = valid; });
    const StepRequest r = Request(decode_, true);
    std::vector<absl::StatusOr<StepResult>> got =
        ex.RunBatch({std::vector<const StepRequest*>{&r}});
    backend.set_after_checks(nullptr);
    ASSERT_FALSE(got[0].ok());
    EXPECT_EQ(got[0].status().code(), absl::StatusCode::kInvalidArgument) << got[0].status();
    EXPECT_THAT(got[0].status().message(), ::testing::HasSubstr(c.message));
    EXPECT_TRUE(ex.healthy());
    // Nothing was written: the same step with valid inputs runs.
    ASSERT_EQ(region_, valid);
    EXPECT_TRUE(ex.RunBatch({std::vector<const StepRequest*>{&r}})[0].ok());
    ASSERT_TRUE(Rewind(model.store()).ok());
  }
  ex.host_ranges().Remove(region_.data());
}

// The input copies are enqueued before the slot lists and segments are built (so that the build
// overlaps the device's copies): the arena's other bytes are poisoned at that moment and the
// results are still those of a plain run, for gathered and for in-place inputs.
TEST_F(LaunchTest, InputCopiesGoBeforeTheSegmentBuild) {
  Core plain = Start(false);
  const StepResult want = Run(*plain.core, true);
  for (bool registered : {false, true}) {
    SCOPED_TRACE(registered ? "in place" : "gathered");
    Core c = Start(true);
    c.backend->set_poison(true);
    if (registered) {
      ASSERT_TRUE(c.core->RegisterHostMemory(region_.data(), region_.size()).ok());
    }
    const StepResult got = Run(*c.core, true);
    if (registered) c.core->UnregisterHostMemory(region_.data());
    EXPECT_TRUE(got.out == want.out);
    EXPECT_TRUE(got.mx_scales == want.mx_scales);
    ASSERT_EQ(got.lse.size(), want.lse.size());
    EXPECT_EQ(0, std::memcmp(got.lse.data(), want.lse.data(), want.lse.size() * 4));
  }
}

// The chosen segment is translated on the device into its own buffer: the one upload of a
// launch's arrays holds no room for it, so it does not grow with the top-k width (at 512 ids it
// would by 12 rows x 448 ids x 4 bytes over 64 ids).
TEST_F(LaunchTest, UploadDoesNotGrowWithTheTopKWidth) {
  Core c = Start(/*pinning=*/true);
  Run(*c.core, /*from_region=*/false);
  const size_t wide = c.backend->last_upload_bytes();
  ASSERT_GT(wide, 0u);
  const ModelProfile& p = *FindProfile(kModel);
  std::vector<SpanData> narrow;
  for (const SpanData& s : prefill_) {
    narrow.push_back(testing::MakeSpan(rng_, p, kLayer, 16, s.sequence, 156, 6, 64));
  }
  absl::StatusOr<StepResult> got = testing::RunStep(*c.core, Request(narrow, false));
  ASSERT_TRUE(got.ok()) << got.status();
  // The next positions may reach one more page per span, whose table block then goes up again
  // (128 bytes and its write), and the layout pads to 64 bytes.
  EXPECT_LE(c.backend->last_upload_bytes(), wide + 512);
  EXPECT_GE(c.backend->last_upload_bytes() + 512, wide);
}

// From a page-locked arena the launch's arrays go up as one copy within the device (a copy
// kernel that reads the arena in place, on a GPU), never as a copy-engine copy.
TEST_F(LaunchTest, ArraysGoUpInACopyKernel) {
  Core pinned = Start(/*pinning=*/true);
  const StepResult got = Run(*pinned.core, /*from_region=*/false);
  EXPECT_GT(pinned.backend->last_upload_bytes(), 0u);
  EXPECT_EQ(pinned.backend->engine_uploads(), 0);
  Core plain = Start(/*pinning=*/false);
  const StepResult want = Run(*plain.core, /*from_region=*/false);
  EXPECT_TRUE(got.out == want.out);
  EXPECT_TRUE(got.mx_scales == want.mx_scales);
}

// The page tables the chosen entries are translated through stay on the device between
// launches: a launch sends only the blocks that changed since the last one. The prefill sends
// each sequence's table (one block of 10 pages), the decode at the same pages none, and a step
// that reaches an eleventh page the block that holds it.
TEST_F(LaunchTest, OnlyChangedTableBlocksGoUp) {
  Core c = Start(/*pinning=*/true);
  Run(*c.core, /*from_region=*/false);
  EXPECT_EQ(c.backend->take_block_writes(), (std::vector<int32_t>{2, 0}));
  const ModelProfile& p = *FindProfile(kModel);
  std::vector<SpanData> next;
  for (const SpanData& s : prefill_) {
    next.push_back(testing::MakeSpan(rng_, p, kLayer, 16, s.sequence, 156, 6, 512));
  }
  absl::StatusOr<StepResult> got = testing::RunStep(*c.core, Request(next, false));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(c.backend->take_block_writes(), (std::vector<int32_t>{2}));
}

// The executor tells the backend how the launch's rows group by sequence (the spans' greatest
// common row count), so a GPU backend may pair a request's rows over their shared keys: 6 for
// two 6-row decode spans, 2 for spans of 6 and 4 rows, 1 for spans of 6 and 5.
TEST_F(LaunchTest, SpansGiveTheRowGroups) {
  Core c = Start(/*pinning=*/true);
  Run(*c.core, /*from_region=*/false);
  EXPECT_EQ(c.backend->last_rows_per_group(), 6);  // the decode step: two spans of 6 rows
  const ModelProfile& p = *FindProfile(kModel);
  int64_t length[2] = {156, 156};
  for (const auto& [second, group] : {std::pair{4, 2}, std::pair{5, 1}}) {
    std::vector<SpanData> spans = {
        testing::MakeSpan(rng_, p, kLayer, 16, prefill_[0].sequence, length[0], 6, 512),
        testing::MakeSpan(rng_, p, kLayer, 16, prefill_[1].sequence, length[1], second, 512)};
    absl::StatusOr<StepResult> got = testing::RunStep(*c.core, Request(spans, false));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(c.backend->last_rows_per_group(), group);
    length[0] += 6;
    length[1] += second;
  }
}

}  // namespace
}  // namespace smla::server
