// The GPU backend (backend.h) over the portable runtime layer: owned device memory, streams,
// events, the row writers and sparse MLA attention. Attend validates, stages the call's small
// host arrays (CSR, positions, sink) into a per-stream device workspace with one asynchronous
// copy from pinned memory (or, when the caller's arrays are page-locked already, copies them
// there directly), plans the launch (attend_launch.h) and enqueues the kernels.
#include "smla/kernels/gpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gpu/attend_launch.h"
#include "gpu/ipc_memory.h"
#include "gpu/kernel_params.h"
#include "smla/base/align.h"
#include "smla/kernels/backend.h"
#include "smla/kernels/epilogue.h"
#include "smla/kernels/gpu/runtime.h"
#include "smla/kernels/plan.h"
#include "smla/kernels/validate.h"

namespace smla::kernels {
namespace {

using gpu::StreamHandle;

// A stream with its staging memory: pinned host bytes for the call's small arrays (reused once
// the copy that read them has completed) and a device workspace that grows on demand.
class GpuStream : public Stream {
 public:
  ~GpuStream() override {
    // Teardown errors have nowhere to go (HIP marks its error type nodiscard).
    if (handle_ != nullptr) {
      static_cast<void>(gpu::StreamSynchronize(handle_));
      static_cast<void>(gpu::StreamDestroy(handle_));
    }
    if (staged_ != nullptr) static_cast<void>(gpu::EventDestroy(staged_));
    if (pinned_ != nullptr) static_cast<void>(gpu::FreeHost(pinned_));
    if (workspace_ != nullptr) static_cast<void>(gpu::Free(workspace_));
  }

  absl::Status Init() {
    SMLA_GPU_RETURN_IF_ERROR(gpu::StreamCreate(&handle_));
    SMLA_GPU_RETURN_IF_ERROR(gpu::EventCreate(&staged_));
    return absl::OkStatus();
  }

  StreamHandle handle() const { return handle_; }

  // Pinned host bytes, free for writing: waits for the previous staging copy to finish.
  absl::StatusOr<uint8_t*> Pinned(size_t bytes) {
    if (staged_pending_) {
      SMLA_GPU_RETURN_IF_ERROR(gpu::EventSynchronize(staged_));
      staged_pending_ = false;
    }
    if (bytes > pinned_size_) {
      if (pinned_ != nullptr) SMLA_GPU_RETURN_IF_ERROR(gpu::FreeHost(pinned_));
      pinned_ = nullptr;
      pinned_size_ = 0;
      const size_t want = std::max<size_t>(bytes, 1 << 16);
      void* p = nullptr;
      SMLA_GPU_RETURN_IF_ERROR(gpu::MallocHost(&p, want));
      pinned_ = static_cast<uint8_t*>(p);
      pinned_size_ = want;
    }
    return pinned_;
  }

  // Device workspace of at least `bytes`; growing waits for work that may still use it.
  absl::StatusOr<uint8_t*> Workspace(size_t bytes) {
    if (bytes > workspace_size_) {
      SMLA_GPU_RETURN_IF_ERROR(gpu::StreamSynchronize(handle_));
      if (workspace_ != nullptr) SMLA_GPU_RETURN_IF_ERROR(gpu::Free(workspace_));
      workspace_ = nullptr;
      workspace_size_ = 0;
      const size_t want = std::max<size_t>(bytes + bytes / 4, 1 << 20);
      void* p = nullptr;
      SMLA_GPU_RETURN_IF_ERROR(gpu::Malloc(&p, want));
      workspace_ = static_cast<uint8_t*>(p);
      workspace_size_ = want;
    }
    return workspace_;
  }

  // Copies `bytes` of the pinned buffer to the workspace and marks the pinned buffer busy.
  absl::Status Upload(size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    SMLA_GPU_RETURN_IF_ERROR(gpu::MemcpyH2DAsync(workspace_, pinned_, bytes, handle_));
    SMLA_GPU_RETURN_IF_ERROR(gpu::EventRecord(staged_, handle_));
    staged_pending_ = true;
    return absl::OkStatus();
  }

