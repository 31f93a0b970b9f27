// The HIP primitives (primitives_hip.h, lane_reduce.h) against host references: MFMA fragment
// maps and products, fp8/bf16 conversions against the codecs, wavefront reductions, ballots,
// shuffles and the gather copies. scripts/hip_compile_check.sh compiles it device-only (it
// must contain v_mfma); on a ROCm machine the HIP build runs it as smla-hip-primitives-test.
// Prints one line per check (mismatches out of cases) and "N passed, N failed"; exits 77 when
// there is no device.
#include <hip/hip_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/e4m3.h"
#include "smla/kernels/codec/e8m0.h"
#include "smla/kernels/gpu/lane_reduce.h"
#include "smla/kernels/gpu/primitives.h"

namespace smla::kernels::gpu {
namespace {

using M = Mfma16x16x32;

// Every (lane, element) of a fragment names a distinct cell, and every cell is named.
template <class Row, class Col>
constexpr bool CoversOnce(int rows, int cols, int elems, Row row, Col col) {
  bool seen[32 * 32] = {};
  for (int lane = 0; lane < kWarpSize; ++lane) {
    for (int e = 0; e < elems; ++e) {
      const int r = row(lane, e), c = col(lane, e);
      if (r < 0 || r >= rows || c < 0 || c >= cols || seen[r * cols + c]) return false;
      seen[r * cols + c] = true;
    }
  }
  return true;
}
static_assert(CoversOnce(M::kM, M::kK, M::kAElems, M::ARow, M::ACol), "A map is not a bijection");
static_assert(CoversOnce(M::kK, M::kN, M::kBElems, M::BRow, M::BCol), "B map is not a bijection");
static_assert(CoversOnce(M::kM, M::kN, M::kCElems, M::CRow, M::CCol), "C map is not a bijection");

// C = A * B (A 16x32 row-major; B given twice: 32x16 k-major and as B^T 16x32 row-major).
// (A fragments are also built from packed words, as fp8 paths build them.)
__global__ void MfmaKernel(const uint16_t* a, const uint16_t* b_kmajor, const uint16_t* b_t,
                           float* c_kmajor, float* c_t, float* c_words) {
  const int lane = threadIdx.x;
  F32x4 acc0 = {0, 0, 0, 0}, acc1 = {0, 0, 0, 0}, acc2 = {0, 0, 0, 0};
  const Bf16x8 af = LoadFragmentRowMajor(a, M::kK, lane);
  const uint2* words =
      reinterpret_cast<const uint2*>(a + M::ARow(lane, 0) * M::kK + M::ACol(lane, 0));
  const Bf16x8 bt = LoadFragmentRowMajor(b_t, M::kK, lane);
  MfmaBf16(acc0, af, LoadFragmentKMajor(b_kmajor, M::kN, lane));
  MfmaBf16(acc1, af, bt);
  MfmaBf16(acc2, Bf16x8FromWords(words[0], words[1]), bt);
  for (int i = 0; i < M::kCElems; ++i) {
    c_kmajor[M::CRow(lane, i) * M::kN + M::CCol(lane, i)] = acc0[i];
    c_t[M::CRow(lane, i) * M::kN + M::CCol(lane, i)] = acc1[i];
    c_words[M::CRow(lane, i) * M::kN + M::CCol(lane, i)] = acc2[i];
  }
}

// All 65,536 code pairs through E4m3x2ToFloat2; 256 codes x scale bytes through
// E4m3x4ToBf16Scaled; `n` floats through MxEncodePair, PackBf16 and RoundToBf16Fast.
__global__ void ConvertKernel(const float* x, int n, float inv_scale, const uint8_t* scale_bytes,
                              int num_scales, float2* pairs, uint16_t* scaled, uint16_t* mx,
                              uint32_t* packed, float* rounded) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 65536) pairs[i] = E4m3x2ToFloat2(static_cast<uint16_t>(i));
  if (i < 64 * num_scales) {
    const int s = i / 64;
    const uint32_t codes = static_cast<uint32_t>(i % 64) * 4u;
    const uint32_t word = codes | ((codes + 1) << 8) | ((codes + 2) << 16) | ((codes + 3) << 24);
    const uint2 v = E4m3x4ToBf16Scaled(word, E8m0ToBf16x2(scale_bytes[s]));
    uint16_t* out = scaled + s * 256 + codes;
    out[0] = static_cast<uint16_t>(v.x & 0xffffu);
    out[1] = static_cast<uint16_t>(v.x >> 16);
    out[2] = static_cast<uint16_t>(v.y & 0xffffu);
    out[3] = static_cast<uint16_t>(v.y >> 16);
  }
  if (i < n / 2) {
    mx[i] = MxEncodePair(x[2 * i], x[2 * i + 1], inv_scale);
    packed[i] = PackBf16(x[2 * i], x[2 * i + 1]);
  }
  if (i < n) rounded[i] = RoundToBf16Fast(x[i]);
}

