// Device primitives for AMD gfx950 (CDNA4, 64-lane wavefronts) behind the portable layer
// (docs/gpu.md), included by primitives.h when compiling HIP. Same names and meanings as the CUDA
// primitives wherever the hardware allows; what differs is written down here:
//
// - kWarpSize is 64. Lane masks are 64-bit (LaneMask). Butterfly reductions take xor masks up
//   to kWarpSize / 2 (lane_reduce.h builds width-correct group reductions on them).
// - AsyncCopy16/8 are plain 16/8-byte loads and LDS stores: the data is in shared memory once
//   the copy returns in the issuing lane, so AsyncCommit/AsyncWait are ordering no-ops and the
//   block barrier after them publishes the data. The loads of one tile overlap each other, not
//   the compute of the previous tile. GatherToLds16 (global_load_lds_dwordx4) is the
//   asynchronous gfx950 path, for lane-contiguous destinations, with AsyncWaitLoads.
// - The bf16 matrix product is v_mfma_f32_16x16x32_bf16: a 16x16x32 tile per wavefront, its
//   fragments described by Mfma16x16x32 below (not the m16n8k16 fragments of mma.sync).
// - fp8 conversions use gfx950's OCP e4m3 instructions (gfx942 and older implement the FNUZ
//   variant, so every other target takes the exact bit-level codec instead).
// - The scale pair of E4m3x4ToBf16Scaled is two f32 (KvScale); on CUDA it is a bf16 pair.
//
// Porting a CUDA kernel: __ballot_sync -> WarpBallot; __shfl_sync of a pointer -> WarpShufflePtr;
// LoadMatrixX4 -> LoadFragmentRowMajor; LoadMatrixX4Trans -> LoadFragmentKMajor; MmaBf16
// (m16n8k16, 4+2 registers) -> MfmaBf16 (16x16x32, Bf16x8 operands, F32x4 accumulators);
// __float2bfloat162_rn(1) -> UnitKvScale(); quad reductions over lane % 4 (a row of an mma.sync
// accumulator) -> LaneGroupMax/Sum<16> (a row of an MFMA accumulator is spread over 16 lanes).
#pragma once

#include <hip/hip_runtime.h>

#include <cstdint>

#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/e4m3.h"

