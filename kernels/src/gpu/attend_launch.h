// Plan, then run, for one Attend call on the GPU: the host decides the launch (plan.h, fitted to
// the compiled variants and the shared memory), lays out the call's small host arrays for one
// upload into a device workspace, binds the kernel parameters to that workspace and launches.
// The backend runs these steps per call; the kernel benchmark runs the last one repeatedly.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/kernel_params.h"
#include "smla/kernels/backend.h"
#include "smla/kernels/device_info.h"
#include "smla/kernels/params.h"
#include "smla/kernels/plan.h"

namespace smla::kernels::gpu {

struct AttendLaunch {
  LaunchPlan plan;
  int qk_width = 512;
  int64_t shared_bytes = 0;
  bool direct = false;  // the direct kernel (attend_direct_kernel.cuh) instead of the tile one
  bool wgmma = false;   // the 64-head warpgroup program (attend_wgmma_kernel.cuh) instead
  // Paired rows (AttendKernelParams::paired): a unit of rows runs together after the row-union
  // kernel: in the direct kernel rows 2i and 2i+1 as the 32-head variant's two 16-head groups
  // (plan.head_block is then 16 and program_head_block 32) or as the two 8-head halves of a
  // 16-head program; in the warpgroup program the kernel's union_rows rows of H heads each in
  // its 64 product rows (wgmma; plan.head_block H).
  PairMode paired = PairMode::kNone;
  int program_head_block = 16;
  AttendKernelParams kernel;  // device pointers into the workspace set by BindAttend
  CombineKernelParams combine;
  // Workspace layout: [staged host arrays | split-K partials].
  int64_t staged_bytes = 0;
  int64_t workspace_bytes = 0;
  // Where the kernel reads one of the call's arrays: staged at `off` in the workspace, or, when
  // off is -1, at `device` (the caller's HostMirror, or indices already in backend memory).
  struct ArrayPlace {
    int64_t off = -1;
    const void* device = nullptr;
  };
  ArrayPlace indptr[2];
  ArrayPlace indices[2];
  ArrayPlace positions;
  ArrayPlace sink;
  int64_t off_union_indices[2] = {0, 0};  // paired: device-written unions (not staged)
  int64_t off_union_mask[2] = {0, 0};
  int64_t off_union_count[2] = {0, 0};
  int64_t off_part_acc = 0;
  int64_t off_part_ml = 0;
  // The combine covers rows from here on (the warpgroup program's whole units come first and
  // write their outputs themselves: AttendKernelParams::whole_units).
  int32_t combine_first_row = 0;
};

// Plans a validated call. Unimplemented when a forced head block has no compiled program that
// fits the device's shared memory (naming geometry, head block and formats).
absl::StatusOr<AttendLaunch> PlanAttend(const AttendParams& params, const DeviceInfo& device);
// Writes the call's staged host arrays (CSR, positions, sink; those not read from the caller's
// mirror) at their offsets in `host` (staged_bytes).
void StageAttend(const AttendParams& params, const AttendLaunch& launch, uint8_t* host);
// Points the kernel parameters at a device workspace of at least workspace_bytes.
void BindAttend(AttendLaunch& launch, uint8_t* workspace);
// Enqueues the attention kernel and, with split-K, the combine.
absl::Status RunAttend(const AttendLaunch& launch, StreamHandle stream);

}  // namespace smla::kernels::gpu
