// The portable GPU runtime layer (docs/gpu.md, "One source, two vendors"): the few runtime calls
// that differ between CUDA and HIP, typed, with errors turned into absl::Status. On NVIDIA this
// maps to the CUDA runtime directly; HIP headers are never included there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#if defined(__HIP_PLATFORM_AMD__) || defined(SMLA_WITH_HIP)
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1  // Debian's HIP headers need the platform named
#endif
#include <hip/hip_runtime.h>
#define SMLA_GPU_HIP 1
// Kernel parameters already live in constant memory on AMD; the CUDA qualifier has no meaning.
#ifndef __grid_constant__
#define __grid_constant__
#endif
#else
#include <cuda_runtime.h>
#define SMLA_GPU_CUDA 1
#endif

namespace smla::kernels::gpu {

#if defined(SMLA_GPU_HIP)
using Error = hipError_t;
using StreamHandle = hipStream_t;
using EventHandle = hipEvent_t;
inline constexpr Error kSuccess = hipSuccess;
inline const char* ErrorString(Error e) { return hipGetErrorString(e); }
inline Error GetLastError() { return hipGetLastError(); }
inline Error Malloc(void** p, size_t n) { return hipMalloc(p, n); }
inline Error Free(void* p) { return hipFree(p); }
inline Error MallocHost(void** p, size_t n) { return hipHostMalloc(p, n, hipHostMallocDefault); }
inline Error FreeHost(void* p) { return hipHostFree(p); }
inline Error MemcpyH2DAsync(void* d, const void* s, size_t n, StreamHandle st) {
  return hipMemcpyAsync(d, s, n, hipMemcpyHostToDevice, st);
}
inline Error MemcpyD2HAsync(void* d, const void* s, size_t n, StreamHandle st) {
  return hipMemcpyAsync(d, s, n, hipMemcpyDeviceToHost, st);
}
inline Error MemcpyD2DAsync(void* d, const void* s, size_t n, StreamHandle st) {
  return hipMemcpyAsync(d, s, n, hipMemcpyDeviceToDevice, st);
}
// Either side host or device memory (the runtime tells them apart by address).
inline Error MemcpyAsync(void* d, const void* s, size_t n, StreamHandle st) {
  return hipMemcpyAsync(d, s, n, hipMemcpyDefault, st);
}
inline Error MemsetAsync(void* d, int v, size_t n, StreamHandle st) {
  return hipMemsetAsync(d, v, n, st);
}
// Independent copies (no two overlap; host sides page-locked) after earlier work on the stream,
// in any order among themselves. HIP has no batch call: one copy each.
inline Error MemcpyBatchAsync(void* const* d, const void* const* s, const size_t* n, size_t count,
                              StreamHandle st) {
  for (size_t i = 0; i < count; ++i) {
    if (const Error e = hipMemcpyAsync(d[i], s[i], n[i], hipMemcpyDefault, st); e != hipSuccess) {
      return e;
    }
  }
  return hipSuccess;
}
inline Error StreamCreate(StreamHandle* s) {
  return hipStreamCreateWithFlags(s, hipStreamNonBlocking);
}
inline Error StreamDestroy(StreamHandle s) { return hipStreamDestroy(s); }
inline Error StreamSynchronize(StreamHandle s) { return hipStreamSynchronize(s); }
inline Error EventCreate(EventHandle* e) { return hipEventCreate(e); }
inline Error EventDestroy(EventHandle e) { return hipEventDestroy(e); }
inline Error EventRecord(EventHandle e, StreamHandle s) { return hipEventRecord(e, s); }
inline Error EventSynchronize(EventHandle e) { return hipEventSynchronize(e); }
inline Error EventElapsedMs(float* ms, EventHandle a, EventHandle b) {
  return hipEventElapsedTime(ms, a, b);
}
inline Error SetDevice(int d) { return hipSetDevice(d); }
inline Error GetDeviceCount(int* n) { return hipGetDeviceCount(n); }
inline Error SetMaxDynamicSharedBytes(const void* kernel, int bytes) {
  return hipFuncSetAttribute(kernel, hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
}
inline Error LaunchKernel(const void* kernel, dim3 grid, dim3 block, void** args,
                          size_t shared_bytes, StreamHandle s) {
  return hipLaunchKernel(kernel, grid, block, args, shared_bytes, s);
}
#else
using Error = cudaError_t;
using StreamHandle = cudaStream_t;
using EventHandle = cudaEvent_t;
inline constexpr Error kSuccess = cudaSuccess;
inline const char* ErrorString(Error e) { return cudaGetErrorString(e); }
inline Error GetLastError() { return cudaGetLastError(); }
inline Error Malloc(void** p, size_t n) { return cudaMalloc(p, n); }
inline Error Free(void* p) { return cudaFree(p); }
inline Error MallocHost(void** p, size_t n) { return cudaMallocHost(p, n); }
inline Error FreeHost(void* p) { return cudaFreeHost(p); }
inline Error MemcpyH2DAsync(void* d, const void* s, size_t n, StreamHandle st) {
  return cudaMemcpyAsync(d, s, n, cudaMemcpyHostToDevice, st);
}
inline Error MemcpyD2HAsync(void* d, const void* s, size_t n, StreamHandle st) {
  return cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToHost, st);
}
inline Error MemcpyD2DAsync(void* d, const void* s, size_t n, StreamHandle st) {
  return cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToDevice, st);
}
// Either side host or device memory (the runtime tells them apart by address).
inline Error MemcpyAsync(void* d, const void* s, size_t n, StreamHandle st) {
  return cudaMemcpyAsync(d, s, n, cudaMemcpyDefault, st);
}
inline Error MemsetAsync(void* d, int v, size_t n, StreamHandle st) {
  return cudaMemsetAsync(d, v, n, st);
}
// Independent copies (no two overlap; host sides page-locked) after earlier work on the stream,
// in any order among themselves: one runtime call for all of them from CUDA 13 on.
inline Error MemcpyBatchAsync(void* const* d, const void* const* s, const size_t* n, size_t count,
                              StreamHandle st) {
#if CUDART_VERSION >= 13000
  if (count == 0) return cudaSuccess;
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t first = 0;
  return cudaMemcpyBatchAsync(d, s, n, count, &attr, &first, 1, st);
#else
  for (size_t i = 0; i < count; ++i) {
    if (const Error e = cudaMemcpyAsync(d[i], s[i], n[i], cudaMemcpyDefault, st);
        e != cudaSuccess) {
      return e;
    }
  }
  return cudaSuccess;
#endif
}
inline Error StreamCreate(StreamHandle* s) {
  return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking);
}
inline Error StreamDestroy(StreamHandle s) { return cudaStreamDestroy(s); }
inline Error StreamSynchronize(StreamHandle s) { return cudaStreamSynchronize(s); }
inline Error EventCreate(EventHandle* e) { return cudaEventCreate(e); }
inline Error EventDestroy(EventHandle e) { return cudaEventDestroy(e); }
inline Error EventRecord(EventHandle e, StreamHandle s) { return cudaEventRecord(e, s); }
inline Error EventSynchronize(EventHandle e) { return cudaEventSynchronize(e); }
inline Error EventElapsedMs(float* ms, EventHandle a, EventHandle b) {
  return cudaEventElapsedTime(ms, a, b);
}
inline Error SetDevice(int d) { return cudaSetDevice(d); }
inline Error GetDeviceCount(int* n) { return cudaGetDeviceCount(n); }
inline Error SetMaxDynamicSharedBytes(const void* kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}
// Every kernel goes out as a programmatic dependent launch (sm_90 and later): it may be
// scheduled while the kernel before it on the stream finishes, and waits for that kernel inside
// (WaitForPriorGrid, kernels/src/gpu/grid_order.h), so that a small launch's kernels do not each
// pay the launch gap (docs/architecture.md, "Kernels that start early").
inline Error LaunchKernel(const void* kernel, dim3 grid, dim3 block, void** args,
                          size_t shared_bytes, StreamHandle s) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = s;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelExC(&config, kernel, args);
}
#endif