// PermuteBytes on (a, b, selector) triples; E4m3x4ToBf16Scaled with a different scale byte per
// half, and E4m3x4ToBf16, on code words.
__global__ void BytesKernel(const uint32_t* abs, int n, uint32_t* permuted, const uint32_t* words,
                            uint2* pair_scaled, uint2* unscaled) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  permuted[i] = PermuteBytes(abs[3 * i], abs[3 * i + 1], abs[3 * i + 2]);
  const uint32_t w = words[i];
  pair_scaled[i] = E4m3x4ToBf16Scaled(w, E8m0PairToBf16x2(100 + i % 40, 140 - i % 40));
  unscaled[i] = E4m3x4ToBf16(w);
}

// Per lane: butterfly max/sum for each xor mask, group reductions of 4, 16 and kWarpSize
// lanes, the ballot of (v > 0), and a 64-bit shuffle from lane (lane * 7) % kWarpSize.
constexpr int kLog2Warp = kWarpSize == 64 ? 6 : 5;
constexpr int kReduceOuts = 2 * kLog2Warp + 6;
__global__ void WaveKernel(const float* v, float* out, uint64_t* ballot, uint64_t* shuffled) {
  const int lane = threadIdx.x;
  const float x = v[lane];
  float* o = out + lane * kReduceOuts;
  int k = 0;
  for (int m = 1; m < kWarpSize; m *= 2) {
    o[k++] = WarpXorMax(x, m);
    o[k++] = WarpXorSum(x, m);
  }
  o[k++] = LaneGroupMax<4>(x);
  o[k++] = LaneGroupSum<4>(x);
  o[k++] = LaneGroupMax<16>(x);
  o[k++] = LaneGroupSum<16>(x);
  o[k++] = WarpMax(x);
  o[k++] = WarpSum(x);
  const LaneMask b = WarpBallot(x > 0.0f);
  if (lane == 0) *ballot = b;
  const uint64_t mine = (uint64_t{0x9e3779b9u} << 32) | static_cast<uint32_t>(lane);
  shuffled[lane] = WarpShuffle(mine, (lane * 7) % kWarpSize);
}

// Gathers 16- and 8-byte chunks into shared memory (odd chunks invalid: zero-filled), and
// with GatherToLds16 chunk (7 * lane) % 64 of the source into row `wave` of a third tile
// (lanes 3k invalid); copies the shared tiles out. Two wavefronts.
constexpr int kCopyChunks = 2 * kWarpSize;
__global__ void CopyKernel(const uint8_t* src, uint8_t* out16, uint8_t* out8, uint8_t* out_dma) {
  __shared__ __attribute__((aligned(16))) uint8_t tile16[kCopyChunks * 16];
  __shared__ __attribute__((aligned(16))) uint8_t tile8[kCopyChunks * 8];
  __shared__ __attribute__((aligned(16))) uint8_t tile_dma[kCopyChunks * 16];
  const int t = threadIdx.x;
  const int lane = LaneId();
  const int wave = t / kWarpSize;
  const bool valid = t % 2 == 0;
  AsyncCopy16(tile16 + 16 * t, src + 16 * t, valid);
  AsyncCopy8(SharedAddress(tile8 + 8 * t), src + 8 * t, valid);
  AsyncCommit();
  GatherToLds16(SharedAddress(tile_dma + wave * kWarpSize * 16),
                src + 16 * ((7 * lane) % kCopyChunks), lane % 3 != 0);
  AsyncWait<0>();
  AsyncWaitLoads<0>();
  __syncthreads();
  for (int i = t; i < kCopyChunks * 16; i += blockDim.x) out16[i] = tile16[i];
  for (int i = t; i < kCopyChunks * 8; i += blockDim.x) out8[i] = tile8[i];
  for (int i = t; i < kCopyChunks * 16; i += blockDim.x) out_dma[i] = tile_dma[i];
}

