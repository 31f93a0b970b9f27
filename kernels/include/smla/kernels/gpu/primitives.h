// Device primitives behind the portable layer (docs/gpu.md): warp shuffles, asynchronous 16-byte
// gathers into shared memory, shared-memory matrix loads, the bf16 matrix product of a 16x8x16
// tile, and paired fp8 -> f16 conversion. One tiny function per instruction, each with the
// fragment layout it assumes written down, so a port replaces only these.
//
// Fragment layouts (m16n8k16, 32 lanes; g = lane / 4, c = lane % 4):
//   A (16x16, row-major)  a[0]: (g, 2c..2c+1)   a[1]: (g+8, 2c..)   a[2]: (g, 2c+8..)  a[3]: (g+8,
//   2c+8..) B (16x8, k x n)       b[0]: (k=2c..2c+1, n=g)                    b[1]: (k=2c+8.., n=g)
//   C (16x8, f32)         c[0..1]: (g, 2c..2c+1)                     c[2..3]: (g+8, 2c..2c+1)
#pragma once

#if defined(__HIP__)
// AMD gfx950: the same primitives over 64-lane wavefronts and MFMA.
#include "smla/kernels/gpu/primitives_hip.h"
#else

#include <cstdint>

#if defined(__CUDACC__) && !defined(__HIP_PLATFORM_AMD__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#define SMLA_DEVICE_CUDA 1
#endif

namespace smla::kernels::gpu {

inline constexpr int kWarpSize = 32;

#if defined(SMLA_DEVICE_CUDA)

using LaneMask = uint32_t;  // one bit per lane of a warp

// This lane's index in its warp (the kernels launch 1-D blocks).
__device__ __forceinline__ int LaneId() { return static_cast<int>(threadIdx.x % kWarpSize); }
// v itself. On gfx950 (primitives_hip.h) a value the compiler cannot hoist out of a loop; here
// nothing, so CUDA's code does not change.
__device__ __forceinline__ int Unhoisted(int v) { return v; }
__device__ __forceinline__ unsigned Unhoisted(unsigned v) { return v; }
// Bit i set when lane i's predicate is true.
__device__ __forceinline__ LaneMask WarpBallot(bool pred) {
  return __ballot_sync(0xffffffffu, pred);
}
// Whether the predicate holds in every lane.
__device__ __forceinline__ bool WarpAll(bool pred) { return __all_sync(0xffffffffu, pred); }
// The byte-wise maximum of two words of four unsigned bytes.
__device__ __forceinline__ uint32_t MaxBytes4(uint32_t a, uint32_t b) { return __vmaxu4(a, b); }
// v of lane `src`.
__device__ __forceinline__ uint32_t WarpShuffle(uint32_t v, int src) {
  return __shfl_sync(0xffffffffu, v, src);
}
__device__ __forceinline__ uint64_t WarpShuffle(uint64_t v, int src) {
  return __shfl_sync(0xffffffffu, static_cast<unsigned long long>(v), src);
}
template <class T>
__device__ __forceinline__ T* WarpShufflePtr(T* p, int src) {
  return reinterpret_cast<T*>(WarpShuffle(reinterpret_cast<uint64_t>(p), src));
}

__device__ __forceinline__ float WarpXorMax(float v, int mask) {
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, mask));
}
// The largest / smallest v of the warp, in every lane (values below 2^24; one instruction here).
__device__ __forceinline__ uint32_t WarpMaxU32(uint32_t v) {
  return __reduce_max_sync(0xffffffffu, v);
}
__device__ __forceinline__ uint32_t WarpMinU32(uint32_t v) {
  return __reduce_min_sync(0xffffffffu, v);
}
__device__ __forceinline__ float WarpXorSum(float v, int mask) {
  return v + __shfl_xor_sync(0xffffffffu, v, mask);
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that completes asynchronously; when `valid` is false nothing is
// read and the 16 destination bytes are zero-filled (how sentinels stay unread).
__device__ __forceinline__ void AsyncCopy16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(smem)),
               "l"(gmem), "r"(src_bytes));
}
// 8-byte variant (the fp8_dsv4 scale records are 8-byte aligned only).
__device__ __forceinline__ void AsyncCopy8(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(SharedAddress(smem)),
               "l"(gmem), "r"(src_bytes));
}
// The same with the destination as a shared-memory address (saves the conversion per copy).
__device__ __forceinline__ void AsyncCopy16(uint32_t smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void AsyncCopy8(uint32_t smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void AsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `n` committed groups are still in flight.
template <int n>
__device__ __forceinline__ void AsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
}

// Four 8x8 b16 matrices from shared memory; lane l names the row address of matrix l / 8.
__device__ __forceinline__ void LoadMatrixX4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(smem_row)));
}
// The same, transposed: for a row-major k x n operand read as B.
__device__ __forceinline__ void LoadMatrixX4Trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(smem_row)));
}

