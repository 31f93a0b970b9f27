// Building and reading wire tensors (raw little-endian row-major bytes, see tensor.proto).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "smla/v1/step.pb.h"
#include "smla/v1/tensor.pb.h"

namespace smla::client {

// bf16 bit patterns (upper halves of f32, round to nearest even).
std::vector<uint16_t> ToBf16(std::span<const float> values);

v1::Tensor PackBf16(std::span<const uint16_t> bits, std::initializer_list<int64_t> shape);
v1::Tensor PackInt32(std::span<const int32_t> values, std::initializer_list<int64_t> shape);
v1::Tensor PackF32(std::span<const float> values, std::initializer_list<int64_t> shape);

// The tensor's elements, after checking dtype and that the byte count matches the shape.
absl::StatusOr<std::vector<uint16_t>> UnpackBf16(const v1::Tensor& t);
absl::StatusOr<std::vector<float>> UnpackF32(const v1::Tensor& t);
// The raw bytes of a tensor of any dtype.
absl::StatusOr<std::vector<uint8_t>> UnpackBytes(const v1::Tensor& t, v1::DType dtype);

// MXFP8 queries (step.proto "Query formats"): bf16 query values [rows, heads, width] (width a
// multiple of 32) as e4m3 codes [rows, heads, width] and UE8M0 scale bytes [rows, heads,
// width / 32], by the MXFP8 output's exponent rule (smla/kernels/codec/mxfp8_query.h).
struct Mxfp8Query {
  v1::Tensor codes;   // Span.q
  v1::Tensor scales;  // Span.q_scales
};
Mxfp8Query EncodeMxfp8Query(std::span<const uint16_t> bf16, int64_t rows, int64_t heads,
                            int64_t width);
// Replaces a span's inline bf16 q by its MXFP8 encoding (q and q_scales).
absl::Status EncodeSpanQuery(v1::Span* span);
// The bf16 bits of a span's inline query: as sent, or decoded from MXFP8 exactly as the server
// expands it.
absl::StatusOr<std::vector<uint16_t>> SpanQueryBf16(const v1::Span& span);

}  // namespace smla::client