// ---------------------------------------------------------------------------------------------
// Host side.

int g_passed = 0;
int g_failed = 0;

void Report(const char* what, int64_t bad, int64_t cases, int64_t nans = 0) {
  const bool ok = bad == 0 && nans == 0;
  std::printf("%s %-40s %lld of %lld mismatched, %lld unexpected NaN\n", ok ? "ok  " : "FAIL", what,
              static_cast<long long>(bad), static_cast<long long>(cases),
              static_cast<long long>(nans));
  (ok ? g_passed : g_failed)++;
}

#define HIP_OK(call)                                                  \
  do {                                                                \
    const hipError_t e_ = (call);                                     \
    if (e_ != hipSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #call, hipGetErrorString(e_)); \
      std::exit(2);                                                   \
    }                                                                 \
  } while (0)

template <class T>
T* ToDevice(const std::vector<T>& h) {
  T* d = nullptr;
  HIP_OK(hipMalloc(&d, h.size() * sizeof(T)));
  HIP_OK(hipMemcpy(d, h.data(), h.size() * sizeof(T), hipMemcpyHostToDevice));
  return d;
}
template <class T>
T* DeviceArray(size_t n) {
  T* d = nullptr;
  HIP_OK(hipMalloc(&d, n * sizeof(T)));
  HIP_OK(hipMemset(d, 0xff, n * sizeof(T)));  // poisoned: an unwritten output is seen
  return d;
}
template <class T>
std::vector<T> ToHost(const T* d, size_t n) {
  std::vector<T> h(n);
  HIP_OK(hipMemcpy(h.data(), d, n * sizeof(T), hipMemcpyDeviceToHost));
  return h;
}

bool SameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

void CheckMfma(std::mt19937& rng) {
  // Small integers: every product and sum is exact in f32, so the result must match exactly.
  std::uniform_int_distribution<int> small(-8, 8);
  std::vector<uint16_t> a(M::kM * M::kK), bk(M::kK * M::kN), bt(M::kN * M::kK);
  std::vector<float> af(a.size()), bf(bk.size());
  for (size_t i = 0; i < a.size(); ++i) {
    af[i] = static_cast<float>(small(rng));
    a[i] = F32ToBf16Bits(af[i]);
  }
  for (int k = 0; k < M::kK; ++k) {
    for (int n = 0; n < M::kN; ++n) {
      const float v = static_cast<float>(small(rng));
      bf[k * M::kN + n] = v;
      bk[k * M::kN + n] = F32ToBf16Bits(v);
      bt[n * M::kK + k] = F32ToBf16Bits(v);
    }
  }
  uint16_t* da = ToDevice(a);
  uint16_t* dbk = ToDevice(bk);
  uint16_t* dbt = ToDevice(bt);
  float* dck = DeviceArray<float>(M::kM * M::kN);
  float* dct = DeviceArray<float>(M::kM * M::kN);
  float* dcw = DeviceArray<float>(M::kM * M::kN);
  MfmaKernel<<<1, kWarpSize>>>(da, dbk, dbt, dck, dct, dcw);
  HIP_OK(hipGetLastError());
  const std::vector<float> ck = ToHost(dck, M::kM * M::kN), ct = ToHost(dct, M::kM * M::kN);
  const std::vector<float> cw = ToHost(dcw, M::kM * M::kN);
  int64_t bad_k = 0, bad_t = 0, bad_w = 0, nans = 0;
  for (int m = 0; m < M::kM; ++m) {
    for (int n = 0; n < M::kN; ++n) {
      float ref = 0.0f;
      for (int k = 0; k < M::kK; ++k) ref += af[m * M::kK + k] * bf[k * M::kN + n];
      nans += std::isnan(ck[m * M::kN + n]) + std::isnan(ct[m * M::kN + n]);
      bad_k += ck[m * M::kN + n] != ref;
      bad_t += ct[m * M::kN + n] != ref;
      bad_w += cw[m * M::kN + n] != ref;
    }
  }
  Report("mfma 16x16x32, B k-major", bad_k, M::kM * M::kN, nans);
  Report("mfma 16x16x32, B n-major", bad_t, M::kM * M::kN);
  Report("mfma 16x16x32, A from packed words", bad_w, M::kM * M::kN);
  HIP_OK(hipFree(da));
  HIP_OK(hipFree(dbk));
  HIP_OK(hipFree(dbt));
  HIP_OK(hipFree(dck));
  HIP_OK(hipFree(dct));
  HIP_OK(hipFree(dcw));
}

