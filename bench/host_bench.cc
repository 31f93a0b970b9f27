// smla-host-bench: the host's share of a launch, measured without a GPU. The service core runs
// as in smla-server, on a backend whose device work takes no time (copies, checks, row writes and
// attention return at once; memory and events are the CPU backend's), so that what remains of a
// step's round trip is the core's host work: admission, the scheduler, the KV store, staging,
// the segment build and the planning of the copies. The inputs lie where a GPU-region or
// shared-memory step's lie (copied in place, never staged) and the outputs have destinations,
// as on the step ring. Run it under `perf record` to see where that time goes
// (docs/performance.md, "The host's share of a launch").
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "smla/kernels/backend.h"
#include "smla/kernels/cpu_backend.h"
#include "smla/kernels/formats.h"
#include "smla/server/config.h"
#include "smla/server/model_profile.h"
#include "smla/server/service_core.h"
#include "smla/server/step_validation.h"

ABSL_FLAG(std::string, model, "dsv4.1-flash:tp=4:kv=fp8_dsv4:page_rows=64:pool_pages=70000",
          "served model (--model of smla-server)");
ABSL_FLAG(int32_t, layer, 20, "layer stepped");
ABSL_FLAG(int32_t, concurrency, 32, "sequences per step (C)");
ABSL_FLAG(int64_t, context, 131072, "positions stored before the timed steps");
ABSL_FLAG(int32_t, rows, 6, "rows per sequence and step (decode: 1 verify + 5 drafts)");
ABSL_FLAG(int32_t, topk, 512, "top-k width on top-k layers");
ABSL_FLAG(int32_t, steps, 20000, "timed steps");

namespace smla::bench {
namespace {

using kernels::Backend;

// The CPU backend's memory, streams and events, with device work that takes no time: every copy
// is skipped, and the checks' flags stay as the host zeroed them (nothing refused).
class InstantDevice final : public Backend {
 public:
  explicit InstantDevice(std::unique_ptr<Backend> cpu) : cpu_(std::move(cpu)) {}

  const kernels::DeviceInfo& device() const override { return cpu_->device(); }
  absl::StatusOr<kernels::Buffer> Allocate(size_t bytes) override { return cpu_->Allocate(bytes); }
  absl::StatusOr<std::unique_ptr<kernels::Stream>> CreateStream() override {
    return cpu_->CreateStream();
  }
  absl::Status CopyToDevice(void*, const void*, size_t, kernels::Stream&) override {
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void*, const void*, size_t, kernels::Stream&) override {
    return absl::OkStatus();
  }
  absl::Status Fill(void*, uint8_t, size_t, kernels::Stream&) override { return absl::OkStatus(); }
  absl::Status CopyBatch(std::span<const kernels::CopyOp>, kernels::CopyDirection,
                         kernels::Stream&) override {
    return absl::OkStatus();
  }
  absl::Status WriteRows(const kernels::WriteRowsParams&, kernels::Stream&) override {
    return absl::OkStatus();
  }
  absl::Status ExpandMxfp8Query(const kernels::ExpandQueryParams&, kernels::Stream&) override {
    return absl::OkStatus();
  }
  absl::Status CheckInputs(const kernels::CheckInputsParams&, kernels::Stream&) override {
    return absl::OkStatus();
  }
  absl::Status Attend(const kernels::AttendParams&, kernels::Stream&) override {
    return absl::OkStatus();
  }
  absl::Status Synchronize(kernels::Stream& s) override { return cpu_->Synchronize(s); }
  absl::StatusOr<kernels::Buffer> AllocateHost(size_t bytes) override {
    return cpu_->AllocateHost(bytes);
  }

