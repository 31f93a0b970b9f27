// Marks functions usable from host code and from CUDA/HIP device code alike.
#pragma once

#if defined(__CUDACC__)
#define SMLA_HD __host__ __device__
#define SMLA_HD_INLINE __host__ __device__ __forceinline__
#elif defined(__HIPCC__)
// clang's HIP mode predefines __host__ and __device__ but not __forceinline__.
#define SMLA_HD __host__ __device__
#define SMLA_HD_INLINE __host__ __device__ inline __attribute__((always_inline))
#else
#define SMLA_HD
#define SMLA_HD_INLINE inline
#endif