void CheckConversions(std::mt19937& rng) {
  // Inputs: every bf16 bit pattern as f32 (signs, zeros, subnormals, infinities and NaNs
  // included), then random f32 bit patterns.
  std::vector<float> x;
  for (uint32_t b = 0; b < 65536; ++b) x.push_back(BitsFloat(b << 16));
  std::uniform_int_distribution<uint32_t> bits;
  while (x.size() < (1u << 18)) x.push_back(BitsFloat(bits(rng)));
  const int n = static_cast<int>(x.size());
  const std::vector<uint8_t> scale_bytes = {0, 1, 100, 120, 127, 134, 200, 254};
  const int num_scales = static_cast<int>(scale_bytes.size());
  const uint8_t mx_byte = 120;  // a group scale of 2^-7
  const float inv_scale = Pow2(127 - mx_byte);

  float* dx = ToDevice(x);
  uint8_t* dscale = ToDevice(scale_bytes);
  float2* dpairs = DeviceArray<float2>(65536);
  uint16_t* dscaled = DeviceArray<uint16_t>(256 * scale_bytes.size());
  uint16_t* dmx = DeviceArray<uint16_t>(n / 2);
  uint32_t* dpacked = DeviceArray<uint32_t>(n / 2);
  float* drounded = DeviceArray<float>(n);
  ConvertKernel<<<(n + 255) / 256, 256>>>(dx, n, inv_scale, dscale, num_scales, dpairs, dscaled,
                                          dmx, dpacked, drounded);
  HIP_OK(hipGetLastError());
  const auto pairs = ToHost(dpairs, 65536);
  const auto scaled = ToHost(dscaled, 256 * scale_bytes.size());
  const auto mx = ToHost(dmx, n / 2);
  const auto packed = ToHost(dpacked, n / 2);
  const auto rounded = ToHost(drounded, n);

  int64_t bad = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    bad += !SameFloat(pairs[i].x, DecodeE4m3(static_cast<uint8_t>(i & 0xffu)));
    bad += !SameFloat(pairs[i].y, DecodeE4m3(static_cast<uint8_t>(i >> 8)));
  }
  Report("E4m3x2ToFloat2 (all code pairs)", bad, 2 * 65536);

  // The value of a code times 2^(byte-127), rounded once to bf16 (NaN codes excluded: the
  // service never stores them, and the CUDA path maps them to finite values).
  bad = 0;
  int64_t cases = 0;
  for (int s = 0; s < num_scales; ++s) {
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7f) == 0x7f) continue;
      const float ref = DecodeE4m3(static_cast<uint8_t>(c)) * DecodeE8m0(scale_bytes[s]);
      bad += scaled[s * 256 + c] != F32ToBf16Bits(ref);
      ++cases;
    }
  }
  Report("E4m3x4ToBf16Scaled (codes x scales)", bad, cases);

  // NaN inputs are excluded where the contracts say "for every non-NaN input".
  int64_t bad_mx = 0, bad_pack = 0, bad_round = 0, mx_cases = 0, round_cases = 0;
  for (int i = 0; i < n / 2; ++i) {
    const float x0 = x[2 * i], x1 = x[2 * i + 1];
    if (std::isnan(x0) || std::isnan(x1)) continue;
    ++mx_cases;
    const uint16_t ref =
        static_cast<uint16_t>(EncodeE4m3(x0 * inv_scale) | (EncodeE4m3(x1 * inv_scale) << 8));
    bad_mx += mx[i] != ref;
    const uint32_t pref = F32ToBf16Bits(x0) | (static_cast<uint32_t>(F32ToBf16Bits(x1)) << 16);
    bad_pack += packed[i] != pref;
  }
  for (int i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    ++round_cases;
    bad_round += !SameFloat(rounded[i], RoundToBf16(x[i]));
  }
  Report("MxEncodePair (non-NaN)", bad_mx, mx_cases);
  Report("PackBf16 (non-NaN)", bad_pack, mx_cases);
  Report("RoundToBf16Fast (non-NaN)", bad_round, round_cases);
  HIP_OK(hipFree(dx));
  HIP_OK(hipFree(dscale));
  HIP_OK(hipFree(dpairs));
  HIP_OK(hipFree(dscaled));
  HIP_OK(hipFree(dmx));
  HIP_OK(hipFree(dpacked));
  HIP_OK(hipFree(drounded));
}

