// Marks functions usable from host code and from CUDA/HIP device code alike.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SMLA_HD __host__ __device__
#define SMLA_HD_INLINE __host__ __device__ __forceinline__
#else
#define SMLA_HD
#define SMLA_HD_INLINE inline
#endif