 private:
  StreamHandle handle_ = nullptr;
  gpu::EventHandle staged_ = nullptr;
  bool staged_pending_ = false;
  uint8_t* pinned_ = nullptr;
  size_t pinned_size_ = 0;
  uint8_t* workspace_ = nullptr;
  size_t workspace_size_ = 0;
};

class GpuEvent : public Event {
 public:
  ~GpuEvent() override {
    if (handle != nullptr) static_cast<void>(gpu::EventDestroy(handle));
  }
  gpu::EventHandle handle = nullptr;
};

class GpuBackend : public Backend {
 public:
  GpuBackend(DeviceInfo info, bool batch_copies)
      : info_(std::move(info)), batch_copies_(batch_copies) {}

  const DeviceInfo& device() const override { return info_; }

  absl::StatusOr<Buffer> Allocate(size_t bytes) override {
    void* p = nullptr;
    if (bytes > 0) SMLA_GPU_RETURN_IF_ERROR(gpu::Malloc(&p, bytes));
    return Buffer(p, bytes, [](void* q) { static_cast<void>(gpu::Free(q)); });
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    auto s = std::make_unique<GpuStream>();
    if (absl::Status st = s->Init(); !st.ok()) return st;
    return std::unique_ptr<Stream>(std::move(s));
  }

  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes, Stream& stream) override {
    auto* s = Cast(stream);
    if (s == nullptr) return NotOurs();
    SMLA_GPU_RETURN_IF_ERROR(gpu::MemcpyAsync(dst, src, bytes, s->handle()));
    return absl::OkStatus();
  }

  absl::Status CopyToHost(void* dst, const void* src, size_t bytes, Stream& stream) override {
    auto* s = Cast(stream);
    if (s == nullptr) return NotOurs();
    SMLA_GPU_RETURN_IF_ERROR(gpu::MemcpyAsync(dst, src, bytes, s->handle()));
    return absl::OkStatus();
  }

  absl::Status Fill(void* dst, uint8_t byte, size_t bytes, Stream& stream) override {
    auto* s = Cast(stream);
    if (s == nullptr) return NotOurs();
    SMLA_GPU_RETURN_IF_ERROR(gpu::MemsetAsync(dst, byte, bytes, s->handle()));
    return absl::OkStatus();
  }

  absl::Status CopyBatch(std::span<const CopyOp> copies, CopyDirection direction,
                         Stream& stream) override {
    auto* s = Cast(stream);
    if (s == nullptr) return NotOurs();
    return Copies(copies, direction, s->handle());
  }

  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    auto e = std::make_unique<GpuEvent>();
    SMLA_GPU_RETURN_IF_ERROR(gpu::EventCreate(&e->handle));
    return std::unique_ptr<Event>(std::move(e));
  }

  absl::Status RecordEvent(Event& event, Stream& stream) override {
    auto* s = Cast(stream);
    auto* e = dynamic_cast<GpuEvent*>(&event);
    if (s == nullptr || e == nullptr) return NotOurs();
    SMLA_GPU_RETURN_IF_ERROR(gpu::EventRecord(e->handle, s->handle()));
    return absl::OkStatus();
  }

  absl::StatusOr<double> ElapsedSeconds(const Event& start, const Event& end) override {
    const auto* a = dynamic_cast<const GpuEvent*>(&start);
    const auto* b = dynamic_cast<const GpuEvent*>(&end);
    if (a == nullptr || b == nullptr) return NotOurs();
    float ms = 0;
    SMLA_GPU_RETURN_IF_ERROR(gpu::EventElapsedMs(&ms, a->handle, b->handle));
    return double{ms} * 1e-3;
  }

  absl::Status WriteRows(const WriteRowsParams& params, Stream& stream) override {
    if (absl::Status st = ValidateWriteRows(params); !st.ok()) return st;
    auto* s = Cast(stream);
    if (s == nullptr) return NotOurs();
    const int64_t n = static_cast<int64_t>(params.slots.size());
    if (n == 0) return absl::OkStatus();
    gpu::WriteRowsKernelParams k;
    k.slots = params.arrays.Find(params.slots);
    if (k.slots == nullptr) {
      // Not in the caller's mirror: uploaded here.
      const int64_t bytes = n * static_cast<int64_t>(sizeof(int64_t));
      absl::StatusOr<uint8_t*> pinned = s->Pinned(bytes);
      if (!pinned.ok()) return pinned.status();
      absl::StatusOr<uint8_t*> ws = s->Workspace(bytes);
      if (!ws.ok()) return ws.status();
      std::memcpy(*pinned, params.slots.data(), bytes);
      if (absl::Status st = s->Upload(bytes); !st.ok()) return st;
      k.slots = reinterpret_cast<const int64_t*>(*ws);
    }
    k.cache = params.cache;
    k.rows = static_cast<const uint16_t*>(params.rows);
    k.num_rows = n;
    return gpu::LaunchWriteRows(k, s->handle());
  }