namespace smla::kernels::gpu {

// gfx9 (CDNA) runs 64-lane wavefronts only; the wave32 targets (RDNA) have no MFMA and stop at
// MfmaBf16's #error.
inline constexpr int kWarpSize = 64;
using LaneMask = uint64_t;  // one bit per lane of a wavefront

#if defined(__gfx950__)
#define SMLA_HIP_GFX950 1
#endif

// ---------------------------------------------------------------------------------------------
// Wavefront shuffles, reductions and votes.

// v of lane (lane ^ mask). Constant masks below 32 avoid ds_bpermute's address path: 1 and 2 are
// DPP quad permutations ([1,0,3,2], [2,3,0,1]); 4, 8 and 16 are ds_swizzle in bitmask mode
// (and-mask 0x1f, xor-mask in bits 14:10), which swaps neighbouring groups of that many lanes.
// Every lane of the wavefront must take part, as with CUDA's full-mask shuffles.
__device__ __forceinline__ float XorShuffle(float v, int mask) {
#if defined(__HIP_DEVICE_COMPILE__)
  if (__builtin_constant_p(mask)) {
    const int x = __builtin_bit_cast(int, v);
    if (mask == 1) return __builtin_bit_cast(float, __builtin_amdgcn_mov_dpp(x, 0xb1, 0xf, 0xf, 0));
    if (mask == 2) return __builtin_bit_cast(float, __builtin_amdgcn_mov_dpp(x, 0x4e, 0xf, 0xf, 0));
    if (mask == 4) return __builtin_bit_cast(float, __builtin_amdgcn_ds_swizzle(x, 0x101f));
    if (mask == 8) return __builtin_bit_cast(float, __builtin_amdgcn_ds_swizzle(x, 0x201f));
    if (mask == 16) return __builtin_bit_cast(float, __builtin_amdgcn_ds_swizzle(x, 0x401f));
  }
#endif
  return __shfl_xor(v, mask, kWarpSize);
}
__device__ __forceinline__ float WarpXorMax(float v, int mask) {
  return fmaxf(v, XorShuffle(v, mask));
}
__device__ __forceinline__ float WarpXorSum(float v, int mask) { return v + XorShuffle(v, mask); }
// The largest / smallest v of the wavefront, in every lane (values below 2^24, exact as f32).
__device__ __forceinline__ uint32_t WarpMaxU32(uint32_t v) {
  float f = static_cast<float>(v);
  for (int m = 1; m < kWarpSize; m *= 2) f = WarpXorMax(f, m);
  return static_cast<uint32_t>(f);
}
__device__ __forceinline__ uint32_t WarpMinU32(uint32_t v) {
  float f = -static_cast<float>(v);
  for (int m = 1; m < kWarpSize; m *= 2) f = WarpXorMax(f, m);
  return static_cast<uint32_t>(-f);
}
// v of lane `src` (every lane of the wavefront must take part).
__device__ __forceinline__ uint32_t WarpShuffle(uint32_t v, int src) {
  return static_cast<uint32_t>(__shfl(static_cast<int>(v), src, kWarpSize));
}
__device__ __forceinline__ uint64_t WarpShuffle(uint64_t v, int src) {
  return static_cast<uint64_t>(__shfl(static_cast<unsigned long long>(v), src, kWarpSize));
}
template <class T>
__device__ __forceinline__ T* WarpShufflePtr(T* p, int src) {
  return reinterpret_cast<T*>(WarpShuffle(reinterpret_cast<uint64_t>(p), src));
}
// Bit i set when lane i's predicate is true (inactive lanes read as false).
__device__ __forceinline__ LaneMask WarpBallot(bool pred) {
  return static_cast<LaneMask>(__ballot(pred));
}

// Whether the predicate holds in every lane of the wavefront.
__device__ __forceinline__ bool WarpAll(bool pred) { return __all(pred) != 0; }
// The byte-wise maximum of two words of four unsigned bytes (CUDA's __vmaxu4).
__device__ __forceinline__ uint32_t MaxBytes4(uint32_t a, uint32_t b) {
  uint32_t r = 0;
#pragma unroll
  for (int i = 0; i < 32; i += 8) r |= max((a >> i) & 0xffu, (b >> i) & 0xffu) << i;
  return r;
}

// This lane's index in its wavefront.
__device__ __forceinline__ int LaneId() {
#if defined(__HIP_DEVICE_COMPILE__)
  return static_cast<int>(__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)));
#else
  return static_cast<int>(threadIdx.x % kWarpSize);  // the host pass never runs device code
#endif
}
// v, through an empty asm the compiler must run where it stands: what is computed from it is
// recomputed in each iteration of a loop instead of hoisted out and held in registers (or in
// scratch, where a program is at its VGPR limit) for the whole loop.
__device__ __forceinline__ unsigned Unhoisted(unsigned v) {
#if defined(__HIP_DEVICE_COMPILE__)
  asm volatile("" : "+v"(v));
#endif
  return v;
}
__device__ __forceinline__ int Unhoisted(int v) {
  return static_cast<int>(Unhoisted(static_cast<unsigned>(v)));
}

// ---------------------------------------------------------------------------------------------
// Shared memory (LDS) addresses and the gather copies.

using LdsPtr = __attribute__((address_space(3))) void*;
// Plain vector types for the copies (HIP's uint4 has no assignment into address space 3).
typedef uint32_t U32x4 __attribute__((ext_vector_type(4)));
typedef uint32_t U32x2 __attribute__((ext_vector_type(2)));

// The 32-bit LDS offset of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(reinterpret_cast<uintptr_t>((LdsPtr)(const_cast<void*>(p))));
}
template <class T>
__device__ __forceinline__ __attribute__((address_space(3))) T* LdsAt(uint32_t offset) {
  return reinterpret_cast<__attribute__((address_space(3))) T*>(static_cast<uintptr_t>(offset));
}