// LaunchKernel with typed arguments, each converted to its parameter's type first.
template <typename... Params, typename... Args>
Error Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, StreamHandle s,
             Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "one argument per parameter");
  std::tuple<std::remove_cvref_t<Params>...> values{std::forward<Args>(args)...};
  void* pointers[sizeof...(Params)];
  std::apply(
      [&pointers](auto&... v) {
        size_t i = 0;
        ((pointers[i++] = static_cast<void*>(&v)), ...);
      },
      values);
  return LaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, pointers, shared_bytes,
                      s);
}

// What the backend needs to know about a device, read once at start-up (docs/gpu.md). `arch`
// is "sm_90a"-style on NVIDIA and the gfx target ("gfx950") on AMD.
struct DeviceFacts {
  std::string name;
  std::string arch;
  int major = 0;  // NVIDIA compute capability; AMD reports its own approximation
  int minor = 0;
  int compute_units = 0;
  int warp_size = 0;
  int64_t l2_bytes = 0;
  int64_t shared_memory_per_block = 0;  // the opt-in maximum for dynamic shared memory
  int64_t total_memory = 0;
};

inline Error QueryDevice(int ordinal, DeviceFacts* f) {
#if defined(SMLA_GPU_HIP)
  hipDeviceProp_t prop;
  if (const Error e = hipGetDeviceProperties(&prop, ordinal); e != hipSuccess) return e;
  int shared = 0;
  // The per-workgroup LDS limit (160 KB on gfx950); the property struct of older HIP lacks it.
  if (const Error e =
          hipDeviceGetAttribute(&shared, hipDeviceAttributeMaxSharedMemoryPerBlock, ordinal);
      e != hipSuccess) {
    return e;
  }
  f->name = prop.name;
  std::string arch = prop.gcnArchName;  // e.g. "gfx950:sramecc+:xnack-"
  f->arch = arch.substr(0, arch.find(':'));
  f->shared_memory_per_block = shared;
#else
  cudaDeviceProp prop;
  if (const Error e = cudaGetDeviceProperties(&prop, ordinal); e != cudaSuccess) return e;
  f->name = prop.name;
  f->arch = std::string("sm_") + std::to_string(prop.major) + std::to_string(prop.minor) +
            (prop.major >= 9 ? "a" : "");
  f->shared_memory_per_block = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
#endif
  f->major = prop.major;
  f->minor = prop.minor;
  f->compute_units = prop.multiProcessorCount;
  f->warp_size = prop.warpSize;
  f->l2_bytes = prop.l2CacheSize;
  f->total_memory = static_cast<int64_t>(prop.totalGlobalMem);
  return kSuccess;
}

// A failed runtime call as a status naming the call: device errors are statuses, not crashes.
inline absl::Status ToStatus(Error e, const char* what) {
  if (e == kSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", ErrorString(e)));
}

}  // namespace smla::kernels::gpu

// Evaluates a runtime call and returns its error as a status from the enclosing function.
#define SMLA_GPU_RETURN_IF_ERROR(call)                             \
  do {                                                             \
    const ::smla::kernels::gpu::Error smla_gpu_err_ = (call);      \
    if (smla_gpu_err_ != ::smla::kernels::gpu::kSuccess) {         \
      return ::smla::kernels::gpu::ToStatus(smla_gpu_err_, #call); \
    }                                                              \
  } while (0)
