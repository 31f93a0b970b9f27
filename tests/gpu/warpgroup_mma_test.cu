// The warpgroup product of sm_90a (smla/kernels/gpu/warpgroup_mma.h) against a host reference:
// one warpgroup multiplies 64 x 64 bf16 tiles, four k-steps of 16, as the attention's two
// products do: S = Q K^T (both operands K-major in shared memory) and O = P V (P from registers
// or shared memory, V MN-major in shared memory); every accumulator lands where AccRow / AccCol
// say. Skipped without an sm_90 device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "smla/kernels/gpu/warpgroup_mma.h"

namespace smla::kernels::gpu::wgmma {
namespace {

constexpr int kM = 64, kN = 64, kK = 64;

__global__ void ProductKernel(const uint16_t* a, const uint16_t* b, float* c) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(128) uint8_t a_s[kM * kK * 2];
  __shared__ __align__(128) uint8_t b_s[kN * kK * 2];
  for (int i = threadIdx.x; i < kM * kK; i += blockDim.x) {
    *reinterpret_cast<uint16_t*>(a_s + TileOffset(i / kK, i % kK, kK)) = a[i];
    *reinterpret_cast<uint16_t*>(b_s + TileOffset(i / kK, i % kK, kK)) = b[i];
  }
  __syncthreads();
  FenceOperands();
  float d[32] = {};
  Arrive();
#pragma unroll
  for (int s = 0; s < kK / 16; ++s) {
    Mma64x64x16(d, KMajorDescriptor(a_s + 256 * s, kK), KMajorDescriptor(b_s + 256 * s, kK), s > 0);
  }
  Commit();
  Wait<0>();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll
  for (int i = 0; i < 32; ++i) c[AccRow(warp, lane, i) * kN + AccCol(lane, i)] = d[i];
#endif
}

// O = P V: P [64 rows x 64 keys] from registers or (kSharedP, as the attention's second
// consumer reads it) from a K-major tile in shared memory; V [64 keys x 64 values] in shared
// memory either in a tile of its own (TileOffsetMn) or as the key tile of Q.K^T lies
// (TileOffset, keys as rows).
template <bool kSharedKv, bool kSharedP = false>
__global__ void PvKernel(const uint16_t* p, const uint16_t* v, float* o) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(128) uint8_t v_s[kK * kN * 2];
  __shared__ __align__(128) uint8_t p_s[kM * kK * 2];
  for (int i = threadIdx.x; i < kK * kN; i += blockDim.x) {
    const int key = i / kN, value = i % kN;
    const uint32_t at = kSharedKv ? TileOffset(key, value, kN) : TileOffsetMn(key, value, kK);
    *reinterpret_cast<uint16_t*>(v_s + at) = v[i];
    *reinterpret_cast<uint16_t*>(p_s + TileOffset(i / kK, i % kK, kK)) = p[i];
  }
  __syncthreads();
  FenceOperands();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float d[32] = {};
  uint32_t a[kK / 16][4];
#pragma unroll
  for (int s = 0; s < kK / 16; ++s) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint16_t* pair = p + ARow(warp, lane, j) * kK + 16 * s + ACol(lane, j);
      a[s][j] = uint32_t{pair[0]} | (uint32_t{pair[1]} << 16);
    }
  }
  Arrive();
#pragma unroll
  for (int s = 0; s < kK / 16; ++s) {
    // 16 keys a step: two key cores, 256 bytes on in a tile of its own, two core rows of the
    // shared tile.
    const uint64_t b = kSharedKv ? SharedKvDescriptor(v_s + s * 2 * (kN / 8) * 128, kN)
                                 : KMajorDescriptor(v_s + 256 * s, kK);
    if constexpr (kSharedP) {
      Mma64x64x16<true>(d, KMajorDescriptor(p_s + 256 * s, kK), b, s > 0);
    } else {
      Mma64x64x16RegA(d, a[s], b, s > 0);
    }
  }
  Commit();
  Wait<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) o[AccRow(warp, lane, i) * kN + AccCol(lane, i)] = d[i];
#endif
}

float Bf16ToF32(uint16_t bits) {
  const uint32_t w = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

// Every (row, column) of the 64 x 64 accumulator tile, and every value of a 64 x 16 A fragment
// (a register holds a pair of neighbouring columns), is held by exactly one (thread, slot).
TEST(WarpgroupMmaTest, FragmentMapsCoverTheirTilesOnce) {
  std::vector<int> acc(kM * kN, 0), a(kM * 16, 0);
  for (int t = 0; t < 128; ++t) {
    for (int i = 0; i < 32; ++i) ++acc[AccRow(t / 32, t % 32, i) * kN + AccCol(t % 32, i)];
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half)
        ++a[ARow(t / 32, t % 32, j) * 16 + ACol(t % 32, j) + half];
    }
  }
  for (int v : acc) ASSERT_EQ(v, 1);
  for (int v : a) ASSERT_EQ(v, 1);
}