// 16-byte global -> shared copy; when `valid` is false nothing is read and the 16 destination
// bytes are zero-filled (how sentinels stay unread).
__device__ __forceinline__ void AsyncCopy16(uint32_t smem, const void* gmem, bool valid) {
  U32x4 v = {0, 0, 0, 0};
  if (valid) v = *static_cast<const U32x4*>(gmem);
  *LdsAt<U32x4>(smem) = v;
}
__device__ __forceinline__ void AsyncCopy16(void* smem, const void* gmem, bool valid) {
  AsyncCopy16(SharedAddress(smem), gmem, valid);
}
// 8-byte variant (the fp8_dsv4 scale records are 8-byte aligned only).
__device__ __forceinline__ void AsyncCopy8(uint32_t smem, const void* gmem, bool valid) {
  U32x2 v = {0, 0};
  if (valid) v = *static_cast<const U32x2*>(gmem);
  *LdsAt<U32x2>(smem) = v;
}
__device__ __forceinline__ void AsyncCopy8(void* smem, const void* gmem, bool valid) {
  AsyncCopy8(SharedAddress(smem), gmem, valid);
}
// The copies above complete in the issuing lane; these keep the CUDA pipeline's structure.
__device__ __forceinline__ void AsyncCommit() {}
template <int n>
__device__ __forceinline__ void AsyncWait() {
  static_assert(n >= 0, "a wait names how many groups may stay in flight");
}

// gfx950's direct-to-LDS gather (global_load_lds_dwordx4): lane i of the wavefront loads 16
// bytes from its own `gmem` into LDS at lds_base + 16 * i, without passing through registers.
// `lds_base` must be the same in every lane (it is the wavefront's M0); lanes whose `valid` is
// false store 16 zero bytes there instead. Completes asynchronously: see AsyncWaitLoads.
__device__ __forceinline__ void GatherToLds16(uint32_t lds_base, const void* gmem, bool valid) {
#if defined(SMLA_HIP_GFX950)
  if (valid) {
    using GlobalPtr = __attribute__((address_space(1))) void*;
    __builtin_amdgcn_global_load_lds((GlobalPtr)(const_cast<void*>(gmem)), LdsAt<void>(lds_base),
                                     16, 0, 0);
  } else {
    *LdsAt<U32x4>(lds_base + 16 * LaneId()) = U32x4{0, 0, 0, 0};
  }
#else
  AsyncCopy16(lds_base + 16 * LaneId(), gmem, valid);
#endif
}
// Waits until at most `n` vector-memory loads of this wavefront are in flight (they complete
// in issue order), so every GatherToLds16 issued before the last n loads has landed in LDS;
// `n` counts all loads issued since, index loads included. A block barrier then publishes the
// data to the other wavefronts.
template <int n>
__device__ __forceinline__ void AsyncWaitLoads() {
  static_assert(n >= 0 && n < 64, "vmcnt counts up to 63 loads");
#if defined(SMLA_HIP_GFX950)
  // s_waitcnt's immediate on gfx9: vmcnt in bits 3:0 and 15:14; expcnt and lgkmcnt at maximum.
  __builtin_amdgcn_s_waitcnt((n & 0xf) | ((n >> 4) << 14) | (0x7 << 4) | (0xf << 8));
#endif
}

// ---------------------------------------------------------------------------------------------
// bf16 matrix product: D = A * B + C on a 16x16x32 tile per wavefront, f32 accumulators.
//
// Fragment layouts (64 lanes; q = lane / 16, r = lane % 16):
//   A (16 x 32, m x k)  a[e], e = 0..7: (m = r,          k = 8q + e)
//   B (32 x 16, k x n)  b[e], e = 0..7: (k = 8q + e,     n = r)
//   C (16 x 16, m x n)  c[i], i = 0..3: (m = 4q + i,     n = r)
// The product sums over k, so it only needs A and B to agree on which k each (lane, element)
// holds; C's map is the hardware's. A row of A (or a column of B) is 8 consecutive bf16 of one
// lane: one 16-byte read from a row-major tile (K rows for Q.K^T are B's columns, stored
// key-major, so they read the same way). B read from a k-major (row = key) tile, as V is in
// P.V, needs a transposing read: LoadFragmentKMajor.

