// The portable GPU runtime layer (gpu.md, "One source, two vendors"): the few runtime calls
// that differ between CUDA and HIP, typed, with errors turned into absl::Status. On NVIDIA this
// maps to the CUDA runtime directly; HIP headers are never included there.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#if defined(__HIP_PLATFORM_AMD__) || defined(SMLA_WITH_HIP)
#include <hip/hip_runtime.h>
#define SMLA_GPU_HIP 1
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
inline Error MemsetAsync(void* d, int v, size_t n, StreamHandle st) {
  return hipMemsetAsync(d, v, n, st);
}
inline Error StreamCreate(StreamHandle* s) { return hipStreamCreateWithFlags(s, hipStreamNonBlocking); }
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
inline Error MemsetAsync(void* d, int v, size_t n, StreamHandle st) {
  return cudaMemsetAsync(d, v, n, st);
}
inline Error StreamCreate(StreamHandle* s) { return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking); }
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
#endif

// A failed runtime call as a status naming the call: device errors are statuses, not crashes.
inline absl::Status ToStatus(Error e, const char* what) {
  if (e == kSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", ErrorString(e)));
}

}  // namespace smla::kernels::gpu

// Evaluates a runtime call and returns its error as a status from the enclosing function.
#define SMLA_GPU_RETURN_IF_ERROR(call)                                              \
  do {                                                                              \
    const ::smla::kernels::gpu::Error smla_gpu_err_ = (call);                       \
    if (smla_gpu_err_ != ::smla::kernels::gpu::kSuccess) {                          \
      return ::smla::kernels::gpu::ToStatus(smla_gpu_err_, #call);                  \
    }                                                                               \
  } while (0)