 private:
  std::unique_ptr<Backend> cpu_;
};

// Zeroed tensors for up to `rows` rows of one span, shared by every span of a step (the device
// reads none of them).
struct Tensors {
  std::vector<uint8_t> q, kv, compressed, out, scales;
  std::vector<int32_t> topk;
};

server::SpanInput Span(const Tensors& t, const server::ModelProfile& profile,
                       const server::ModelConfig& config, int32_t layer, std::string id,
                       int64_t first, int32_t rows, int32_t topk) {
  const server::LayerSpec& spec = profile.layers[layer];
  const size_t row = size_t{2} * kernels::QkWidth(profile.geometry);
  server::SpanInput s;
  s.sequence_id = std::move(id);
  s.first_position = first;
  s.num_rows = rows;
  s.kv_rows = {t.kv.data(), rows * row};
  s.q = {t.q.data(), rows * row * static_cast<size_t>(config.heads_per_rank)};
  if (spec.has_compressed()) {
    const int64_t n = server::CompressedEntriesAdded(first, rows, spec.ratio);
    s.compressed_rows = {t.compressed.data(), static_cast<size_t>(n) * row};
  }
  if (spec.client_chooses()) {
    s.topk_width = topk;
    s.topk = {t.topk.data(), static_cast<size_t>(rows) * topk};
  }
  return s;
}

absl::StatusOr<server::StepResult> Run(server::ServiceCore& core, server::StepRequest request) {
  std::promise<absl::StatusOr<server::StepResult>> done;
  std::future<absl::StatusOr<server::StepResult>> result = done.get_future();
  core.Submit(std::move(request),
              [&done](absl::StatusOr<server::StepResult> r) { done.set_value(std::move(r)); });
  return result.get();
}

// Prints what failed and returns the exit code.
int Fail(std::string_view what, const absl::Status& status) {
  std::fprintf(stderr, "smla-host-bench: %.*s: %s\n", static_cast<int>(what.size()), what.data(),
               std::string(status.message()).c_str());
  return 1;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

int Main() {
  absl::StatusOr<server::ModelConfig> config = server::ParseModelConfig(absl::GetFlag(FLAGS_model));
  if (!config.ok()) return Fail("--model", config.status());
  absl::StatusOr<std::unique_ptr<Backend>> cpu = kernels::CreateCpuBackend({.cpu_threads = 1});
  if (!cpu.ok()) return Fail("CPU backend", cpu.status());
  server::ServerConfig server_config;
  server_config.models.push_back(*config);
  absl::StatusOr<std::unique_ptr<server::ServiceCore>> core =
      server::ServiceCore::Create(server_config, std::make_unique<InstantDevice>(*std::move(cpu)));
  if (!core.ok()) return Fail("service core", core.status());
  const server::ModelConfig model = (*core)->Info().models.front();  // resolved
  const server::ModelProfile& profile = *server::FindProfile(model.profile);
  const int32_t layer = absl::GetFlag(FLAGS_layer);
  const int32_t c = absl::GetFlag(FLAGS_concurrency);
  const int64_t context = absl::GetFlag(FLAGS_context);
  const int32_t rows = absl::GetFlag(FLAGS_rows);
  const int32_t topk = absl::GetFlag(FLAGS_topk);
  const int32_t heads = model.heads_per_rank;
  if (layer < 0 || layer >= profile.num_layers() || c < 1 || rows < 1 || topk < 1 || context < 0 ||
      absl::GetFlag(FLAGS_steps) < 1) {
    return Fail("flags", absl::InvalidArgumentError(absl::StrCat(
                             "--layer outside [0, ", profile.num_layers(),
                             ") or a count below 1 (--concurrency, --rows, --topk, --steps)")));
  }
  if (profile.has_sink) {
    const std::vector<float> sinks(static_cast<size_t>(profile.num_layers()) * heads, 0.0f);
    if (absl::Status st = (*core)->SetSinks(model.profile, sinks); !st.ok()) {
      return Fail("sinks", st);
    }
  }
  const int64_t positions = context + rows;
  const std::vector<float> rope(static_cast<size_t>(positions) * 64, 0.0f);
  if (absl::Status st = (*core)->SetRopeTable(model.profile, rope, static_cast<int32_t>(positions));
      !st.ok()) {
    return Fail("RoPE table", st);
  }

  constexpr int32_t kChunk = 8192;  // pre-fill rows per call (the default launch row cap)
  const size_t row = size_t{2} * kernels::QkWidth(profile.geometry);
  Tensors t;
  const size_t most = static_cast<size_t>(std::max(kChunk, rows * c));
  t.q.resize(most * row * heads);
  t.kv.resize(most * row);
  t.compressed.resize(most * row);
  t.topk.resize(most * topk);
  t.out.resize(most * heads * kernels::kValueWidth);
  t.scales.resize(most * heads * kernels::kMxGroupsPerHead);
  auto request = [&] {
    server::StepRequest r;
    r.tenant = "bench";
    r.model = model.profile;
    r.layer = layer;
    r.output_format = kernels::OutputFormat::kMxfp8;
    r.inverse_rope = true;
    return r;
  };
  auto aim = [&](server::StepRequest& r, int64_t total_rows) {
    const auto n = static_cast<size_t>(total_rows * heads);
    r.destination.out = {t.out.data(), n * kernels::kValueWidth};
    r.destination.mx_scales = {t.scales.data(), n * kernels::kMxGroupsPerHead};
  };
  std::fprintf(stderr, "pre-filling %d sequences to %lld positions on layer %d\n", c,
               static_cast<long long>(context), layer);
  for (int32_t i = 0; i < c; ++i) {
    const std::string id = absl::StrCat("s", i);
    if (absl::Status st = (*core)->CreateSequence("bench", model.profile, id); !st.ok()) {
      return Fail("create sequence", st);
    }
    for (int64_t at = 0; at < context; at += kChunk) {
      const auto n = static_cast<int32_t>(std::min<int64_t>(kChunk, context - at));
      server::StepRequest r = request();
      r.spans.push_back(Span(t, profile, model, layer, id, at, n, topk));
      aim(r, n);
      absl::StatusOr<server::StepResult> got = Run(**core, std::move(r));
      if (!got.ok()) return Fail("pre-fill", got.status());
    }
  }
  // Each timed step writes the same rows again (the rollback of rejected drafts), as smla-bench's
  // decode cells do.
  server::StepRequest step = request();
  for (int32_t i = 0; i < c; ++i) {
    step.spans.push_back(Span(t, profile, model, layer, absl::StrCat("s", i), context, rows, topk));
  }
  aim(step, int64_t{rows} * c);
  const int32_t steps = absl::GetFlag(FLAGS_steps);
  std::vector<double> call_us, prep_us, queued_us, batch_us;
  for (std::vector<double>* v : {&call_us, &prep_us, &queued_us, &batch_us}) v->reserve(steps);
  for (int32_t k = 0; k < steps + steps / 10; ++k) {  // the first tenth warms up
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<server::StepResult> got = Run(**core, step);
    const auto end = std::chrono::steady_clock::now();
    if (!got.ok()) return Fail("step", got.status());
    if (k < steps / 10) continue;
    call_us.push_back(std::chrono::duration<double, std::micro>(end - start).count());
    prep_us.push_back(absl::ToDoubleMicroseconds(got->timings.prep));
    queued_us.push_back(absl::ToDoubleMicroseconds(got->timings.queued));
    batch_us.push_back(absl::ToDoubleMicroseconds(got->timings.batch));
  }
  std::printf(
      "%s layer %d, C=%d x %d rows at %lld, top-k %d: host time of a step (submit to answer) "
      "p50 %.1f us, p90 %.1f us; p50 of its parts: queued %.1f us, the batch %.1f us, the "
      "launch's prep %.1f us (%d steps)\n",
      model.profile.c_str(), layer, c, rows, static_cast<long long>(context), topk,
      Percentile(call_us, 0.5), Percentile(call_us, 0.9), Percentile(queued_us, 0.5),
      Percentile(batch_us, 0.5), Percentile(prep_us, 0.5), steps);
  return 0;
}

}  // namespace
}  // namespace smla::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("smla-host-bench: the host's share of a launch, without a GPU");
  absl::ParseCommandLine(argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as smla-server runs
  return smla::bench::Main();
}
