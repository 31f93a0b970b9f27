#include "gpu/ipc_memory.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "smla/kernels/gpu/runtime.h"

#if !defined(SMLA_GPU_HIP)
#include <cuda.h>  // types of the driver entry point only; libcuda is not linked
#endif

namespace smla::kernels::gpu {
namespace {

#if defined(SMLA_GPU_HIP)
using IpcHandle = hipIpcMemHandle_t;
Error OpenHandle(void** p, const IpcHandle& h) {
  return hipIpcOpenMemHandle(p, h, hipIpcMemLazyEnablePeerAccess);
}
void CloseHandle(void* p) { static_cast<void>(hipIpcCloseMemHandle(p)); }
// The allocation that holds `p`: its start and size.
absl::Status AllocationOf(void* p, uintptr_t* base, size_t* size) {
  hipDeviceptr_t b = nullptr;
  SMLA_GPU_RETURN_IF_ERROR(hipMemGetAddressRange(&b, size, reinterpret_cast<hipDeviceptr_t>(p)));
  *base = reinterpret_cast<uintptr_t>(b);
  return absl::OkStatus();
}
#else
using IpcHandle = cudaIpcMemHandle_t;
Error OpenHandle(void** p, const IpcHandle& h) {
  return cudaIpcOpenMemHandle(p, h, cudaIpcMemLazyEnablePeerAccess);
}
void CloseHandle(void* p) { static_cast<void>(cudaIpcCloseMemHandle(p)); }
// The runtime has no call for an allocation's extent; the driver's is reached through the
// runtime's entry-point lookup, so the binary needs no link to libcuda.
absl::Status AllocationOf(void* p, uintptr_t* base, size_t* size) {
  using GetRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static GetRange get_range = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      static_cast<void>(cudaGetLastError());
      fn = nullptr;
    }
    return reinterpret_cast<GetRange>(fn);
  }();
  if (get_range == nullptr) {
    return absl::InternalError("the CUDA driver has no cuMemGetAddressRange");
  }
  CUdeviceptr b = 0;
  if (const CUresult r = get_range(&b, size, reinterpret_cast<CUdeviceptr>(p)); r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuMemGetAddressRange failed (", r, ")"));
  }
  *base = static_cast<uintptr_t>(b);
  return absl::OkStatus();
}
#endif

}  // namespace

absl::StatusOr<Buffer> OpenIpcMemory(std::span<const uint8_t> handle, size_t bytes) {
  if (handle.size() != sizeof(IpcHandle)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_handle: ", handle.size(), " bytes, an IPC memory handle has ", sizeof(IpcHandle)));
  }
  IpcHandle h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  if (const Error e = OpenHandle(&p, h); e != kSuccess) {
    static_cast<void>(GetLastError());  // not sticky: the handle was bad, not the device
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_handle: no device memory this server can open (", ErrorString(e),
        "); the memory must be a live allocation of another process on a GPU this one reaches"));
  }
  Buffer opened(p, bytes, [](void* q) { CloseHandle(q); });
  uintptr_t base = 0;
  size_t extent = 0;
  if (absl::Status st = AllocationOf(p, &base, &extent); !st.ok()) return st;
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  if (start < base || bytes > extent - (start - base)) {
    return absl::InvalidArgumentError(
        absl::StrCat("size: ", bytes, " bytes, the allocation holds ", extent - (start - base)));
  }
  return opened;
}

}  // namespace smla::kernels::gpu
