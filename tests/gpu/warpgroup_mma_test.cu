// The warpgroup product of sm_90a (smla/kernels/gpu/warpgroup_mma.h) against a host reference:
// one warpgroup multiplies 64 x 64 bf16 tiles, four k-steps of 16, as the attention's two
// products do: S = Q K^T (both operands K-major in shared memory) and O = P V (P from registers
// or shared memory, V MN-major in shared memory); every accumulator lands where AccRow / AccCol
// say. Then the same over the attention's full 512-value rows in the 128-byte swizzled layout
// (SwizzledOffset): Q.K^T over 32 k-steps, P.V over both halves of the values with m64n64 and
// m64n256 products. Skipped without an sm_90 device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
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

// P [64 rows x kK keys] (row-major bf16 in global memory) as this lane's A fragments of each
// k-step (ARow / ACol).
__device__ void LoadAFragments(const uint16_t* p, int warp, int lane, uint32_t (&a)[kK / 16][4]) {
#pragma unroll
  for (int s = 0; s < kK / 16; ++s) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint16_t* pair = p + ARow(warp, lane, j) * kK + 16 * s + ACol(lane, j);
      a[s][j] = uint32_t{pair[0]} | (uint32_t{pair[1]} << 16);
    }
  }
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
  LoadAFragments(p, warp, lane, a);
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

// The attention's rows: 512 values, 32 k-steps of Q.K^T, 8 column blocks of the swizzled tile.
constexpr int kWidth = 512;
constexpr int kTileBytes = kM * kWidth * 2;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The products xor address bits, not offsets: a dynamic shared base off 1 KB would read every
// swizzled operand wrong, so say so rather than fail the comparison.
__device__ void CheckSwizzleBase(const uint8_t* smem) {
  if ((__cvta_generic_to_shared(smem) & 1023) != 0) {
    if (threadIdx.x == 0) printf("dynamic shared memory is not 1 KB aligned\n");
    __trap();
  }
}
#endif

// S = Q K^T over kWidth values a row: Q [64 x 512] and K [64 keys x 512], both swizzled
// (SwizzledKStep, whose k-steps move to the next column block every four) or both no-swizzle
// (KMajorDescriptor, as the attention used to read them).
template <bool kSwizzle>
__global__ void WideProductKernel(const uint16_t* a, const uint16_t* b, float* c) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem[];
  CheckSwizzleBase(smem);
  uint8_t* a_s = smem;
  uint8_t* b_s = smem + kTileBytes;
  for (int i = threadIdx.x; i < kM * kWidth; i += blockDim.x) {
    const int r = i / kWidth, k = i % kWidth;
    const uint32_t at = kSwizzle ? SwizzledOffset(r, k, kM) : TileOffset(r, k, kWidth);
    *reinterpret_cast<uint16_t*>(a_s + at) = a[i];
    *reinterpret_cast<uint16_t*>(b_s + at) = b[i];
  }
  __syncthreads();
  FenceOperands();
  float d[32] = {};
  Arrive();
#pragma unroll
  for (int s = 0; s < kWidth / 16; ++s) {
    if constexpr (kSwizzle) {
      Mma64x64x16(d, SwizzledKStep(a_s, kM, s), SwizzledKStep(b_s, kN, s), s > 0);
    } else {
      Mma64x64x16(d, KMajorDescriptor(a_s + 256 * s, kWidth),
                  KMajorDescriptor(b_s + 256 * s, kWidth), s > 0);
    }
  }
  Commit();
  Wait<0>();
  FenceAccumulators(d);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll
  for (int i = 0; i < 32; ++i) c[AccRow(warp, lane, i) * kN + AccCol(lane, i)] = d[i];
#endif
}

// O = P V over all kWidth value columns: V is the swizzled key tile [64 keys x 512]
// (SwizzledOffset(key, value)) read MN-major by SwizzledValues. Two warpgroups, as the
// attention's two consumers, each take half of the columns (from 0 and 256), with four m64n64
// products a k-step or (kN256) one m64n256; P [64 rows x 64 keys] from registers or (kSharedP)
// from a swizzled K-major tile in shared memory (SwizzledKStep), written element by element or
// (kStoreA) by the first warpgroup's A fragments through StoreA, as the attention's scorer
// hands P to its partner.
template <bool kN256, bool kSharedP, bool kStoreA = false>
__global__ void SwizzledPvKernel(const uint16_t* p, const uint16_t* v, float* o) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem[];
  CheckSwizzleBase(smem);
  uint8_t* v_s = smem;
  uint8_t* p_s = smem + kTileBytes;
  const int t = static_cast<int>(threadIdx.x) % 128, warp = t / 32, lane = t % 32;
  uint32_t a[kK / 16][4];
  LoadAFragments(p, warp, lane, a);
  for (int i = threadIdx.x; i < kK * kWidth; i += blockDim.x) {
    *reinterpret_cast<uint16_t*>(v_s + SwizzledOffset(i / kWidth, i % kWidth, kK)) = v[i];
  }
  if constexpr (kStoreA) {
    if (threadIdx.x < 128) {
#pragma unroll
      for (int s = 0; s < kK / 16; ++s) StoreA(p_s, kM, warp, lane, s, a[s]);
    }
  } else {
    for (int i = threadIdx.x; i < kM * kK; i += blockDim.x) {
      *reinterpret_cast<uint16_t*>(p_s + SwizzledOffset(i / kK, i % kK, kM)) = p[i];
    }
  }
  __syncthreads();
  FenceOperands();
  const int col0 = 256 * (static_cast<int>(threadIdx.x) / 128);
  float d[4][32] = {};
  Arrive();
