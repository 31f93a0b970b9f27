// MXFP8 queries into the bf16 Q that attention reads (Backend::ExpandMxfp8Query): one thread
// per pair of lanes, each lane through the same Mxfp8ToBf16Bits as the CPU backend, so both
// write identical bits. A pair of lanes never straddles a 32-lane scale group.
#include <cstdint>

#include "gpu/grid_order.h"
#include "gpu/kernel_params.h"
#include "smla/kernels/codec/mxfp8_query.h"

namespace smla::kernels::gpu {
namespace {

constexpr int kExpandThreads = 256;

__global__ void __launch_bounds__(kExpandThreads)
    ExpandQueryKernel(const __grid_constant__ ExpandQueryKernelParams p) {
  EnterGrid();  // grid_order.h: before any access to memory
  const int64_t pairs = p.lanes / 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kExpandThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kExpandThreads + threadIdx.x; i < pairs;
       i += stride) {
    const int64_t lane = 2 * i;
    const uint16_t codes = reinterpret_cast<const uint16_t*>(p.codes)[i];
    const uint8_t scale = p.scales[lane / kMxQueryGroup];
    const uint32_t lo = Mxfp8ToBf16Bits(static_cast<uint8_t>(codes & 0xffu), scale);
    const uint32_t hi = Mxfp8ToBf16Bits(static_cast<uint8_t>(codes >> 8), scale);
    reinterpret_cast<uint32_t*>(p.out)[i] = lo | (hi << 16);
  }
}

}  // namespace

absl::Status LaunchExpandQuery(const ExpandQueryKernelParams& p, StreamHandle stream) {
  if (p.lanes == 0) return absl::OkStatus();
  const int64_t want = (p.lanes / 2 + kExpandThreads - 1) / kExpandThreads;
  const int64_t blocks = want < (int64_t{1} << 16) ? want : (int64_t{1} << 16);
  return ToStatus(Launch(ExpandQueryKernel, dim3(static_cast<unsigned>(blocks)),
                         dim3(kExpandThreads), 0, stream, p),
                  "expand-query kernel launch");
}

}  // namespace smla::kernels::gpu
