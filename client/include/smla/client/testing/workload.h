// Random but valid step requests for a served model: KV rows, compressed entries, queries and
// top-k choices (distinct visible entries, neighbouring rows overlapping as real indexers do).
// Part of smla::client_testing; used by the demo, smla-bench and the tests.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "smla/v1/info.pb.h"
#include "smla/v1/step.pb.h"

namespace smla::client {

struct SpanSpec {
  std::string sequence;
  int64_t first_position = 0;
  int32_t rows = 1;
  int32_t drafts = 0;  // the last `drafts` rows are speculative drafts
};

struct StepOptions {
  v1::OutputFormat output_format = v1::OUTPUT_FORMAT_BF16;
  bool want_lse = false;
  bool inverse_rope = false;
  float value_range = 1.0f;  // KV and q values uniform in [-range, range]
  bool mxfp8_q = false;      // queries travel as MXFP8 (EncodeSpanQuery) instead of bf16
};

v1::StepRequest MakeStep(const v1::ModelInfo& model, int32_t layer,
                         const std::vector<SpanSpec>& spans, const StepOptions& options,
                         std::mt19937_64& rng);

// A GPT-J style cos/sin table [positions, 64] (theta_k = 10000^(-k/32)).
std::vector<float> MakeRopeTable(int32_t positions);

}  // namespace smla::client