void CheckBytes(std::mt19937& rng) {
  constexpr int n = 1 << 16;
  std::vector<uint32_t> abs(3 * n), words(n);
  for (int i = 0; i < n; ++i) {
    abs[3 * i] = rng();
    abs[3 * i + 1] = rng();
    abs[3 * i + 2] = rng() & 0xffffu;
    uint32_t w = rng();
    for (int k = 0; k < 4; ++k) {  // no NaN codes (see E4m3x4ToBf16Scaled's check)
      if (((w >> (8 * k)) & 0x7fu) == 0x7fu) w ^= 1u << (8 * k);
    }
    words[i] = w;
  }
  uint32_t* dabs = ToDevice(abs);
  uint32_t* dwords = ToDevice(words);
  uint32_t* dperm = DeviceArray<uint32_t>(n);
  uint2* dpair = DeviceArray<uint2>(n);
  uint2* dunit = DeviceArray<uint2>(n);
  BytesKernel<<<n / 256, 256>>>(dabs, n, dperm, dwords, dpair, dunit);
  HIP_OK(hipGetLastError());
  const auto perm = ToHost(dperm, n);
  const auto pair = ToHost(dpair, n);
  const auto unit = ToHost(dunit, n);
  int64_t bad_perm = 0, bad_pair = 0, bad_unit = 0;
  auto bf16_of = [](uint32_t w, int k, float scale) {
    return F32ToBf16Bits(DecodeE4m3(static_cast<uint8_t>(w >> (8 * k))) * scale);
  };
  auto word_of = [](uint16_t lo, uint16_t hi) { return lo | (static_cast<uint32_t>(hi) << 16); };
  for (int i = 0; i < n; ++i) {
    const uint64_t bytes = (uint64_t{abs[3 * i + 1]} << 32) | abs[3 * i];
    uint32_t ref = 0;
    for (int k = 0; k < 4; ++k) {
      const uint32_t idx = (abs[3 * i + 2] >> (4 * k)) & 7u;
      ref |= static_cast<uint32_t>((bytes >> (8 * idx)) & 0xffu) << (8 * k);
    }
    bad_perm += perm[i] != ref;
    const uint32_t w = words[i];
    const float s0 = DecodeE8m0(static_cast<uint8_t>(100 + i % 40));
    const float s1 = DecodeE8m0(static_cast<uint8_t>(140 - i % 40));
    bad_pair += pair[i].x != word_of(bf16_of(w, 0, s0), bf16_of(w, 1, s1)) ||
                pair[i].y != word_of(bf16_of(w, 2, s0), bf16_of(w, 3, s1));
    bad_unit += unit[i].x != word_of(bf16_of(w, 0, 1.0f), bf16_of(w, 1, 1.0f)) ||
                unit[i].y != word_of(bf16_of(w, 2, 1.0f), bf16_of(w, 3, 1.0f));
  }
  Report("PermuteBytes (as __byte_perm)", bad_perm, n);
  Report("E4m3x4ToBf16Scaled, a scale per half", bad_pair, n);
  Report("E4m3x4ToBf16", bad_unit, n);
  HIP_OK(hipFree(dabs));
  HIP_OK(hipFree(dwords));
  HIP_OK(hipFree(dperm));
  HIP_OK(hipFree(dpair));
  HIP_OK(hipFree(dunit));
}