typedef __bf16 Bf16x8 __attribute__((ext_vector_type(8)));
typedef float F32x4 __attribute__((ext_vector_type(4)));

struct Mfma16x16x32 {
  static constexpr int kM = 16;
  static constexpr int kN = 16;
  static constexpr int kK = 32;
  static constexpr int kAElems = 8;  // bf16 per lane
  static constexpr int kBElems = 8;
  static constexpr int kCElems = 4;  // f32 per lane
  static_assert(kM * kK == kWarpSize * kAElems, "A fragment covers the tile once");
  static_assert(kK * kN == kWarpSize * kBElems, "B fragment covers the tile once");
  static_assert(kM * kN == kWarpSize * kCElems, "C fragment covers the tile once");

  SMLA_HD static constexpr int ARow(int lane, int e) { return (void)e, lane % 16; }
  SMLA_HD static constexpr int ACol(int lane, int e) { return 8 * (lane / 16) + e; }
  SMLA_HD static constexpr int BRow(int lane, int e) { return 8 * (lane / 16) + e; }
  SMLA_HD static constexpr int BCol(int lane, int e) { return (void)e, lane % 16; }
  SMLA_HD static constexpr int CRow(int lane, int i) { return 4 * (lane / 16) + i; }
  SMLA_HD static constexpr int CCol(int lane, int i) { return (void)i, lane % 16; }
};

// c += a * b. gfx950 has the 32-deep instruction; older MFMA targets run two 16-deep products
// on the fragment's halves (their 16x16x16 fragments hold 4 k per lane with the same m/n
// maps, and the k assignment only has to agree between A and B).
__device__ __forceinline__ void MfmaBf16(F32x4& c, Bf16x8 a, Bf16x8 b) {
#if defined(SMLA_HIP_GFX950)
  c = __builtin_amdgcn_mfma_f32_16x16x32_bf16(a, b, c, 0, 0, 0);
#elif defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
  typedef short S16x8 __attribute__((ext_vector_type(8)));
  const S16x8 ai = __builtin_bit_cast(S16x8, a);
  const S16x8 bi = __builtin_bit_cast(S16x8, b);
  c = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(ai.lo, bi.lo, c, 0, 0, 0);
  c = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(ai.hi, bi.hi, c, 0, 0, 0);
#elif defined(__HIP_DEVICE_COMPILE__)
#error "smla HIP primitives: no bf16 MFMA for this target (gfx950 is the supported one)"
#else
  (void)c, (void)a, (void)b;  // the host pass parses device code but never runs it
#endif
}

// A fragment from four packed bf16 pairs (values e = 0..7 low-first), e.g. the words of
// E4m3x4ToBf16Scaled: fp8 rows dequantise straight into operand registers.
__device__ __forceinline__ Bf16x8 Bf16x8FromWords(uint2 lo, uint2 hi) {
  return __builtin_bit_cast(Bf16x8, U32x4{lo.x, lo.y, hi.x, hi.y});
}

// A fragment (or B from an n-major tile) of a bf16 tile with `stride` elements per row: lane
// reads the 8 consecutive values of row ARow at columns ACol(lane, 0..7) with one 16-byte read.
__device__ __forceinline__ Bf16x8 LoadFragmentRowMajor(const uint16_t* tile, int stride, int lane) {
  const uint16_t* p = tile + Mfma16x16x32::ARow(lane, 0) * stride + Mfma16x16x32::ACol(lane, 0);
  return *reinterpret_cast<const Bf16x8*>(p);
}
// B fragment from a k-major tile (row = k, `stride` elements per row): 8 two-byte reads down a
// column. (gfx950's ds_read_b64_tr_b16 transposing read is the faster replacement.)
__device__ __forceinline__ Bf16x8 LoadFragmentKMajor(const uint16_t* tile, int stride, int lane) {
  const uint16_t* p = tile + Mfma16x16x32::BRow(lane, 0) * stride + Mfma16x16x32::BCol(lane, 0);
  Bf16x8 v;
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = __builtin_bit_cast(__bf16, p[e * stride]);
  return v;
}

