// smla-wgmma-rate: the issue rate of the warpgroup products of sm_90a
// (smla/kernels/gpu/warpgroup_mma.h) in the operand layouts and shapes the attention program
// uses, so that a table can show what each costs. One block per SM (its shared memory lets no
// second one in); each of its 1 or 2 warpgroups (the attention runs Q.K^T on one, P.V on two)
// loops: fence, issue one case's products, commit, wait for them all, as the attention does
// per tile. Operands are 64-row tiles of 512 bf16 (Q, the key tile that is also P.V's value
// operand) and P (64 x 64); the values are small and do not matter.
//
// Cases (products a warpgroup issues per loop):
//   qk_noswizzle, qk_swizzle128            Q.K^T over 512 values: 32 m64n64k16
//   pv64_regA_{noswizzle,swizzle128}       P.V over 64 keys and 256 values, P in registers:
//                                          4 k-steps x 4 column blocks of m64n64k16
//   pv256_regA_swizzle128                  the same as 4 m64n256k16
//   pv64_smemA_{noswizzle,swizzle128},     the same with P in shared memory
//   pv256_smemA_swizzle128
// In the P.V cases warpgroup g reads values from 256 g, as the attention's two consumers do.
//
// Columns: clocks per product (median over blocks of the block's clock64 interval over the
// products one warpgroup issued), the product's MACs, MACs per clock per SM (all warpgroups),
// TFLOP/s over the whole grid from event time (median over --reps launches), and the SM clock
// that implies (block clocks over event time): it moves with power between launches, and with it
// TFLOP/s at equal clocks per product.
//
// Usage: smla-wgmma-rate [--iters N] [--reps N] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "smla/kernels/gpu/warpgroup_mma.h"

namespace {

namespace wgmma = smla::kernels::gpu::wgmma;

constexpr int kRows = 64;                             // Q's heads, the tile's keys, P's rows
constexpr int kWidth = 512;                           // values a row
constexpr int kTileBytes = kRows * kWidth * 2;        // Q, or the key tile
constexpr int kPBytes = kRows * 64 * 2;               // P: 64 rows x 64 keys
constexpr int kSmemBytes = 2 * kTileBytes + kPBytes;  // past half an SM's: one block an SM

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// K-step ks of P in shared memory (64 rows x 64 keys, K-major).
template <bool kSwizzle>
__device__ __forceinline__ uint64_t PStep(const uint8_t* p, int ks) {
  return kSwizzle ? wgmma::SwizzledKStep(p, kRows, ks) : wgmma::KMajorDescriptor(p + 256 * ks, 64);
}

// The products of one loop. kQk: Q.K^T; else P.V over 64 keys from value column col0, P from
// registers (kRegA) or shared memory, as m64n64 (4 column blocks) or m64n256 (kN256) products.
template <bool kQk, bool kSwizzle, bool kRegA, bool kN256>
__device__ __forceinline__ void Issue(float (&d)[4][32], const uint32_t (&a)[4][4],
                                      const uint8_t* q, const uint8_t* kv, const uint8_t* p,
                                      int col0) {
  if constexpr (kQk) {
#pragma unroll
    for (int ks = 0; ks < kWidth / 16; ++ks) {
      if constexpr (kSwizzle) {
        wgmma::Mma64x64x16(d[0], wgmma::SwizzledKStep(q, kRows, ks),
                           wgmma::SwizzledKStep(kv, kRows, ks), true);
      } else {
        wgmma::Mma64x64x16(d[0], wgmma::KMajorDescriptor(q + 256 * ks, kWidth),
                           wgmma::KMajorDescriptor(kv + 256 * ks, kWidth), true);
      }
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if constexpr (kN256) {
        static_assert(kSwizzle, "the m64n256 cases read the swizzled tile");
        const uint64_t b = wgmma::SwizzledValues(kv, kRows, ks, col0);
        if constexpr (kRegA) {
          wgmma::Mma64x256x16RegA(d, a[ks], b, true);
        } else {
          wgmma::Mma64x256x16TransB(d, PStep<kSwizzle>(p, ks), b, true);
        }
      } else {
#pragma unroll
        for (int cb = 0; cb < 4; ++cb) {
          const int col = col0 + 64 * cb;
          const uint64_t b = kSwizzle ? wgmma::SwizzledValues(kv, kRows, ks, col)
                                      : wgmma::SharedKvDescriptor(
                                            kv + wgmma::TileOffset(16 * ks, col, kWidth), kWidth);
          if constexpr (kRegA) {
            wgmma::Mma64x64x16RegA(d[cb], a[ks], b, true);
          } else {
            wgmma::Mma64x64x16<true>(d[cb], PStep<kSwizzle>(p, ks), b, true);
          }
        }
      }
    }
  }
}

#endif

// One block of blockDim 128 or 256 (1 or 2 warpgroups) running `iters` loops; thread 0 writes
// the block's clock64 interval, every thread the sum of its accumulators.
template <bool kQk, bool kSwizzle, bool kRegA, bool kN256>
__global__ void __launch_bounds__(256, 1)
    RateKernel(int iters, float* sink, long long* clocks, int* misaligned) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem[];
  // The swizzle xors address bits: off 1 KB the swizzled cases would read other bytes, at
  // another cost.
  if (threadIdx.x == 0 && (__cvta_generic_to_shared(smem) & 1023) != 0) *misaligned = 1;
  uint8_t* q = smem;
  uint8_t* kv = smem + kTileBytes;
  uint8_t* p = smem + 2 * kTileBytes;
  // Multiples of 1/16 in [-1/2, 7/16], exact in bf16, two a word.
  for (int i = threadIdx.x; i < kSmemBytes / 4; i += blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u + blockIdx.x;
    h ^= h >> 15;
    const uint32_t lo = __float_as_uint(static_cast<float>(static_cast<int>(h & 15) - 8) / 16);
    const uint32_t hi =
        __float_as_uint(static_cast<float>(static_cast<int>((h >> 4) & 15) - 8) / 16);
    reinterpret_cast<uint32_t*>(smem)[i] = (lo >> 16) | (hi & 0xffff0000u);
  }
  __syncthreads();
  wgmma::FenceOperands();
  const int col0 = 256 * (static_cast<int>(threadIdx.x) / 128);
  uint32_t a[4][4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      a[ks][j] = reinterpret_cast<const uint32_t*>(p)[(threadIdx.x % 128) * 16 + 4 * ks + j];
    }
  }
  float d[4][32] = {};
  __syncthreads();
  const long long start = clock64();
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    wgmma::Arrive();
    Issue<kQk, kSwizzle, kRegA, kN256>(d, a, q, kv, p, col0);
    wgmma::Commit();
    wgmma::Wait<0>();
  }
