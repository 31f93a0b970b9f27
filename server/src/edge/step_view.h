// A step request's fields but its spans' tensors, as views (docs/architecture.md, "Reading a
// packed request"). The edge reads a request through this view whether protobuf parsed it
// (ViewOf) or the packed-step decoder read it straight from the wire (packed_step_decoder.h),
// so that one set of checks serves both. The views point into the message or the wire bytes,
// which must outlive the view.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "smla/v1/step.pb.h"

namespace smla::server::edge {

struct RefView {
  bool set = false;
  std::string_view region;
  uint64_t offset = 0;
  uint64_t size = 0;
  bool operator==(const RefView&) const = default;
};

struct SpanView {
  std::string_view sequence_id;
  int64_t first_position = 0;
  int32_t num_rows = 0;
  absl::InlinedVector<int32_t, 8> roles;  // the wire's enum values, unchecked
  bool operator==(const SpanView&) const = default;
};

struct PackedView {
  bool set = false;
  RefView kv_rows, q, compressed_rows, topk, q_scales;
  int32_t topk_width = 0;
  bool operator==(const PackedView&) const = default;
};

// The outputs a request asks for besides `out`, and the regions it sends them to
// (StepRequest.out_region, mx_scales_region, lse_region); a response echoes the regions.
struct OutputsView {
  bool want_lse = false;
  RefView out, mx_scales, lse;
  bool operator==(const OutputsView&) const = default;
};

struct StepView {
  std::string_view request_id;
  std::string_view model;
  int32_t layer = 0;
  int32_t output_format = 0;  // the wire's enum value, unchecked
  bool inverse_rope = false;
  int64_t timeout_us = 0;
  std::vector<SpanView> spans;
  PackedView packed;
  OutputsView outputs;

  // Empties it for the next request, keeping the spans' capacity.
  void Clear();
  bool operator==(const StepView&) const = default;
};

RefView ViewOf(const v1::RegionRef& ref, bool set);

OutputsView OutputsOf(const v1::StepRequest& pb);

// The view of `pb`, into `out` (cleared first).
void ViewOf(const v1::StepRequest& pb, StepView* out);

}  // namespace smla::server::edge