// ---------------------------------------------------------------------------------------------
// bf16 and fp8 conversions.

// Two bf16 values (round to nearest even) packed low-first.
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
#if defined(SMLA_HIP_GFX950)
  typedef __bf16 Bf16x2 __attribute__((ext_vector_type(2)));
  const Bf16x2 v = {static_cast<__bf16>(lo), static_cast<__bf16>(hi)};  // v_cvt_pk_bf16_f32
  return __builtin_bit_cast(uint32_t, v);
#else
  return static_cast<uint32_t>(F32ToBf16Bits(lo)) |
         (static_cast<uint32_t>(F32ToBf16Bits(hi)) << 16);
#endif
}

// f32 -> bf16 (nearest even) -> f32; equals the codec's RoundToBf16 for every non-NaN input.
__device__ __forceinline__ float RoundToBf16Fast(float x) {
#if defined(SMLA_HIP_GFX950)
  return static_cast<float>(static_cast<__bf16>(x));
#else
  return RoundToBf16(x);
#endif
}

// Two e4m3 codes (low byte first) to their exact f32 values (NaN for 0x7F/0xFF).
__device__ __forceinline__ float2 E4m3x2ToFloat2(uint16_t codes) {
#if defined(SMLA_HIP_GFX950)
  const auto f = __builtin_amdgcn_cvt_pk_f32_fp8(static_cast<int>(codes), false);
  return make_float2(f[0], f[1]);
#else
  return make_float2(DecodeE4m3(static_cast<uint8_t>(codes & 0xffu)),
                     DecodeE4m3(static_cast<uint8_t>(codes >> 8)));
#endif
}

// One f16 value (nearest even) in the low 16 bits. (The direct kernel's f16 operands are a
// CUDA path, direct_layout.h kF16Operands; this keeps its discarded branches well-formed.)
inline constexpr int kF16CodeExp = 0;
__device__ __forceinline__ uint16_t F32ToF16Bits(float x) {
  return __builtin_bit_cast(uint16_t, static_cast<_Float16>(x));
}
__device__ __forceinline__ float F16BitsToF32(uint16_t bits) {
  return static_cast<float>(__builtin_bit_cast(_Float16, bits));
}

// The scales dequantised KV values are multiplied by, one per half of a packed pair (a power
// of two for fp8_dsv4, 1 for fp8_per_tensor tiles): two f32 here, a bf16 pair on CUDA. The
// CUDA names are kept so that kernels read the same on both vendors.
typedef float KvScale __attribute__((ext_vector_type(2)));
__device__ __forceinline__ KvScale UnitKvScale() { return KvScale{1.0f, 1.0f}; }
// 2^(byte-127) of a UE8M0 scale byte, exact (byte 0 is the f32 subnormal 2^-127).
__device__ __forceinline__ float E8m0ToFloat(uint32_t byte) {
  return BitsFloat(max(byte << 23, 0x00400000u));
}
// 2^x for the softmax weights (Exp2Ftz on CUDA); exp2f here, where it is one instruction.
__device__ __forceinline__ float Exp2Ftz(float x) { return exp2f(x); }
__device__ __forceinline__ KvScale E8m0ToBf16x2(uint32_t byte) {
  const float v = E8m0ToFloat(byte);
  return KvScale{v, v};
}
// Two scale bytes, the low half's from `lo`.
__device__ __forceinline__ KvScale E8m0PairToBf16x2(uint32_t lo, uint32_t hi) {
  return KvScale{E8m0ToFloat(lo), E8m0ToFloat(hi)};
}