// The scores of an m64n64 product feed P.V's A fragments in place: for every k-step and
// register, AccumulatorOfA names the accumulator of the same lane at the fragment's (row,
// column), and the one after it holds the next column.
TEST(WarpgroupMmaTest, ScoresBecomeAFragmentsInPlace) {
  for (int t = 0; t < 128; ++t) {
    const int warp = t / 32, lane = t % 32;
    for (int ks = 0; ks < kN / 16; ++ks) {
      for (int j = 0; j < 4; ++j) {
        const int i = AccumulatorOfA(ks, j);
        ASSERT_EQ(AccRow(warp, lane, i), ARow(warp, lane, j)) << t << " " << ks << " " << j;
        ASSERT_EQ(AccRow(warp, lane, i + 1), ARow(warp, lane, j));
        ASSERT_EQ(AccCol(lane, i), 16 * ks + ACol(lane, j));
        ASSERT_EQ(AccCol(lane, i + 1), 16 * ks + ACol(lane, j) + 1);
      }
    }
  }
}

std::vector<uint16_t> RandomBf16(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) {
    const float f = u(rng);
    uint32_t w;
    std::memcpy(&w, &f, 4);
    x = static_cast<uint16_t>(w >> 16);
  }
  return v;
}

bool HaveSm90() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return false;
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9;
}

// Runs `kernel` on x [64 x 64] and y [64 x 64] in one warpgroup; returns its 64 x 64 output.
std::vector<float> RunProduct(void (*kernel)(const uint16_t*, const uint16_t*, float*),
                              const std::vector<uint16_t>& x, const std::vector<uint16_t>& y) {
  uint16_t *x_d = nullptr, *y_d = nullptr;
  float* out_d = nullptr;
  std::vector<float> out(kM * kN);
  EXPECT_EQ(cudaMalloc(&x_d, x.size() * 2), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&y_d, y.size() * 2), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&out_d, out.size() * 4), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(x_d, x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(y_d, y.data(), y.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(out_d, 0xff, out.size() * 4), cudaSuccess);  // NaN where nothing lands
  kernel<<<1, 128>>>(x_d, y_d, out_d);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(out.data(), out_d, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(x_d);
  cudaFree(y_d);
  cudaFree(out_d);
  return out;
}

// out[m][n] against the sum over k of x(m, k) y(k, n); bf16 products are exact in f32, so only
// the order and rounding of the f32 sums differ.
template <typename X, typename Y>
void ExpectProduct(const std::vector<float>& out, X x, Y y) {
  int bad = 0;
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < kN; ++n) {
      double want = 0, scale = 0;
      for (int k = 0; k < kK; ++k) {
        const double p = double{x(m, k)} * y(k, n);
        want += p;
        scale += std::fabs(p);
      }
      const double got = out[m * kN + n];
      if (!(std::fabs(got - want) <= 1e-5 * scale + 1e-6) && ++bad <= 8) {
        ADD_FAILURE() << "[" << m << "][" << n << "] = " << got << ", want " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(WarpgroupMmaTest, QueryTimesKeysMatchesTheHost) {
  if (!HaveSm90()) GTEST_SKIP() << "wgmma needs an sm_90 device";
  std::mt19937 rng(5);
  const std::vector<uint16_t> a = RandomBf16(rng, kM * kK), b = RandomBf16(rng, kN * kK);
  const std::vector<float> c = RunProduct(ProductKernel, a, b);
  ExpectProduct(
      c, [&](int m, int k) { return Bf16ToF32(a[m * kK + k]); },
      [&](int k, int n) { return Bf16ToF32(b[n * kK + k]); });
}

// Both ways of holding V, and P from shared memory. Were the offsets of a transposed operand the
// other way round from what warpgroup_mma.h says, each would read the other's layout and both
// would fail.
TEST(WarpgroupMmaTest, WeightsTimesValuesMatchesTheHost) {
  if (!HaveSm90()) GTEST_SKIP() << "wgmma needs an sm_90 device";
  std::mt19937 rng(6);
  const std::vector<uint16_t> p = RandomBf16(rng, kM * kK), v = RandomBf16(rng, kK * kN);
  struct Way {
    const char* name;
    void (*kernel)(const uint16_t*, const uint16_t*, float*);
  };
  for (const Way& way : {Way{"V in a tile of its own", PvKernel<false>},
                         Way{"V as the key tile lies", PvKernel<true>},
                         Way{"V as the key tile lies, P in shared memory", PvKernel<true, true>}}) {
    SCOPED_TRACE(way.name);
    const std::vector<float> o = RunProduct(way.kernel, p, v);
    ExpectProduct(
        o, [&](int m, int k) { return Bf16ToF32(p[m * kK + k]); },
        [&](int k, int n) { return Bf16ToF32(v[k * kN + n]); });
  }
}

}  // namespace
}  // namespace smla::kernels::gpu::wgmma