#pragma unroll
  for (int s = 0; s < kK / 16; ++s) {
    if constexpr (kN256) {
      const uint64_t b = SwizzledValues(v_s, kK, s, col0);
      if constexpr (kSharedP) {
        Mma64x256x16TransB(d, SwizzledKStep(p_s, kM, s), b, s > 0);
      } else {
        Mma64x256x16RegA(d, a[s], b, s > 0);
      }
    } else {
#pragma unroll
      for (int cb = 0; cb < 4; ++cb) {
        const uint64_t b = SwizzledValues(v_s, kK, s, col0 + 64 * cb);
        if constexpr (kSharedP) {
          Mma64x64x16<true>(d[cb], SwizzledKStep(p_s, kM, s), b, s > 0);
        } else {
          Mma64x64x16RegA(d[cb], a[s], b, s > 0);
        }
      }
    }
  }
  Commit();
  Wait<0>();
#pragma unroll
  for (int cb = 0; cb < 4; ++cb) FenceAccumulators(d[cb]);
#pragma unroll
  for (int cb = 0; cb < 4; ++cb) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      o[AccRow(warp, lane, i) * kWidth + col0 + 64 * cb + AccCol(lane, i)] = d[cb][i];
    }
  }
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

// The swizzled layout of 64-row tiles as wide as the attention's rows and as P: every value
// has its own even byte offset and together they fill the tile; each offset is the products'
// exclusive-or (bits 4-6 by bits 7-9) of the plain layout of 128-byte lines, which is why a tile
// starts 1 KB aligned; and in every 8-row atom the 8 rows' chunk c (8 values, 16 bytes) lie on 8
// distinct chunks of their lines, so a loader storing one chunk of 8 rows at once hits each of
// the 32 banks once.
TEST(WarpgroupMmaTest, SwizzledOffsetsFillTheTileOnceWithoutBankConflicts) {
  constexpr int kRows = 64;
  for (const int width : {kWidth, 64}) {
    SCOPED_TRACE(width);
    std::vector<int> hits(kRows * width, 0);
    for (int r = 0; r < kRows; ++r) {
      for (int k = 0; k < width; ++k) {
        const uint32_t at = SwizzledOffset(r, k, kRows);
        ASSERT_EQ(at % 2, 0u) << r << " " << k;
        ASSERT_LT(at, static_cast<uint32_t>(kRows * width * 2)) << r << " " << k;
        ++hits[at / 2];
        const auto plain = static_cast<uint32_t>((k / 64) * kRows * 128 + r * 128 + (k % 64) * 2);
        ASSERT_EQ(at, plain ^ (((plain >> 7) & 7) << 4)) << r << " " << k;
      }
    }
    for (int h : hits) ASSERT_EQ(h, 1);
    for (int block = 0; block < width / 64; ++block) {
      for (int atom = 0; atom < kRows / 8; ++atom) {
        for (int c = 0; c < 8; ++c) {
          std::vector<int> chunks(8, 0), banks(32, 0);
          for (int r = 8 * atom; r < 8 * atom + 8; ++r) {
            const uint32_t at = SwizzledOffset(r, 64 * block + 8 * c, kRows);
            ASSERT_EQ(at % 16, 0u);
            ASSERT_EQ(at / 128, static_cast<uint32_t>(block * kRows + r));  // the row's own line
            ++chunks[at % 128 / 16];
            for (uint32_t word = 0; word < 4; ++word) ++banks[(at / 4 + word) % 32];
          }
          for (int n : chunks) ASSERT_EQ(n, 1) << block << " " << atom << " " << c;
          for (int n : banks) ASSERT_EQ(n, 1) << block << " " << atom << " " << c;
        }
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

// Runs `kernel` on x and y (64 x 64 unless told) in `threads` threads, one warpgroup unless
// told, with `smem` bytes of dynamic shared memory; returns its output of `out_size` values
// (64 x 64 unless told).
std::vector<float> RunProduct(void (*kernel)(const uint16_t*, const uint16_t*, float*),
                              const std::vector<uint16_t>& x, const std::vector<uint16_t>& y,
                              size_t out_size = kM * kN, int threads = 128, int smem = 0) {
  uint16_t *x_d = nullptr, *y_d = nullptr;
  float* out_d = nullptr;
  std::vector<float> out(out_size);
  EXPECT_EQ(cudaMalloc(&x_d, x.size() * 2), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&y_d, y.size() * 2), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&out_d, out.size() * 4), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(x_d, x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(y_d, y.data(), y.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(out_d, 0xff, out.size() * 4), cudaSuccess);  // NaN where nothing lands
  if (smem > 0) {  // above the 48 KB a kernel gets unasked
    EXPECT_EQ(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
              cudaSuccess);
  }
  kernel<<<1, threads, smem>>>(x_d, y_d, out_d);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(out.data(), out_d, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(x_d);
  cudaFree(y_d);
  cudaFree(out_d);
  return out;
}

// out[m][n] (rows x cols, 64 x 64 unless told) against the sum over k < depth of x(m, k) y(k, n);
// bf16 products are exact in f32, so only the order and rounding of the f32 sums differ.
template <typename X, typename Y>
void ExpectProduct(const std::vector<float>& out, X x, Y y, int rows = kM, int cols = kN,
                   int depth = kK) {
  int bad = 0;
  for (int m = 0; m < rows; ++m) {
    for (int n = 0; n < cols; ++n) {
      double want = 0, scale = 0;
      for (int k = 0; k < depth; ++k) {
        const double p = double{x(m, k)} * y(k, n);
        want += p;
        scale += std::fabs(p);
      }
      const double got = out[m * cols + n];
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

// A kernel of the tests below, named for the trace of a failure.
struct Way {
  const char* name;
  void (*kernel)(const uint16_t*, const uint16_t*, float*);
};

// Both ways of holding V, and P from shared memory. Were the offsets of a transposed operand the
// other way round from what warpgroup_mma.h says, each would read the other's layout and both
// would fail.
TEST(WarpgroupMmaTest, WeightsTimesValuesMatchesTheHost) {
  if (!HaveSm90()) GTEST_SKIP() << "wgmma needs an sm_90 device";
  std::mt19937 rng(6);
  const std::vector<uint16_t> p = RandomBf16(rng, kM * kK), v = RandomBf16(rng, kK * kN);
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

// Q.K^T over 512 values a row, 32 k-steps: swizzled, whose descriptors cross a column block every
// four k-steps, and no-swizzle at the same width for comparison.
TEST(WarpgroupMmaTest, WideQueryTimesKeysMatchesTheHost) {
  if (!HaveSm90()) GTEST_SKIP() << "wgmma needs an sm_90 device";
  std::mt19937 rng(7);
  const std::vector<uint16_t> a = RandomBf16(rng, kM * kWidth), b = RandomBf16(rng, kN * kWidth);
  for (const Way& way : {Way{"128-byte swizzle", WideProductKernel<true>},
                         Way{"no swizzle", WideProductKernel<false>}}) {
    SCOPED_TRACE(way.name);
    const std::vector<float> c = RunProduct(way.kernel, a, b, kM * kN, 128, 2 * kTileBytes);
    ExpectProduct(
        c, [&](int m, int k) { return Bf16ToF32(a[m * kWidth + k]); },
        [&](int k, int n) { return Bf16ToF32(b[n * kWidth + k]); }, kM, kN, kWidth);
  }
}

// P.V with V the swizzled key tile, both halves of its 512 values (two warpgroups), each as four
// m64n64 products and as one m64n256, P from registers and from swizzled shared memory (written
// element by element, and by StoreA as the attention writes it). Were SwizzledValues' two
// offsets exchanged, every product would read the wrong keys and the m64n256 ones the wrong
// column blocks too.
TEST(WarpgroupMmaTest, SwizzledWeightsTimesValuesMatchesTheHost) {
  if (!HaveSm90()) GTEST_SKIP() << "wgmma needs an sm_90 device";
  std::mt19937 rng(8);
  const std::vector<uint16_t> p = RandomBf16(rng, kM * kK), v = RandomBf16(rng, kK * kWidth);
  for (const Way& way : {Way{"m64n64, P in registers", SwizzledPvKernel<false, false>},
                         Way{"m64n64, P in shared memory", SwizzledPvKernel<false, true>},
                         Way{"m64n256, P in registers", SwizzledPvKernel<true, false>},
                         Way{"m64n256, P in shared memory", SwizzledPvKernel<true, true>},
                         Way{"m64n256, P stored by StoreA", SwizzledPvKernel<true, true, true>}}) {
    SCOPED_TRACE(way.name);
    const std::vector<float> o =
        RunProduct(way.kernel, p, v, kM * kWidth, 256, kTileBytes + kM * kK * 2);
    ExpectProduct(
        o, [&](int m, int k) { return Bf16ToF32(p[m * kK + k]); },
        [&](int k, int n) { return Bf16ToF32(v[k * kWidth + n]); }, kM, kWidth, kK);
  }
}

}  // namespace
}  // namespace smla::kernels::gpu::wgmma
