// A backend wrapper for fault tests (--inject_backend_failure_after N): after N more Attend
// calls from the moment it is armed, every Attend fails with INTERNAL, as a device fault would.
// Everything else is passed through.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "smla/kernels/backend.h"

namespace smla::server::edge {

class FaultInjectingBackend final : public kernels::Backend {
 public:
  FaultInjectingBackend(std::unique_ptr<kernels::Backend> inner, int64_t attends_before_failure)
      : inner_(std::move(inner)), budget_(attends_before_failure) {}

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
  absl::Status WriteRows(const kernels::WriteRowsParams& params,
                         kernels::Stream& stream) override {
    return inner_->WriteRows(params, stream);
  }
  absl::Status Attend(const kernels::AttendParams& params, kernels::Stream& stream) override {
    if (armed_.load() && budget_.fetch_sub(1) <= 0) {
      return absl::InternalError("injected backend failure (--inject_backend_failure_after)");
    }
    return inner_->Attend(params, stream);
  }
  absl::Status Synchronize(kernels::Stream& stream) override {
    return inner_->Synchronize(stream);
  }

 private:
  std::unique_ptr<kernels::Backend> inner_;
  std::atomic<bool> armed_{false};
  std::atomic<int64_t> budget_;
};

}  // namespace smla::server::edge
