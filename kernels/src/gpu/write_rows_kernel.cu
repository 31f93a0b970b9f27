// The row-writing kernel (Backend::WriteRows): one block of kRowLanes threads quantises one bf16
// row into the pool (row_encoder.cuh).
#include <cstdint>

#include "gpu/grid_order.h"
#include "gpu/kernel_params.h"
#include "gpu/row_encoder.cuh"

namespace smla::kernels::gpu {
namespace {

__global__ void __launch_bounds__(kRowLanes)
    WriteRowsKernel(const __grid_constant__ WriteRowsKernelParams p) {
  EnterGrid();  // grid_order.h: before any access to memory
  __shared__ RowScratch amax_s;
  const int t = threadIdx.x;
  const int width = QkWidth(p.cache.geometry);
  for (int64_t r = blockIdx.x; r < p.num_rows; r += gridDim.x) {
    uint16_t x[kRowChunks];
    LoadRowValues(p.rows + r * width, width, t, x);
    EncodeRowValues(p.cache, p.slots[r], x, t, amax_s, true);
  }
}

}  // namespace

absl::Status LaunchWriteRows(const WriteRowsKernelParams& p, StreamHandle stream) {
  if (p.num_rows == 0) return absl::OkStatus();
  const int64_t blocks = p.num_rows < (int64_t{1} << 20) ? p.num_rows : (int64_t{1} << 20);
  return ToStatus(
      Launch(WriteRowsKernel, dim3(static_cast<unsigned>(blocks)), dim3(kRowLanes), 0, stream, p),
      "write-rows kernel launch");
}

}  // namespace smla::kernels::gpu
