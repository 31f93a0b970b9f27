// A backend wrapper for fault tests. Once armed: with --inject_backend_failure_after N, every
// Attend after N more fails with INTERNAL, as a device fault would; with
// --inject_attend_delay_ms D, every Attend is held D ms before it runs, as on a slow device, so
// that tests can queue calls behind a running step on any backend. Every other operation is
// passed through, the ones with defaults included (a default would quietly change what the
// wrapped backend does: host-clock timing, one-by-one copies, no GPU regions).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "smla/kernels/backend.h"

namespace smla::server::edge {

struct FaultOptions {
  int64_t attends_before_failure = -1;  // -1: never fail
  absl::Duration attend_delay;
};

class FaultInjectingBackend final : public kernels::Backend {
 public:
  FaultInjectingBackend(std::unique_ptr<kernels::Backend> inner, const FaultOptions& options)
      : inner_(std::move(inner)),
        fail_(options.attends_before_failure >= 0),
        budget_(options.attends_before_failure),
        delay_(options.attend_delay) {}

  // Starts counting (after warm-up, so the count is in served calls).
  void Arm() { armed_.store(true); }

  const kernels::DeviceInfo& device() const override { return inner_->device(); }
  absl::StatusOr<kernels::Buffer> Allocate(size_t bytes) override {
    return inner_->Allocate(bytes);
  }
  absl::StatusOr<std::unique_ptr<kernels::Stream>> CreateStream() override {
    return inner_->CreateStream();
  }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes,
                            kernels::Stream& stream) override {
    return inner_->CopyToDevice(dst, src, bytes, stream);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes,
                          kernels::Stream& stream) override {
    return inner_->CopyToHost(dst, src, bytes, stream);
  }
  absl::Status Fill(void* dst, uint8_t byte, size_t bytes, kernels::Stream& stream) override {
    return inner_->Fill(dst, byte, bytes, stream);
  }
  absl::Status CopyBatch(std::span<const kernels::CopyOp> copies, kernels::CopyDirection direction,
                         kernels::Stream& stream) override {
    return inner_->CopyBatch(copies, direction, stream);
  }
  absl::Status WriteRows(const kernels::WriteRowsParams& params, kernels::Stream& stream) override {
    return inner_->WriteRows(params, stream);
  }
  absl::Status ExpandMxfp8Query(const kernels::ExpandQueryParams& params,
                                kernels::Stream& stream) override {
    return inner_->ExpandMxfp8Query(params, stream);
  }
  absl::Status CheckInputs(const kernels::CheckInputsParams& params,
                           kernels::Stream& stream) override {
    return inner_->CheckInputs(params, stream);
  }
  absl::Status Attend(const kernels::AttendParams& params, kernels::Stream& stream) override {
    if (!armed_.load()) return inner_->Attend(params, stream);
    if (fail_ && budget_.fetch_sub(1) <= 0) {
      return absl::InternalError("injected backend failure (--inject_backend_failure_after)");
    }
    if (delay_ > absl::ZeroDuration()) absl::SleepFor(delay_);
    return inner_->Attend(params, stream);
  }
  absl::Status Synchronize(kernels::Stream& stream) override { return inner_->Synchronize(stream); }
  absl::StatusOr<std::unique_ptr<kernels::Event>> CreateEvent() override {
    return inner_->CreateEvent();
  }
  absl::Status RecordEvent(kernels::Event& event, kernels::Stream& stream) override {
    return inner_->RecordEvent(event, stream);
  }
  absl::StatusOr<double> ElapsedSeconds(const kernels::Event& start,
                                        const kernels::Event& end) override {
    return inner_->ElapsedSeconds(start, end);
  }
  absl::Status RegisterHostMemory(void* data, size_t bytes) override {
    return inner_->RegisterHostMemory(data, bytes);
  }
  void UnregisterHostMemory(void* data) override { inner_->UnregisterHostMemory(data); }
  absl::StatusOr<kernels::Buffer> OpenIpcMemory(std::span<const uint8_t> handle,
                                                size_t bytes) override {
    return inner_->OpenIpcMemory(handle, bytes);
  }
  absl::StatusOr<kernels::Buffer> AllocateHost(size_t bytes) override {
    return inner_->AllocateHost(bytes);
  }

 private:
  std::unique_ptr<kernels::Backend> inner_;
  const bool fail_;
  std::atomic<bool> armed_{false};
  std::atomic<int64_t> budget_;
  const absl::Duration delay_;
};

}  // namespace smla::server::edge
