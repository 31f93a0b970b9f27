// Row writes (Backend::WriteRows): each 32 lanes of a block write one row (row_writer.cuh,
// shared with the checking kernel, which writes a small launch's rows itself), a block eight.
#include <cstdint>

#include "gpu/grid_order.h"
#include "gpu/kernel_params.h"
#include "gpu/row_writer.cuh"

namespace smla::kernels::gpu {
namespace {

constexpr int kRowsPerBlock = 8;
constexpr int kRowThreads = kRowsPerBlock * kRowLanes;

__global__ void __launch_bounds__(kRowThreads)
    WriteRowsKernel(const __grid_constant__ WriteRowsKernelParams p) {
  EnterGrid();  // grid_order.h: before any access to memory
  const int t = threadIdx.x;
  // The flags are final (the checks ran before this kernel): the first block hands them to the
  // host, so that no copy has to follow the attention for them.
  if (blockIdx.x == 0) {
    for (int i = t; i < p.num_flags; i += kRowThreads) p.flags_out[i] = p.group_flags[i];
  }
  const int64_t stride = int64_t{gridDim.x} * kRowsPerBlock;
  for (int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + t / kRowLanes; r < p.num_rows;
       r += stride) {
    // A flagged step writes nothing. WriteRowLanes reads the row whatever `skip` is and tests it
    // only at its stores, so the row's loads need not wait for the flag's two dependent loads.
    const bool skip = p.groups != nullptr && p.group_flags[p.groups[r]] != 0;
    WriteRowLanes(p, r, t % kRowLanes, skip);
  }
}

}  // namespace

absl::Status LaunchWriteRows(const WriteRowsKernelParams& p, StreamHandle stream) {
  if (p.num_rows == 0) return absl::OkStatus();
  const int64_t wanted = (p.num_rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t blocks = wanted < (int64_t{1} << 20) ? wanted : (int64_t{1} << 20);
  return ToStatus(
      Launch(WriteRowsKernel, dim3(static_cast<unsigned>(blocks)), dim3(kRowThreads), 0, stream, p),
      "write-rows kernel launch");
}

}  // namespace smla::kernels::gpu