// Four e4m3 codes (byte i of `codes`) to four bf16 values, as two packed words (codes 0-1 and
// 2-3); code 2j+h is multiplied by scale[h]. The f32 product of an e4m3 value and a
// power-of-two scale is exact, so the one rounding is PackBf16's nearest-even, as docs/operator.md
// section 3 defines.
__device__ __forceinline__ uint2 E4m3x4ToBf16Scaled(uint32_t codes, KvScale scale) {
#if defined(SMLA_HIP_GFX950)
  const auto lo = __builtin_amdgcn_cvt_pk_f32_fp8(static_cast<int>(codes), false);
  const auto hi = __builtin_amdgcn_cvt_pk_f32_fp8(static_cast<int>(codes), true);
  return make_uint2(PackBf16(lo[0] * scale[0], lo[1] * scale[1]),
                    PackBf16(hi[0] * scale[0], hi[1] * scale[1]));
#else
  const float2 lo = E4m3x2ToFloat2(static_cast<uint16_t>(codes & 0xffffu));
  const float2 hi = E4m3x2ToFloat2(static_cast<uint16_t>(codes >> 16));
  return make_uint2(PackBf16(lo.x * scale[0], lo.y * scale[1]),
                    PackBf16(hi.x * scale[0], hi.y * scale[1]));
#endif
}
// The same without a scale (fp8_per_tensor folds its scale into the scores and P).
__device__ __forceinline__ uint2 E4m3x4ToBf16(uint32_t codes) {
  return E4m3x4ToBf16Scaled(codes, UnitKvScale());
}

// The folded fp8_dsv4 conversion's names (CUDA multiplies once by 2^(120 + k) in bf16): here
// the factor is the scale times 2^120 in f32 and the conversion takes the 2^120 back out, both
// exact, so the result equals E4m3x4ToBf16Scaled's.
__device__ __forceinline__ KvScale E8m0PairTimes2p120(uint32_t lo, uint32_t hi) {
  return KvScale{BitsFloat((lo + 120) << 23), BitsFloat((hi + 120) << 23)};
}
__device__ __forceinline__ uint2 E4m3x4ToBf16Times(uint32_t codes, KvScale factor) {
  constexpr float k2m120 = 0x1p-120f;
  return E4m3x4ToBf16Scaled(codes, KvScale{factor[0] * k2m120, factor[1] * k2m120});
}

// Bytes of (a, b) chosen by `selector` as CUDA's __byte_perm: result byte i is byte
// (selector >> 4i) & 7 of the eight bytes a (0-3), b (4-7). v_perm_b32 takes one selector
// byte per result byte and numbers its first source's bytes 4-7, hence the swap.
__device__ __forceinline__ uint32_t PermuteBytes(uint32_t a, uint32_t b, uint32_t selector) {
#if defined(__HIP_DEVICE_COMPILE__)
  const uint32_t sel = (selector & 0x7u) | ((selector >> 4) & 0x7u) << 8 |
                       ((selector >> 8) & 0x7u) << 16 | ((selector >> 12) & 0x7u) << 24;
  return __builtin_amdgcn_perm(b, a, sel);
#else
  const uint64_t bytes = (uint64_t{b} << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t index = (selector >> (4 * i)) & 7u;
    r |= static_cast<uint32_t>((bytes >> (8 * index)) & 0xffu) << (8 * i);
  }
  return r;
#endif
}

// Two MXFP8 lanes under a group's scale: e4m3 codes (nearest even, saturating at +-448) of
// x * inv_scale; low byte = first lane. Equals the codec's MxEncodeLane for every non-NaN input.
__device__ __forceinline__ uint16_t MxEncodePair(float x0, float x1, float inv_scale) {
#if defined(SMLA_HIP_GFX950)
  // The conversion does not saturate by itself; clamping first keeps NaN a NaN.
  auto clamp = [](float v) { return v > kE4m3Max ? kE4m3Max : (v < -kE4m3Max ? -kE4m3Max : v); };
  const int packed =
      __builtin_amdgcn_cvt_pk_fp8_f32(clamp(x0 * inv_scale), clamp(x1 * inv_scale), 0, false);
  return static_cast<uint16_t>(packed & 0xffff);
#else
  return static_cast<uint16_t>(EncodeE4m3(x0 * inv_scale) |
                               (static_cast<uint32_t>(EncodeE4m3(x1 * inv_scale)) << 8));
#endif
}

}  // namespace smla::kernels::gpu