  absl::Status ExpandMxfp8Query(const ExpandQueryParams& params, Stream& stream) override {
    if (absl::Status st = ValidateExpandQuery(params); !st.ok()) return st;
    auto* s = Cast(stream);
    if (s == nullptr) return NotOurs();
    if (!IsAligned(params.codes, 2) || !IsAligned(params.out, 4)) {
      return absl::InvalidArgumentError("codes must be 2-byte aligned and out 4-byte aligned");
    }
    gpu::ExpandQueryKernelParams k;
    k.codes = params.codes;
    k.scales = params.scales;
    k.out = static_cast<uint16_t*>(params.out);
    k.lanes = params.vectors * params.width;
    return gpu::LaunchExpandQuery(k, s->handle());
  }

  absl::Status CheckInputs(const CheckInputsParams& params, Stream& stream) override {
    if (absl::Status st = ValidateCheckInputs(params); !st.ok()) return st;
    auto* s = Cast(stream);
    if (s == nullptr) return NotOurs();
    if (!IsAligned(params.rows.old, 8)) {
      return absl::InvalidArgumentError("rows.old must be 8-byte aligned");
    }
    return gpu::LaunchCheckInputs(params, s->handle());
  }

  absl::Status Attend(const AttendParams& params, Stream& stream) override {
    if (absl::Status st = ValidateAttend(params); !st.ok()) return st;
    auto* s = Cast(stream);
    if (s == nullptr) return NotOurs();
    if (params.num_rows == 0) return absl::OkStatus();
    absl::StatusOr<gpu::AttendLaunch> launch = gpu::PlanAttend(params, info_);
    if (!launch.ok()) return launch.status();
    // Arrays in the caller's mirror are read there; the others are staged and uploaded in one
    // copy (nothing, when the mirror holds them all).
    absl::StatusOr<uint8_t*> ws = s->Workspace(launch->workspace_bytes);
    if (!ws.ok()) return ws.status();
    if (launch->staged_bytes > 0) {
      absl::StatusOr<uint8_t*> pinned = s->Pinned(launch->staged_bytes);
      if (!pinned.ok()) return pinned.status();
      gpu::StageAttend(params, *launch, *pinned);
      if (absl::Status st = s->Upload(launch->staged_bytes); !st.ok()) return st;
    }
    gpu::BindAttend(*launch, *ws);
    return gpu::RunAttend(*launch, s->handle());
  }

  absl::Status Synchronize(Stream& stream) override {
    auto* s = Cast(stream);
    if (s == nullptr) return NotOurs();
    SMLA_GPU_RETURN_IF_ERROR(gpu::StreamSynchronize(s->handle()));
    SMLA_GPU_RETURN_IF_ERROR(gpu::GetLastError());
    return absl::OkStatus();
  }

  absl::Status RegisterHostMemory(void* data, size_t bytes) override {
#if defined(SMLA_GPU_HIP)
    SMLA_GPU_RETURN_IF_ERROR(hipHostRegister(data, bytes, hipHostRegisterDefault));
#else
    SMLA_GPU_RETURN_IF_ERROR(cudaHostRegister(data, bytes, cudaHostRegisterDefault));
#endif
    return absl::OkStatus();
  }

  void UnregisterHostMemory(void* data) override {
    // Nothing to report to: the caller is about to unmap the memory either way.
#if defined(SMLA_GPU_HIP)
    static_cast<void>(hipHostUnregister(data));
#else
    static_cast<void>(cudaHostUnregister(data));
#endif
  }

  absl::StatusOr<Buffer> OpenIpcMemory(std::span<const uint8_t> handle, size_t bytes) override {
    return gpu::OpenIpcMemory(handle, bytes);
  }

