// Building and reading wire tensors (raw little-endian row-major bytes, see tensor.proto).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
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

}  // namespace smla::client
