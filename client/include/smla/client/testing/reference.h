// The client's own account of a model's caches and what every step must return: it keeps
// the KV rows and compressed entries the client wrote, in its own CPU-backend pools (same
// format, its own slot layout), and computes each step's expected output with the operator.
// It shares no code with the server's KV store, paging or step builder.
//
// Part of smla::client_testing (it links the kernels). Not thread-safe; one Reference per
// model.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "smla/kernels/backend.h"
#include "smla/v1/info.pb.h"
#include "smla/v1/step.pb.h"

namespace smla::client {

struct Expected {
  int32_t rows = 0;
  int32_t heads = 0;
  v1::OutputFormat format = v1::OUTPUT_FORMAT_BF16;
  std::vector<uint8_t> out;        // bf16 [T, H, 512] or e4m3 [T, H*512]
  std::vector<uint8_t> mx_scales;  // [T, H*16] for MXFP8
  std::vector<float> lse;          // [T, H] when asked
};

struct Comparison {
  bool ok = true;
  double max_abs_error = 0;  // over every element, in dequantised values
  double max_rel_error = 0;  // max over (row, head) of max|out - ref| / max|ref|
  double max_lse_error = 0;
  std::string first_mismatch;  // empty when ok
};

class Reference {
 public:
  // `capacity_rows`: slots per layer pool (every write takes a fresh slot, rewrites included).
  static absl::StatusOr<std::unique_ptr<Reference>> Create(const v1::ModelInfo& model,
                                                           int64_t capacity_rows);

  void SetSinks(std::vector<float> sinks) { sinks_ = std::move(sinks); }  // [layers, H]
  void SetRopeTable(std::vector<float> cos_sin, int32_t positions);

  // Records the step's writes (the server acknowledged it) and returns what it must output.
  absl::StatusOr<Expected> Step(const v1::StepRequest& request);

  // Drops positions >= length of a sequence on every layer (Truncate).
  void Truncate(const std::string& sequence, int64_t length);

  // Compares a server response with the expectation: per (row, head) vector,
  // max|out - ref| <= tolerance * max|ref| (MXFP8 outputs dequantised, plus one e4m3 step),
  // LSE within tolerance * max(1, |ref|), -inf exactly. The default is docs/operator.md §7's bound:
  // the reference is the CPU backend, not an f64 result, and a GPU backend rounds P to bf16
  // against other running maxima, so two correct backends differ by up to about twice the
  // error of one (1.1e-2 seen on the H200).
  static Comparison Compare(const Expected& expected, const v1::StepResponse& response,
                            double tolerance = 2e-2);

 private:
  struct LayerPool {
    kernels::Buffer memory;
    int64_t next_slot = 0;
  };
  struct SequenceLayer {
    std::vector<int32_t> slot_of_position;
    std::vector<int32_t> slot_of_entry;  // compressed cache
  };

  Reference() = default;
  absl::StatusOr<LayerPool*> Pool(int32_t layer);
  absl::StatusOr<int32_t> WriteRow(int32_t layer, const uint8_t* bf16_row);

  v1::ModelInfo model_;
  kernels::KvFormat format_ = kernels::KvFormat::kBf16;
  kernels::Geometry geometry_ = kernels::Geometry::kRopeInside;
  int32_t qk_ = 512;
  int32_t page_rows_ = 64;
  int64_t pitch_ = 0;
  int64_t capacity_rows_ = 0;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<kernels::Stream> stream_;
  std::map<int32_t, LayerPool> pools_;
  std::map<std::pair<std::string, int32_t>, SequenceLayer> sequences_;
  std::vector<float> sinks_;
  std::vector<float> cos_sin_;
  int32_t rope_positions_ = 0;
};

}  // namespace smla::client
