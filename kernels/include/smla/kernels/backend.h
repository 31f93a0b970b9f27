// The one interface every backend (cpu, cuda, hip) implements. Shaped for GPUs: the backend
// owns its memory, work is enqueued on a stream and completes at Synchronize. The CPU backend
// runs work as it is enqueued.
//
// Copies take host memory or this backend's device memory on either side (Allocate,
// OpenIpcMemory), whatever their names say: a GPU region's inputs are copied device to device.
//
// Ownership: Buffers free their memory when destroyed. Host arrays inside params (CSR, slots,
// positions, sink) are consumed before a call returns; backend-memory tensors must stay alive
// until the stream is synchronised.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "smla/kernels/device_info.h"
#include "smla/kernels/params.h"

namespace smla::kernels {

// Owned backend memory; move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, size_t size, std::function<void(void*)> release)
      : data_(data), size_(size), release_(std::move(release)) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      release_ = std::move(o.release_);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  void* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void Reset() {
    if (data_ != nullptr && release_) release_(data_);
    data_ = nullptr;
    size_ = 0;
  }
  void* data_ = nullptr;
  size_t size_ = 0;
  std::function<void(void*)> release_;
};

// An ordered queue of work on a backend.
class Stream {
 public:
  virtual ~Stream() = default;
};

// One copy of a batch (Backend::CopyBatch).
struct CopyOp {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};
// kOnDevice: both sides in backend memory (a peer's, opened through IPC, included) or page-locked
// memory from AllocateHost, which the device addresses. A GPU backend runs such a batch as one
// kernel: the runtime's device-to-device copies cost several microseconds each however small.
enum class CopyDirection : uint8_t { kToDevice = 0, kToHost = 1, kOnDevice = 2 };

// A mark on a stream's timeline, for timing device work (Backend::RecordEvent).
class Event {
 public:
  virtual ~Event() = default;
};

// The host clock's reading when the event was recorded: the default events, exact where work
// runs as it is enqueued.
class HostClockEvent : public Event {
 public:
  std::chrono::steady_clock::time_point at;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const DeviceInfo& device() const = 0;

  virtual absl::StatusOr<Buffer> Allocate(size_t bytes) = 0;
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream() = 0;

  virtual absl::Status CopyToDevice(void* dst, const void* src, size_t bytes, Stream& stream) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes, Stream& stream) = 0;
  virtual absl::Status Fill(void* dst, uint8_t byte, size_t bytes, Stream& stream) = 0;
  // Independent copies in one direction (no two overlap), enqueued together: a GPU backend
  // issues them as one runtime call where its runtime has batches. On GPU backends the host
  // sides must be page-locked (AllocateHost, RegisterHostMemory). The default copies one by one.
  virtual absl::Status CopyBatch(std::span<const CopyOp> copies, CopyDirection direction,
                                 Stream& stream) {
    for (const CopyOp& c : copies) {
      absl::Status s = direction == CopyDirection::kToHost
                           ? CopyToHost(c.dst, c.src, c.bytes, stream)
                           : CopyToDevice(c.dst, c.src, c.bytes, stream);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Quantises bf16 rows into a pool at the given slots.
  virtual absl::Status WriteRows(const WriteRowsParams& params, Stream& stream) = 0;
  // Expands MXFP8 query vectors into bf16 (Mxfp8ToBf16Bits of codec/mxfp8_query.h per lane, so
  // every backend writes the same bits). Codes and scales are not checked for NaN here: the
  // caller rejects them first (a NaN lane becomes a bf16 NaN).
  virtual absl::Status ExpandMxfp8Query(const ExpandQueryParams& params, Stream& stream) = 0;
  // Flags the groups whose input ranges hold a value their check refuses, and translates the
  // chosen entries into slots, flagging the groups with an entry out of range: one pass, so one
  // launch on a GPU.
  virtual absl::Status CheckInputs(const CheckInputsParams& params, Stream& stream) = 0;
  // Sparse MLA over both segments with the epilogue (docs/operator.md). Validates first: a bad
  // call returns InvalidArgument / Unimplemented before any work is enqueued.
  virtual absl::Status Attend(const AttendParams& params, Stream& stream) = 0;

  // Waits for everything enqueued on the stream; reports asynchronous device errors.
  virtual absl::Status Synchronize(Stream& stream) = 0;

  // Timing of device work: RecordEvent marks the point of the stream after everything enqueued
  // on it so far; once both events are complete (the stream synchronised), ElapsedSeconds is
  // the device time between them. The defaults read the host clock at RecordEvent, which is the
  // device time of a backend that runs work as it is enqueued (the CPU backend); a GPU backend
  // records events on the device.
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent() {
    return std::unique_ptr<Event>(std::make_unique<HostClockEvent>());
  }
  virtual absl::Status RecordEvent(Event& event, Stream& /*stream*/) {
    auto* e = dynamic_cast<HostClockEvent*>(&event);
    if (e == nullptr) return absl::InvalidArgumentError("event was not created by this backend");
    e->at = std::chrono::steady_clock::now();
    return absl::OkStatus();
  }
  virtual absl::StatusOr<double> ElapsedSeconds(const Event& start, const Event& end) {
    const auto* a = dynamic_cast<const HostClockEvent*>(&start);
    const auto* b = dynamic_cast<const HostClockEvent*>(&end);
    if (a == nullptr || b == nullptr) {
      return absl::InvalidArgumentError("event was not created by this backend");
    }
    return std::chrono::duration<double>(b->at - a->at).count();
  }

  // Host memory that many calls copy from and to (a client's shared-memory region): a GPU
  // backend page-locks it so those copies are direct DMA instead of synchronous bounce-buffer
  // copies. The memory must be unregistered before it is unmapped. Where copies gain nothing
  // (the CPU backend) both do nothing.
  virtual absl::Status RegisterHostMemory(void* /*data*/, size_t /*bytes*/) {
    return absl::OkStatus();
  }
  virtual void UnregisterHostMemory(void* /*data*/) {}
  // Device memory another process on this node exported (an IPC memory handle: a GPU region,
  // docs/architecture.md "GPU regions"), its first `bytes` bytes, usable by this backend's copies
  // and closed when the Buffer goes. INVALID_ARGUMENT for a handle it cannot open or an
  // allocation shorter than `bytes`; UNIMPLEMENTED where the backend has no device memory.
  virtual absl::StatusOr<Buffer> OpenIpcMemory(std::span<const uint8_t> /*handle*/,
                                               size_t /*bytes*/) {
    return absl::UnimplementedError(
        "GPU regions need a GPU backend; this server runs the CPU backend");
  }
  // Page-locked host memory for gathering many small inputs into one copy. Unimplemented where
  // a copy to backend memory is a plain memcpy anyway (the CPU backend).
  virtual absl::StatusOr<Buffer> AllocateHost(size_t /*bytes*/) {
    return absl::UnimplementedError("this backend has no page-locked host memory");
  }
};

enum class BackendChoice : uint8_t { kAuto = 0, kCpu = 1, kCuda = 2, kHip = 3 };

struct BackendOptions {
  int32_t cpu_threads = 0;  // 0 = hardware concurrency
  int32_t device_ordinal = 0;
};

// Creates a backend: kAuto takes the GPU backend compiled in when a device is present, else
// the CPU backend. Naming a backend that is not compiled in or has no device is an error.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(BackendChoice choice,
                                                       const BackendOptions& options = {});
std::optional<BackendChoice> ParseBackendChoice(std::string_view name);

}  // namespace smla::kernels