void CheckWave(std::mt19937& rng) {
  // Small integers again, so that every order of summation gives the same exact result.
  std::uniform_int_distribution<int> small(-50, 50);
  std::vector<float> v(kWarpSize);
  for (float& f : v) f = static_cast<float>(small(rng));
  float* dv = ToDevice(v);
  float* dout = DeviceArray<float>(kWarpSize * kReduceOuts);
  uint64_t* dballot = DeviceArray<uint64_t>(1);
  uint64_t* dshuf = DeviceArray<uint64_t>(kWarpSize);
  WaveKernel<<<1, kWarpSize>>>(dv, dout, dballot, dshuf);
  HIP_OK(hipGetLastError());
  const auto out = ToHost(dout, kWarpSize * kReduceOuts);
  const auto ballot = ToHost(dballot, 1);
  const auto shuf = ToHost(dshuf, kWarpSize);
  auto group = [&](int lane, int lanes, bool sum) {
    const int base = lane / lanes * lanes;
    float r = sum ? 0.0f : -INFINITY;
    for (int l = base; l < base + lanes; ++l) r = sum ? r + v[l] : std::fmax(r, v[l]);
    return r;
  };
  int64_t bad = 0;
  for (int lane = 0; lane < kWarpSize; ++lane) {
    const float* o = &out[lane * kReduceOuts];
    int k = 0;
    for (int m = 1; m < kWarpSize; m *= 2) {
      bad += o[k++] != std::fmax(v[lane], v[lane ^ m]);
      bad += o[k++] != v[lane] + v[lane ^ m];
    }
    for (int lanes : {4, 16, kWarpSize}) {
      bad += o[k++] != group(lane, lanes, false);
      bad += o[k++] != group(lane, lanes, true);
    }
  }
  Report("xor shuffles and lane-group reductions", bad, int64_t{kWarpSize} * kReduceOuts);
  uint64_t want = 0;
  for (int lane = 0; lane < kWarpSize; ++lane) want |= uint64_t{v[lane] > 0.0f} << lane;
  Report("ballot", ballot[0] != want, 1);
  bad = 0;
  for (int lane = 0; lane < kWarpSize; ++lane) {
    bad +=
        shuf[lane] != ((uint64_t{0x9e3779b9u} << 32) | static_cast<uint32_t>(lane * 7 % kWarpSize));
  }
  Report("64-bit shuffle", bad, kWarpSize);
  HIP_OK(hipFree(dv));
  HIP_OK(hipFree(dout));
  HIP_OK(hipFree(dballot));
  HIP_OK(hipFree(dshuf));
}

void CheckCopies(std::mt19937& rng) {
  std::vector<uint8_t> src(kCopyChunks * 16);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng() | 1u);  // never zero
  uint8_t* dsrc = ToDevice(src);
  uint8_t* d16 = DeviceArray<uint8_t>(kCopyChunks * 16);
  uint8_t* d8 = DeviceArray<uint8_t>(kCopyChunks * 8);
  uint8_t* ddma = DeviceArray<uint8_t>(kCopyChunks * 16);
  CopyKernel<<<1, kCopyChunks>>>(dsrc, d16, d8, ddma);
  HIP_OK(hipGetLastError());
  const auto o16 = ToHost(d16, kCopyChunks * 16), o8 = ToHost(d8, kCopyChunks * 8);
  const auto odma = ToHost(ddma, kCopyChunks * 16);
  int64_t bad = 0;
  for (int i = 0; i < kCopyChunks * 16; ++i) bad += o16[i] != ((i / 16) % 2 == 0 ? src[i] : 0);
  for (int i = 0; i < kCopyChunks * 8; ++i) bad += o8[i] != ((i / 8) % 2 == 0 ? src[i] : 0);
  Report("AsyncCopy16/8 with zero-fill", bad, kCopyChunks * 24);
  bad = 0;
  for (int i = 0; i < kCopyChunks * 16; ++i) {
    const int lane = (i / 16) % kWarpSize;
    const int chunk = (7 * lane) % kCopyChunks;
    bad += odma[i] != (lane % 3 != 0 ? src[16 * chunk + i % 16] : 0);
  }
  Report("GatherToLds16 with zero-fill", bad, kCopyChunks * 16);
  HIP_OK(hipFree(dsrc));
  HIP_OK(hipFree(d16));
  HIP_OK(hipFree(d8));
  HIP_OK(hipFree(ddma));
}

}  // namespace
}  // namespace smla::kernels::gpu

int main() {
  using namespace smla::kernels::gpu;
  int devices = 0;
  if (hipGetDeviceCount(&devices) != hipSuccess || devices == 0) {
    std::printf("skipped: no HIP device\n");
    return 77;  // ctest's SKIP_RETURN_CODE
  }
  std::mt19937 rng(20261130);
  CheckMfma(rng);
  CheckConversions(rng);
  CheckBytes(rng);
  CheckWave(rng);
  CheckCopies(rng);
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
