// Builds one Attend call's inputs on a backend (pools written through WriteRows, CSR segments
// with sentinels and duplicates, q, sink, RoPE table), runs it with poisoned outputs, and
// checks results against the f64 oracle with the tolerances of docs/operator.md section 7.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "oracle.h"
#include "smla/kernels/backend.h"

namespace smla::testing {

using kernels::Backend;
using kernels::Geometry;
using kernels::KvFormat;
using kernels::OutputFormat;
using kernels::QType;

struct SegmentSpec {
  KvFormat format = KvFormat::kBf16;
  int32_t rows_per_page = 16;
  int64_t num_pages = 64;
  float scale = 1.0f;              // fp8_per_tensor cache scale
  bool raw_ds_mla_scales = false;  // write fp8_ds_mla rows by hand with amax/448 scales
  std::vector<int32_t> lengths;    // [T] entries per row (sentinels included)
  int32_t leading_sentinels = 0;   // the first n entries of every row are sentinels
  bool every_other_sentinel = false;
  bool duplicates = false;  // about a fifth of the entries repeat an earlier one
};

struct CaseSpec {
  Geometry geometry = Geometry::kRopeInside;
  int32_t num_rows = 1;
  int32_t num_heads = 16;
  QType q_type = QType::kBf16;
  float q_scale = 1.0f;
  float softmax_scale = 0.0625f;
  double value_scale = 1.0;  // magnitude of KV values
  double q_value_scale = 1.0;
  SegmentSpec main;
  bool has_extra = false;
  SegmentSpec extra;
  bool sink = false;
  uint64_t seed = 1;
};

struct RunOptions {
  OutputFormat format = OutputFormat::kBf16;
  bool positions = false;
  bool lse = true;
  int32_t force_splits = 0;
  int32_t force_head_block = 0;
};

struct RunResult {
  std::vector<uint16_t> bf16;      // [T, H, 512]
  std::vector<uint8_t> mx_data;    // [T, H*512]
  std::vector<uint8_t> mx_scales;  // [T, H*16]
  std::vector<float> lse;          // [T, H] (poison when not requested)
};

class AttendCase {
 public:
  // Allocates and fills everything on `backend`; check ok() before use.
  AttendCase(Backend& backend, const CaseSpec& spec);

  const absl::Status& status() const { return status_; }
  const CaseSpec& spec() const { return spec_; }

  // Runs Attend with every output poisoned (0xFF bytes) first.
  absl::StatusOr<RunResult> Run(const RunOptions& options);
  // The call's parameters, with outputs pointing at this case's output buffers.
  kernels::AttendParams Params(const RunOptions& options);

  oracle::Input OracleInput() const;
  const std::vector<int32_t>& positions() const { return positions_; }
  const float* CosSinRow(int32_t t) const { return &cos_sin_host_[positions_[t] * 64]; }

 private:
  absl::Status Build();
  absl::Status BuildSegment(const SegmentSpec& s, int index);

  Backend& backend_;
  CaseSpec spec_;
  absl::Status status_;
  std::unique_ptr<kernels::Stream> stream_;
  uint64_t rng_state_;

  struct Pool {
    kernels::Buffer buffer;
    kernels::CacheView view;
    std::vector<uint8_t> host;  // a copy of the bytes after writing
    std::vector<int32_t> indptr;
    std::vector<int32_t> indices;
  };
  Pool pools_[2];
  kernels::Buffer q_;
  std::vector<double> q_values_;  // [T, H, W] with q_scale applied
  std::vector<float> sink_;
  kernels::Buffer cos_sin_;
  std::vector<float> cos_sin_host_;
  std::vector<int32_t> positions_;
  kernels::Buffer out_bf16_, out_mx_data_, out_mx_scales_, out_lse_;
};

// Per (row, head) comparison of bf16 output against the oracle (section 7): returns the
// largest max|out-ref|/max|ref| over non-empty vectors, and adds gtest failures for vectors
// past `tolerance`, empty rows that are not exactly +0, and LSE mismatches.
double CheckBf16AgainstOracle(const CaseSpec& spec, const RunResult& r, const oracle::Output& ref,
                              double tolerance, bool check_lse, const AttendCase* rope_case);

// The MXFP8 procedure of section 7: `plain` ran with bf16 output and no positions, `mx` with
// MXFP8 output and positions (nullptr = none).
void CheckMxfp8(const CaseSpec& spec, const RunResult& plain, const RunResult& mx,
                const AttendCase* rope_case);

}  // namespace smla::testing