  absl::StatusOr<Buffer> AllocateHost(size_t bytes) override {
    void* p = nullptr;
    if (bytes > 0) SMLA_GPU_RETURN_IF_ERROR(gpu::MallocHost(&p, bytes));
    return Buffer(p, bytes, [](void* q) { static_cast<void>(gpu::FreeHost(q)); });
  }

 private:
  // Within the device, one copy kernel. Else one batch call where the runtime has it; one copy
  // each where it refused a batch (once refused, the backend stops trying).
  absl::Status Copies(std::span<const CopyOp> copies, CopyDirection direction,
                      StreamHandle stream) {
    if (copies.empty()) return absl::OkStatus();
    if (direction == CopyDirection::kOnDevice) return gpu::LaunchDeviceCopies(copies, stream);
    if (batch_copies_.load(std::memory_order_relaxed)) {
      std::vector<void*> dsts(copies.size());
      std::vector<const void*> srcs(copies.size());
      std::vector<size_t> sizes(copies.size());
      for (size_t i = 0; i < copies.size(); ++i) {
        dsts[i] = copies[i].dst;
        srcs[i] = copies[i].src;
        sizes[i] = copies[i].bytes;
      }
      if (gpu::MemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), copies.size(), stream) ==
          gpu::kSuccess) {
        return absl::OkStatus();
      }
      static_cast<void>(gpu::GetLastError());  // the refusal is not sticky; copy one by one
      batch_copies_.store(false, std::memory_order_relaxed);
    }
    for (const CopyOp& c : copies) {
      SMLA_GPU_RETURN_IF_ERROR(gpu::MemcpyAsync(c.dst, c.src, c.bytes, stream));
    }
    return absl::OkStatus();
  }

  static GpuStream* Cast(Stream& s) { return dynamic_cast<GpuStream*>(&s); }
  static absl::Status NotOurs() {
    return absl::InvalidArgumentError("stream was not created by this GPU backend");
  }

  DeviceInfo info_;
  std::atomic<bool> batch_copies_{true};
};

}  // namespace

bool GpuDevicePresent(int32_t ordinal) {
  int n = 0;
  if (gpu::GetDeviceCount(&n) != gpu::kSuccess) {
    static_cast<void>(gpu::GetLastError());  // clear the sticky "no device" error
    return false;
  }
  return ordinal >= 0 && ordinal < n;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateGpuBackend(const BackendOptions& options) {
  if (!GpuDevicePresent(options.device_ordinal)) {
    return absl::FailedPreconditionError(
        absl::StrCat("no GPU device at ordinal ", options.device_ordinal));
  }
  SMLA_GPU_RETURN_IF_ERROR(gpu::SetDevice(options.device_ordinal));
  gpu::DeviceFacts facts;
  SMLA_GPU_RETURN_IF_ERROR(gpu::QueryDevice(options.device_ordinal, &facts));
  DeviceInfo info;
  info.name = facts.name;
  info.arch = facts.arch;
  info.compute_units = facts.compute_units;
  info.warp_size = facts.warp_size;
  info.l2_bytes = facts.l2_bytes;
  info.shared_memory_per_block = facts.shared_memory_per_block;
  info.total_memory = facts.total_memory;
#if defined(SMLA_GPU_HIP)
  info.kind = BackendKind::kHip;
  if (info.arch != "gfx950") {
    return absl::FailedPreconditionError(absl::StrCat(
        "the HIP kernels are built for gfx950; device '", info.name, "' is ", info.arch));
  }
#else
  info.kind = BackendKind::kCuda;
  if (facts.major < 9) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA kernels are built for sm_90a; device '", info.name, "' is ", info.arch));
  }
#endif
  if (absl::Status st = gpu::PrepareAttendVariants(info.shared_memory_per_block); !st.ok()) {
    return st;
  }
  // SMLA_GPU_COPY_BATCH=0 issues CopyBatch as one copy call each, to compare the two paths.
  const char* batch = std::getenv("SMLA_GPU_COPY_BATCH");
  const bool batch_copies = batch == nullptr || std::string_view(batch) != "0";
  return std::unique_ptr<Backend>(std::make_unique<GpuBackend>(std::move(info), batch_copies));
}

}  // namespace smla::kernels
