// The queries' tensor map (gpu/query_tensor_map.h) and the bulk tensor copy
// (smla/kernels/gpu/tensor_copy.h) as the warpgroup program uses them: eight boxes of 64 values
// of 64 query vectors land in shared memory exactly where SwizzledOffset puts each value (the
// layout the products read), vectors past the tensor's end read as zeros, and a base the engine
// cannot read is refused. Skipped without an sm_90 device.
#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gpu/query_tensor_map.h"
#include "gtest/gtest.h"
#include "smla/kernels/gpu/tensor_copy.h"
#include "smla/kernels/gpu/warpgroup_mma.h"
#include "smla/kernels/gpu/warpgroup_sync.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kWidth = 512, kVectors = 64;
constexpr int kBytes = kVectors * kWidth * 2;

// Copies vectors `first` .. first + 63 into shared memory by their map, then writes them back
// row-major, each value read from where SwizzledOffset says it lies.
__global__ void CopyQueriesKernel(const __grid_constant__ QueryTensorMap map, int first,
                                  uint16_t* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem[];
  auto* full = reinterpret_cast<uint64_t*>(smem + kBytes);
  if (threadIdx.x == 0) {
    wgsync::InitBarrier(full, 1);
    wgsync::FenceBarrierInit();
    wgsync::ArriveExpectBytes(full, kBytes);
    for (int b = 0; b < kWidth / kQueryBoxValues; ++b) {
      tensor_copy::LoadBox2d(smem + b * kVectors * 128, &map, b * kQueryBoxValues, first, full);
    }
  }
  __syncthreads();
  wgsync::Wait(full, 0);
  for (int i = threadIdx.x; i < kVectors * kWidth; i += blockDim.x) {
    out[i] = *reinterpret_cast<const uint16_t*>(
        smem + wgmma::SwizzledOffset(i / kWidth, i % kWidth, kVectors));
  }
#endif
}

bool HasSm90() {
  int n = 0, major = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  return major == 9;
}

TEST(QueryTensorMapTest, BoxesLandInTheSwizzledLayout) {
  if (!HasSm90()) GTEST_SKIP() << "no sm_90 device";
  constexpr int kTotal = 100;  // the second copy reads 28 vectors past the end
  std::vector<uint16_t> q(kTotal * kWidth);
  std::mt19937 rng(7);
  for (uint16_t& v : q) v = static_cast<uint16_t>(rng() | 1);  // no zero, so fills show
  uint16_t *q_d = nullptr, *out_d = nullptr;
  ASSERT_EQ(cudaMalloc(&q_d, q.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out_d, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(q_d, q.data(), q.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  QueryTensorMap map;
  ASSERT_TRUE(EncodeQueryTensorMap(q_d, kTotal, kWidth, &map));
  ASSERT_EQ(cudaFuncSetAttribute(CopyQueriesKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 kBytes + 8),
            cudaSuccess);
  for (const int first : {0, 36, 64}) {
    CopyQueriesKernel<<<1, 128, kBytes + 8>>>(map, first, out_d);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> out(kVectors * kWidth);
    ASSERT_EQ(cudaMemcpy(out.data(), out_d, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    int wrong = 0;
    for (int v = 0; v < kVectors; ++v) {
      for (int e = 0; e < kWidth; ++e) {
        const uint16_t want = first + v < kTotal ? q[(first + v) * kWidth + e] : 0;
        wrong += out[v * kWidth + e] != want;
      }
    }
    EXPECT_EQ(wrong, 0) << "vectors from " << first;
  }
  // A base off 16 bytes, and an empty tensor, are refused (the program then stages by loads).
  EXPECT_FALSE(EncodeQueryTensorMap(q_d + 1, kTotal - 1, kWidth, &map));
  EXPECT_FALSE(EncodeQueryTensorMap(q_d, 0, kWidth, &map));
  cudaFree(q_d);
  cudaFree(out_d);
}

}  // namespace
}  // namespace smla::kernels::gpu
