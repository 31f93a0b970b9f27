// CUDA builds only (cuda.cmake): the bulk tensor copy engine is sm_90's.
#include "gpu/query_tensor_map.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>

namespace smla::kernels::gpu {
namespace {

static_assert(sizeof(QueryTensorMap) == sizeof(CUtensorMap) &&
                  alignof(QueryTensorMap) == alignof(CUtensorMap),
              "QueryTensorMap stands for CUtensorMap");

// The driver's encoder, looked up once through the runtime (no link to libcuda); null where the
// driver lacks it.
PFN_cuTensorMapEncodeTiled_v12000 Encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace

bool EncodeQueryTensorMap(const void* q, int64_t vectors, int width, QueryTensorMap* map) {
  const auto encode = Encoder();
  if (encode == nullptr || q == nullptr || reinterpret_cast<uintptr_t>(q) % 16 != 0 ||
      vectors <= 0 || vectors > std::numeric_limits<int32_t>::max() || width % 64 != 0) {
    return false;
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(width), static_cast<cuuint64_t>(vectors)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(width) * 2};  // bytes, past dim 0
  const cuuint32_t box[2] = {kQueryBoxValues, kQueryBoxVectors};
  const cuuint32_t steps[2] = {1, 1};
  // Vectors past the last read as zeros (OOB_FILL_NONE): a unit at the end of the batch.
  return encode(reinterpret_cast<CUtensorMap*>(map), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                const_cast<void*>(q), dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace smla::kernels::gpu
