// Row writers (operator.md section 3, "Writing rows"): one thread quantises one bf16 row into
// the pool with the same EncodeRow the CPU backend uses, so both write identical bytes.
#include <cstdint>

#include "gpu/kernel_params.h"
#include "smla/kernels/codec/row_codec.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kWriteThreads = 128;

__global__ void __launch_bounds__(kWriteThreads)
    WriteRowsKernel(const __grid_constant__ WriteRowsKernelParams p) {
  const int64_t i = int64_t{blockIdx.x} * kWriteThreads + threadIdx.x;
  if (i >= p.num_rows) return;
  const auto f = static_cast<KvFormat>(p.format);
  const auto g = static_cast<Geometry>(p.geometry);
  const int64_t slot = p.slots[i];
  uint8_t* data = p.base + SlotDataOffset(f, g, slot, p.rows_per_page, p.pitch);
  uint8_t* rec = f == KvFormat::kFp8Dsv4
                     ? p.base + SlotScaleOffset(slot, p.rows_per_page, p.pitch)
                     : nullptr;
  EncodeRow(f, g, p.rows + i * QkWidth(g), data, rec, p.scale);
}

}  // namespace

absl::Status LaunchWriteRows(const WriteRowsKernelParams& p, StreamHandle stream) {
  if (p.num_rows == 0) return absl::OkStatus();
  const int64_t blocks = (p.num_rows + kWriteThreads - 1) / kWriteThreads;
  WriteRowsKernel<<<static_cast<unsigned>(blocks), kWriteThreads, 0, stream>>>(p);
  return ToStatus(GetLastError(), "write-rows kernel launch");
}

}  // namespace smla::kernels::gpu
