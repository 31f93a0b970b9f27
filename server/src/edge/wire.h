// Wire <-> in-process conversion of steps: checks what only the wire can get wrong (enum
// values, dtype, shape against byte counts, region references), naming the field, and builds a
// StepRequest whose tensor views point into the protobuf message. Every other rule (span count,
// rows, positions, ids, roles per row, which tensors a layer or query format takes, capacity)
// is ValidateStep's (smla/server/step_validation.h), one owner and one wording each.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/arena.h"
#include "request_reader.h"
#include "smla/kernels/backend.h"
#include "smla/server/config.h"
#include "smla/server/model_profile.h"
#include "smla/server/step.h"
#include "smla/v1/step.pb.h"
#include "smla/v1/tensor.pb.h"
#include "step_view.h"

namespace smla::server::edge {

// What the edge knows of a served model to check tensor shapes.
struct WireModel {
  int32_t heads = 0;     // heads per rank
  int32_t qk_width = 0;  // 512 or 576
  // Per layer, r of its 1/r compressed cache (0 when none): how a packed request's compressed
  // entries split among its spans.
  std::vector<int32_t> compression_ratios = {};
};

// The WireModel of a served profile at `heads` heads per rank.
WireModel MakeWireModel(int32_t heads, const ModelProfile& profile);

class ShmMapping;

// Options that start an arena in `block`: a stream entry or ring slot keeps its first block
// inside itself, so reading a packed request, or an inline one of a few spans, allocates nothing.
inline google::protobuf::ArenaOptions FirstBlock(char* block, size_t size) {
  google::protobuf::ArenaOptions o;
  o.initial_block = block;
  o.initial_block_size = size;
  return o;
}

// Owned copies made while parsing (int32 data whose bytes are not 4-byte aligned), the region
// mappings the request's views point into, and what its response echoes; must live as long as
// the StepRequest.
struct ParseStorage {
  std::vector<std::unique_ptr<int32_t[]>> int32_copies;  // unaligned inline ids
  // The regions this request named, each looked up once (name, mapping); holding the mapping
  // keeps the request's views valid.
  std::vector<std::pair<std::string, std::shared_ptr<ShmMapping>>> looked_up;
  // Inline tensor bytes read past protobuf into staging (request_reader.h); a tensor listed here
  // is read from there instead of its inline_data.
  LandedTensors landed;
  // What the request asked for and where its outputs go, for its response: views into the
  // message, or into `output_names` for a request read without one (KeepOutputs).
  OutputsView outputs;
  std::string output_names[3];

  // Sets `outputs` to `o` with its region names copied into `output_names` (the bytes `o`
  // points into need not outlive the request).
  void KeepOutputs(const OutputsView& o);
  // Empties it for the next request (storage reused per ring slot).
  void Clear() {
    int32_copies.clear();
    looked_up.clear();
    landed = LandedTensors();
    outputs = OutputsView();
  }
};

class RegionRegistry;

// Lets tensors name (region, offset, size) of the tenant's registered regions (shm_region.h).
struct RegionContext {
  const RegionRegistry* registry = nullptr;
  std::string tenant;
};

// Fills `out` (all but tenant, deadline and cancel flag) from `pb`, and `storage->outputs`
// (views into `pb`). The step's extent is checked
// first (ValidateStepExtent under `limits`): tensors are sized from it. `model` may be null when
// the model is unknown: shapes are then checked only for internal consistency and the core
// answers NOT_FOUND. `pb` and `storage` must outlive `out`. Without `regions` (or with a null
// registry) a tensor naming a region is INVALID_ARGUMENT; with it, region references are
// resolved for the context's tenant and output regions become `out->destination`. A packed
// request (pb.packed set) is resolved with one lookup per region and its spans' views are
// slices of the packed ranges.
absl::Status ParseStepRequest(const v1::StepRequest& pb, const WireModel* model,
                              const Limits& limits, StepRequest* out, ParseStorage* storage,
                              const RegionContext* regions = nullptr);

// ParseStepRequest of a packed request read into a view (packed_step_decoder.h, or ViewOf a
// message): the same checks and errors, but for the spans' tensor fields, which a view does
// not hold (a message's caller checks them; the decoder declines them). The view's bytes need
// not outlive the call: `storage` keeps the output region names (KeepOutputs).
absl::Status ParseStepView(const StepView& view, const WireModel* model, const Limits& limits,
                           StepRequest* out, ParseStorage* storage, const RegionContext* regions);

// Copies a result into a response (tensors, timings); code and message stay OK. Tensors the
// request sent to its output regions (`request`: what it asked for, may be null) are answered
// with those regions. With `staged`, the outputs went to staging (response_writer.h): the
// tensors get their dtype and shape only, and the serializer adds the bytes.
void FillStepResponse(const StepResult& result, v1::StepResponse* pb,
                      const OutputsView* request = nullptr, bool staged = false);

// Checks a whole f32 tensor of the given shape (rank and every dimension; -1 = any) and
// returns its values, e.g. the rope table or sinks. `field` names it in errors.
absl::StatusOr<std::vector<float>> ParseF32Tensor(const v1::Tensor& t, const std::string& field,
                                                  const std::vector<int64_t>& shape);

}  // namespace smla::server::edge