// c += a * b on the tensor cores, bf16 inputs, f32 accumulators.
__device__ __forceinline__ void MmaBf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two bf16 values (RNE) packed low-first.
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Two e4m3 codes (low byte first) to exact f32 values with the paired conversion instruction.
__device__ __forceinline__ float2 E4m3x2ToFloat2(uint16_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(codes, __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// The scale pair dequantised KV values are multiplied by (a bf16 pair here, two f32 on HIP).
using KvScale = __nv_bfloat162;
__device__ __forceinline__ KvScale UnitKvScale() { return __float2bfloat162_rn(1.0f); }

// Two e4m3 codes of `codes` in bf16 bit positions: each code's sign at bit 15 of its half, its
// other seven bits at bits 4-10. prmt puts each code in the low byte of its half and its sign,
// replicated, in the high byte (a selector nibble of 0-7 copies a byte, 8 more replicates its
// sign); one shift and one mask then keep a copy of the sign at bit 15: three instructions a
// pair. kE4m3Codes01 takes codes 0 and 1, kE4m3Codes23 codes 2 and 3.
inline constexpr uint32_t kE4m3Codes01 = 0x9180;
inline constexpr uint32_t kE4m3Codes23 = 0xb3a2;
template <uint32_t kSelector>
__device__ __forceinline__ uint32_t E4m3PairBits(uint32_t codes) {
  uint32_t x;
  asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(x) : "r"(codes), "n"(kSelector));
  return (x << 4) & 0x87f087f0u;
}

// Four e4m3 codes (byte i of `codes`) times `factor` (bf16x2), as two packed words (codes 0-1
// and 2-3) with one rounding per value. The code's bits are placed in a bf16 whose exponent
// field is the code's (bias 127 instead of 7), which is code * 2^-120 exactly for normal and
// subnormal codes, so a factor of 2^(120+k) yields the rounded code * 2^k whenever 2^(120+k)
// is a normal bf16.
__device__ __forceinline__ uint2 E4m3x4ToBf16Times(uint32_t codes, __nv_bfloat162 factor) {
  const uint32_t wl = E4m3PairBits<kE4m3Codes01>(codes);
  const uint32_t wh = E4m3PairBits<kE4m3Codes23>(codes);
  const __nv_bfloat162 a = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&wl), factor);
  const __nv_bfloat162 b = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&wh), factor);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
}

// 2^120 in both halves: the factor that gives the codes' exact values.
__device__ __forceinline__ __nv_bfloat162 E4m3Rebias() {
  return __halves2bfloat162(__ushort_as_bfloat16(0x7b80), __ushort_as_bfloat16(0x7b80));
}

// Four e4m3 codes to four bf16 values times `scale` (bf16x2, both halves equal): the codes'
// exact values, then the scale multiply rounds once to nearest even, which equals rounding the
// exact f32 product (docs/operator.md section 3).
__device__ __forceinline__ uint2 E4m3x4ToBf16Scaled(uint32_t codes, __nv_bfloat162 scale) {
  const uint2 v = E4m3x4ToBf16Times(codes, E4m3Rebias());
  const __nv_bfloat162 a = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v.x), scale);
  const __nv_bfloat162 b = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v.y), scale);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
}

// Four e4m3 codes to bf16 without a scale (fp8_per_tensor folds its scale elsewhere): one
// multiply per pair.
__device__ __forceinline__ uint2 E4m3x4ToBf16(uint32_t codes) {
  return E4m3x4ToBf16Times(codes, E4m3Rebias());
}

// 2^(byte-127) of a UE8M0 scale byte as bf16x2 (byte 0 is the subnormal 2^-127).
__device__ __forceinline__ __nv_bfloat162 E8m0ToBf16x2(uint32_t byte) {
  const unsigned short bits = byte == 0 ? 0x0040 : static_cast<unsigned short>(byte << 7);
  const __nv_bfloat16 v = __ushort_as_bfloat16(bits);
  return __halves2bfloat162(v, v);
}

