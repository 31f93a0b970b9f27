// Helpers for the service-core tests: random step inputs, a host mirror of what a test wrote,
// an independent reference computed on a separate CPU-backend pool, and backend wrappers that
// hold or fail calls.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "smla/kernels/backend.h"
#include "smla/server/model_profile.h"
#include "smla/server/service_core.h"
#include "smla/server/step.h"

namespace smla::server::testing {

// Everything a test wrote into one (sequence, layer): rows by position, compressed entries.
struct HostLayer {
  std::map<int64_t, std::vector<uint16_t>> rows;
  std::map<int64_t, std::vector<uint16_t>> compressed;
};

// The inputs of one span, owned (a SpanInput only borrows them).
struct SpanData {
  std::string sequence;
  int64_t first = 0;
  int32_t rows = 0;
  int32_t topk_width = 0;
  std::vector<uint16_t> kv, compressed, q;
  std::vector<int32_t> topk;

  SpanInput View() const;
};

// Random inputs for a span of `rows` rows from `first` on a layer: KV rows, the compressed
// entries the layer needs, q, and (top-k / chosen layers) `topk_width` distinct visible entries
// per row with a few -1.
SpanData MakeSpan(std::mt19937& rng, const ModelProfile& profile, int32_t layer, int32_t heads,
                  const std::string& sequence, int64_t first, int32_t rows, int32_t topk_width);

// Mirrors the store: positions and entries at or past the span's are replaced.
void Apply(HostLayer& host, const SpanData& span, const LayerSpec& spec);

struct RopeTable {
  std::vector<float> cos_sin;  // [P, 64]
  int32_t positions = 0;
};
RopeTable MakeRope(int32_t positions);

struct ReferenceOptions {
  kernels::OutputFormat format = kernels::OutputFormat::kBf16;
  bool want_lse = false;
  const RopeTable* rope = nullptr;  // inverse RoPE when set
  std::vector<float> sink;          // [H], empty = none
};

// The expected output of a span, computed from `host` (after Apply) on its own pool of the
// model's format: keys gathered by hand (window, chosen positions, top-k or every visible
// compressed entry), one Attend.
absl::StatusOr<StepResult> Reference(kernels::Backend& backend, const ModelConfig& config,
                                     int32_t layer, const HostLayer& host, const SpanData& span,
                                     const ReferenceOptions& options);

// Submits and waits.
absl::StatusOr<StepResult> RunStep(ServiceCore& core, StepRequest request);

// Forwards to a backend; Attend can be held at a gate or made to fail.
class ControlledBackend : public kernels::Backend {
 public:
  explicit ControlledBackend(std::unique_ptr<kernels::Backend> inner) : inner_(std::move(inner)) {}

  void Close();  // later Attend calls wait until Open
  void Open();
  void FailAttends(bool fail);
  // Waits until `n` Attend calls have been entered in total.
  void WaitAttends(int n);

  const kernels::DeviceInfo& device() const override { return inner_->device(); }
  absl::StatusOr<kernels::Buffer> Allocate(size_t bytes) override {
    return inner_->Allocate(bytes);
  }
  absl::StatusOr<std::unique_ptr<kernels::Stream>> CreateStream() override {
    return inner_->CreateStream();
  }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes, kernels::Stream& s) override {
    return inner_->CopyToDevice(dst, src, bytes, s);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes, kernels::Stream& s) override {
    return inner_->CopyToHost(dst, src, bytes, s);
  }
  absl::Status Fill(void* dst, uint8_t byte, size_t bytes, kernels::Stream& s) override {
    return inner_->Fill(dst, byte, bytes, s);
  }
  absl::Status WriteRows(const kernels::WriteRowsParams& p, kernels::Stream& s) override {
    return inner_->WriteRows(p, s);
  }
  absl::Status ExpandMxfp8Query(const kernels::ExpandQueryParams& p, kernels::Stream& s) override {
    return inner_->ExpandMxfp8Query(p, s);
  }
  absl::Status CheckInputs(const kernels::CheckInputsParams& p, kernels::Stream& s) override {
    return inner_->CheckInputs(p, s);
  }
  absl::Status Attend(const kernels::AttendParams& p, kernels::Stream& s) override;
  absl::Status Synchronize(kernels::Stream& s) override { return inner_->Synchronize(s); }

 private:
  std::unique_ptr<kernels::Backend> inner_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  bool fail_ ABSL_GUARDED_BY(mu_) = false;
  int attends_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace smla::server::testing