#pragma unroll
  for (int cb = 0; cb < 4; ++cb) wgmma::FenceAccumulators(d[cb]);
  __syncthreads();  // both warpgroups' products inside the interval
  if (threadIdx.x == 0) clocks[blockIdx.x] = clock64() - start;
  // Every accumulator into the sink: ptxas drops products whose results nothing reads (one
  // column block's would leave the other three's chains dead).
  float sum = 0;
#pragma unroll
  for (int cb = 0; cb < 4; ++cb) {
#pragma unroll
    for (int i = 0; i < 32; ++i) sum += d[cb][i];
  }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = sum;
#endif
}

using Kernel = void (*)(int, float*, long long*, int*);

struct Case {
  const char* name;
  Kernel kernel;
  int n;         // the product's N: 64 or 256 (M 64, K 16)
  int per_loop;  // products a warpgroup issues per loop
};

const Case kCases[] = {
    {"qk_noswizzle", RateKernel<true, false, false, false>, 64, 32},
    {"qk_swizzle128", RateKernel<true, true, false, false>, 64, 32},
    {"pv64_regA_noswizzle", RateKernel<false, false, true, false>, 64, 16},
    {"pv64_regA_swizzle128", RateKernel<false, true, true, false>, 64, 16},
    {"pv256_regA_swizzle128", RateKernel<false, true, true, true>, 256, 4},
    {"pv64_smemA_noswizzle", RateKernel<false, false, false, false>, 64, 16},
    {"pv64_smemA_swizzle128", RateKernel<false, true, false, false>, 64, 16},
    {"pv256_smemA_swizzle128", RateKernel<false, true, false, true>, 256, 4},
};

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "smla-wgmma-rate: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <typename T>
T Median(std::vector<T> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

struct Row {
  const char* name;
  int warpgroups;
  int n;
  long long macs;         // of one product
  double clocks_per_mma;  // block clocks over one warpgroup's products
  double macs_per_clock;  // per SM, all warpgroups
  double tflops;          // the grid, from event time
  double ms;              // event time of one launch
  double mhz;             // block clocks over event time
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 2000, reps = 5;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: smla-wgmma-rate [--iters N] [--reps N] [--json FILE]\n");
      return 2;
    }
  }
  if (iters < 1 || reps < 1) {
    std::fprintf(stderr, "smla-wgmma-rate: --iters >= 1, --reps >= 1\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "smla-wgmma-rate: no CUDA device; wgmma needs an sm_90 one\n");
    return 2;
  }
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "device properties");
  if (prop.major != 9) {
    std::fprintf(stderr, "smla-wgmma-rate: %s is sm_%d%d; wgmma needs sm_90\n", prop.name,
                 prop.major, prop.minor);
    return 2;
  }
  int clock_khz = 0;
  Check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "clock rate");
  const int sms = prop.multiProcessorCount;

  float* sink = nullptr;
  long long* clocks_d = nullptr;
  int* misaligned = nullptr;
  Check(cudaMalloc(&sink, sizeof(float) * sms * 256), "sink");
  Check(cudaMalloc(&clocks_d, sizeof(long long) * sms), "clocks");
  Check(cudaMalloc(&misaligned, sizeof(int)), "flag");
  Check(cudaMemset(misaligned, 0, sizeof(int)), "flag");
  cudaEvent_t begin, end;
  Check(cudaEventCreate(&begin), "event");
  Check(cudaEventCreate(&end), "event");

  std::vector<Row> rows;
  for (const Case& c : kCases) {
    Check(cudaFuncSetAttribute(c.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
          "shared memory size");
    for (int wg = 1; wg <= 2; ++wg) {
      std::fprintf(stderr, "smla-wgmma-rate: %s, %d warpgroup%s\n", c.name, wg, wg > 1 ? "s" : "");
      std::vector<double> ms;
      std::vector<long long> clocks;
      for (int r = 0; r <= reps; ++r) {  // the first a warm-up
        Check(cudaEventRecord(begin), "record");
        c.kernel<<<sms, 128 * wg, kSmemBytes>>>(iters, sink, clocks_d, misaligned);
        Check(cudaGetLastError(), c.name);
        Check(cudaEventRecord(end), "record");
        Check(cudaEventSynchronize(end), c.name);
        if (r == 0) continue;
        float t = 0;
        Check(cudaEventElapsedTime(&t, begin, end), "elapsed");
        ms.push_back(t);
        std::vector<long long> block(sms);
        Check(cudaMemcpy(block.data(), clocks_d, sizeof(long long) * sms, cudaMemcpyDeviceToHost),
              "clocks");
        clocks.insert(clocks.end(), block.begin(), block.end());
      }
      int bad = 0;
      Check(cudaMemcpy(&bad, misaligned, sizeof(int), cudaMemcpyDeviceToHost), "flag");
      if (bad) {
        std::fprintf(stderr, "smla-wgmma-rate: dynamic shared memory is not 1 KB aligned\n");
        return 1;
      }
      const long long macs = 64LL * c.n * 16;
      const double per_wg = static_cast<double>(iters) * c.per_loop;
      const double block_clocks = static_cast<double>(Median(clocks));
      const double t = Median(ms);
      rows.push_back({c.name, wg, c.n, macs, block_clocks / per_wg,
                      static_cast<double>(macs) * per_wg * wg / block_clocks,
                      2.0 * static_cast<double>(macs) * per_wg * wg * sms / (t * 1e-3) / 1e12, t,
                      block_clocks / (t * 1e3)});
    }
  }

  std::printf("%s, %d SMs, %d MHz; %d loops, median of %d launches\n\n", prop.name, sms,
              clock_khz / 1000, iters, reps);
  std::printf(
      "| case | warpgroups | product | MACs | clocks/product | MACs/clock/SM | TFLOP/s | MHz |\n");
  std::printf("|---|---:|---|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %d | m64n%dk16 | %lld | %.1f | %.0f | %.1f | %.0f |\n", r.name,
                r.warpgroups, r.n, r.macs, r.clocks_per_mma, r.macs_per_clock, r.tflops, r.mhz);
  }
  if (!json.empty()) {
    FILE* out = std::fopen(json.c_str(), "w");
    if (out == nullptr) {
      std::fprintf(stderr, "smla-wgmma-rate: cannot write %s\n", json.c_str());
      return 1;
    }
    std::fprintf(out,
                 "{\"device\": \"%s\", \"sms\": %d, \"sm_clock_mhz\": %d, \"iters\": %d, "
                 "\"reps\": %d, \"rows\": [",
                 prop.name, sms, clock_khz / 1000, iters, reps);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(out,
                   "%s\n  {\"case\": \"%s\", \"warpgroups\": %d, \"product\": \"m64n%dk16\", "
                   "\"macs\": %lld, \"clocks_per_product\": %.3f, \"macs_per_clock_per_sm\": "
                   "%.3f, \"tflops\": %.3f, \"ms\": %.4f, \"mhz\": %.1f}",
                   i ? "," : "", r.name, r.warpgroups, r.n, r.macs, r.clocks_per_mma,
                   r.macs_per_clock, r.tflops, r.ms, r.mhz);
    }
    std::fprintf(out, "\n]}\n");
    std::fclose(out);
  }
  return 0;
}
