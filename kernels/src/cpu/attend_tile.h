// The inner step of the CPU backend: one tile of up to kKeyTile staged keys (the plan's tile,
// smla/kernels/plan.h) folded into the online-softmax state of a block of heads
// (docs/operator.md section 5, base 2).
#pragma once

#include "smla/kernels/plan.h"

namespace smla::kernels::cpu {

struct TileArgs {
  const float* q = nullptr;  // [heads, width] staged q (bf16 values or e4m3 codes)
  int heads = 0;
  int width = 0;                       // QkWidth: 512 or 576; a multiple of 16
  const float* keys = nullptr;         // [n, width] staged keys; V is the first 512 lanes
  const float* score_scale = nullptr;  // [n] sigma_j * softmax_scale * q_scale * log2(e)
  const float* sigma = nullptr;        // [n] per-tensor scale of key j's segment, else 1
  int n = 0;                           // keys in the tile, 1..kKeyTile
  float* m = nullptr;                  // [heads] running max, base 2; -inf before any key
  float* l = nullptr;                  // [heads] running sum of 2^(s - m)
  float* acc = nullptr;                // [heads, 512] unnormalised sum of p * v
};

// Scores in f32, P rounded to bf16 (after folding sigma in) for the PV product.
void AccumulateTile(const TileArgs& a);

}  // namespace smla::kernels::cpu
