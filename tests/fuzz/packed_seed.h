// A fuzz seed in the packed shared-memory form (StepRequest.packed), for the seed generator
// and the replay test.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fuzz_world.h"
#include "smla/client/shm.h"
#include "smla/client/tensor.h"

namespace smla::fuzz {

// `r` (inline) with its inputs packed in the world's region (StepRequest.packed): top-k ids
// padded to one width and pointed at the region's ids area (all -1 before every input), the
// outputs at its output area; the region's zeros stand for the KV rows and queries.
inline v1::StepRequest PackedSeed(const FuzzWorld& world, v1::StepRequest r) {
  int64_t width = 0;
  for (const v1::Span& s : r.spans()) {
    if (s.has_topk()) width = std::max<int64_t>(width, s.topk().shape(1));
  }
  for (v1::Span& s : *r.mutable_spans()) {
    if (!s.has_topk()) continue;
    const int64_t rows = s.topk().shape(0);
    *s.mutable_topk() = client::PackInt32(std::vector<int32_t>(rows * width, -1), {rows, width});
  }
  std::vector<uint8_t> scratch(FuzzWorld::kRegionBytes);
  auto end = client::ShmRegion::PlaceInto(scratch.data(), scratch.size(), world.region_name(), &r,
                                          0, client::ShmRegion::Layout::kPacked);
  if (!end.ok() || *end > FuzzWorld::kIdsAt) {
    std::fprintf(stderr, "make_seeds: cannot pack: %s\n", end.status().ToString().c_str());
    std::exit(1);
  }
  if (r.packed().has_topk()) r.mutable_packed()->mutable_topk()->set_offset(FuzzWorld::kIdsAt);
  uint64_t at = FuzzWorld::kOutputsAt;
  for (v1::RegionRef* ref :
       {r.mutable_out_region(), r.mutable_mx_scales_region(), r.mutable_lse_region()}) {
    if (ref->size() == 0) continue;
    ref->set_offset(at);
    at += (ref->size() + 63) / 64 * 64;
  }
  if (r.mx_scales_region().region().empty()) r.clear_mx_scales_region();
  if (r.lse_region().region().empty()) r.clear_lse_region();
  return r;
}

}  // namespace smla::fuzz
