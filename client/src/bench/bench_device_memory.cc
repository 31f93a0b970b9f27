#include "bench_device_memory.h"

#include <cstring>

#include "absl/strings/str_cat.h"

#if defined(SMLA_WITH_CUDA)
#include <cuda_runtime.h>
using GpuError = cudaError_t;
using IpcHandle = cudaIpcMemHandle_t;
constexpr GpuError kGpuOk = cudaSuccess;
#define GpuMalloc cudaMalloc
#define GpuFree cudaFree
#define GpuIpcGetHandle cudaIpcGetMemHandle
#define GpuCopyUp(d, s, n) cudaMemcpy(d, s, n, cudaMemcpyHostToDevice)
#define GpuErrorString cudaGetErrorString
#elif defined(SMLA_WITH_HIP)
#include <hip/hip_runtime.h>
using GpuError = hipError_t;
using IpcHandle = hipIpcMemHandle_t;
constexpr GpuError kGpuOk = hipSuccess;
#define GpuMalloc hipMalloc
#define GpuFree hipFree
#define GpuIpcGetHandle hipIpcGetMemHandle
#define GpuCopyUp(d, s, n) hipMemcpy(d, s, n, hipMemcpyHostToDevice)
#define GpuErrorString hipGetErrorString
#endif

namespace smla::bench {

#if defined(SMLA_WITH_CUDA) || defined(SMLA_WITH_HIP)

namespace {
absl::Status Check(GpuError e, const char* what) {
  if (e == kGpuOk) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", GpuErrorString(e)));
}
}  // namespace

absl::StatusOr<std::unique_ptr<DeviceMemory>> DeviceMemory::Create(size_t bytes) {
  std::unique_ptr<DeviceMemory> m(new DeviceMemory());
  if (absl::Status st = Check(GpuMalloc(&m->data_, bytes), "device allocation"); !st.ok()) {
    return st;
  }
  m->bytes_ = bytes;
  IpcHandle h;
  if (absl::Status st = Check(GpuIpcGetHandle(&h, m->data_), "IPC handle"); !st.ok()) return st;
  m->handle_.resize(sizeof(h));
  std::memcpy(m->handle_.data(), &h, sizeof(h));
  return m;
}

DeviceMemory::~DeviceMemory() {
  if (data_ != nullptr) static_cast<void>(GpuFree(data_));
}

absl::Status DeviceMemory::Upload(std::span<const uint8_t> host) {
  if (host.size() > bytes_) return absl::OutOfRangeError("upload past the allocation");
  return Check(GpuCopyUp(data_, host.data(), host.size()), "upload");
}

#else

absl::StatusOr<std::unique_ptr<DeviceMemory>> DeviceMemory::Create(size_t) {
  return absl::UnimplementedError(
      "GPU-region transports need a CUDA or HIP build of smla-bench (SMLA_GPU_BACKEND)");
}
DeviceMemory::~DeviceMemory() = default;
absl::Status DeviceMemory::Upload(std::span<const uint8_t>) {
  return absl::UnimplementedError("no GPU runtime in this build");
}

#endif

}  // namespace smla::bench
