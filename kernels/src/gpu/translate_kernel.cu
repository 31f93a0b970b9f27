// Chosen entries into pool slots (Backend::TranslateEntries): one block per row, each thread
// translating every kTranslateThreads-th id with the TranslateEntry the CPU backend uses, and one
// atomic OR per row whose block saw an id out of range.
#include <cstdint>

#include "gpu/kernel_params.h"
#include "smla/kernels/input_checks.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kTranslateThreads = 128;

__global__ void __launch_bounds__(kTranslateThreads)
    TranslateKernel(const __grid_constant__ TranslateParams p) {
  for (int32_t r = blockIdx.x; r < p.num_rows; r += gridDim.x) {
    const TranslateRow row = p.rows[r];
    bool bad = false;
    for (int32_t k = threadIdx.x; k < row.width; k += kTranslateThreads) {
      row.out[k] = TranslateEntry(row.ids[k], row.table, p.page_shift, row.limit, bad);
    }
    if (__syncthreads_or(bad ? 1 : 0) != 0 && threadIdx.x == 0) {
      atomicOr(p.flags + row.group, kFlagChosenEntry);
    }
  }
}

}  // namespace

absl::Status LaunchTranslate(const TranslateParams& p, StreamHandle stream) {
  if (p.num_rows == 0) return absl::OkStatus();
  const int32_t blocks = p.num_rows < (1 << 16) ? p.num_rows : (1 << 16);
  TranslateKernel<<<static_cast<unsigned>(blocks), kTranslateThreads, 0, stream>>>(p);
  return ToStatus(GetLastError(), "translate kernel launch");
}

}  // namespace smla::kernels::gpu