// f32 -> bf16 (nearest even) -> f32 with the conversion instruction; equals the codec's
// RoundToBf16 for every non-NaN input.
__device__ __forceinline__ float RoundToBf16Fast(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

// Two MXFP8 lanes under a group's scale byte: e4m3 codes (nearest even, saturating at +-448)
// of x * 2^(127 - scale_byte) with the paired conversion instruction; low byte = first lane.
// Equals the codec's MxEncodeLane for every non-NaN input.
__device__ __forceinline__ uint16_t MxEncodePair(float x0, float x1, float inv_scale) {
  const __nv_fp8x2_storage_t v = __nv_cvt_float2_to_fp8x2(
      make_float2(x0 * inv_scale, x1 * inv_scale), __NV_SATFINITE, __NV_E4M3);
  return static_cast<uint16_t>(v);
}

// 2^(byte - 7) per half for UE8M0 bytes <= 134: the scale 2^(byte-127) times 2^120.
__device__ __forceinline__ __nv_bfloat162 E8m0PairTimes2p120(uint32_t lo, uint32_t hi) {
  const uint32_t w = ((lo + 120) << 7) | ((hi + 120) << 23);
  return *reinterpret_cast<const __nv_bfloat162*>(&w);
}

// Two UE8M0 scale bytes as one bf16x2 (low half from `lo`), as E8m0ToBf16x2 per half.
__device__ __forceinline__ __nv_bfloat162 E8m0PairToBf16x2(uint32_t lo, uint32_t hi) {
  const uint32_t bl = lo == 0 ? 0x0040u : lo << 7;
  const uint32_t bh = hi == 0 ? 0x0040u : hi << 7;
  const uint32_t w = bl | (bh << 16);
  return *reinterpret_cast<const __nv_bfloat162*>(&w);
}

// ---- f16 operands (the direct kernel's fp8 path, direct_layout.h kF16Operands) ----

// c += a * b on the tensor cores, f16 inputs, f32 accumulators.
__device__ __forceinline__ void MmaF16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four e4m3 codes (byte i of `codes`) to their exact f16 values (every e4m3 value, subnormals
// included, is a normal f16; kF16CodeExp = 0), as two packed words: codes 0-1 and 2-3. One
// paired conversion instruction per word.
inline constexpr int kF16CodeExp = 0;
__device__ __forceinline__ uint2 E4m3x4ToF16(uint32_t codes) {
  uint32_t lo, hi;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(codes));
  return make_uint2(lo, hi);
}

// 2^(byte-127) of a UE8M0 scale byte as an exact f32 (byte 0 is the subnormal 2^-127, the only
// byte whose shifted bits fall below 0x00400000: one min instead of a test and a select).
__device__ __forceinline__ float E8m0ToFloat(uint32_t byte) {
  return __uint_as_float(max(byte << 23, 0x00400000u));
}

// 2^x with results below 2^-126 flushed to zero: the softmax weights and rescale factors, where
// such a term is below f32 resolution beside the weight 1 of the running maximum (exp2f's
// subnormal path costs three instructions per call).
__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Packed f16 pair product (round to nearest even), and the same for a bf16 pair.
__device__ __forceinline__ uint32_t MulF16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t MulBf16x2(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162 y = *reinterpret_cast<const __nv_bfloat162*>(&b);
  x = __hmul2(x, y);
  return *reinterpret_cast<const uint32_t*>(&x);
}

// One f16 value (nearest even) in the low 16 bits.
__device__ __forceinline__ uint16_t F32ToF16Bits(float x) {
  return __half_as_ushort(__float2half_rn(x));
}
// The f16 value of 16 bits, exact as f32.
__device__ __forceinline__ float F16BitsToF32(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

// Bytes of (a, b) chosen by `selector` (four 4-bit byte indices, a = 0-3, b = 4-7).
__device__ __forceinline__ uint32_t PermuteBytes(uint32_t a, uint32_t b, uint32_t selector) {
  return __byte_perm(a, b, selector);
}

#else
#error "smla GPU primitives: only the CUDA (sm_90a) implementation exists so far"
#endif

}  // namespace smla::kernels::gpu

#endif  // defined(__HIP__)
