#include "smla/client/tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "smla/base/status_macros.h"
#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/mxfp8_query.h"

namespace smla::client {
namespace {

template <typename T>
v1::Tensor Pack(v1::DType dtype, std::span<const T> values, std::initializer_list<int64_t> shape) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.set_inline_data(values.data(), values.size_bytes());
  return t;
}

template <typename T>
absl::StatusOr<std::vector<T>> Unpack(const v1::Tensor& t, v1::DType dtype) {
  if (t.dtype() != dtype) {
    return absl::InvalidArgumentError(absl::StrCat("tensor dtype ", v1::DType_Name(t.dtype()),
                                                   ", expected ", v1::DType_Name(dtype)));
  }
  int64_t n = 1;
  for (int64_t d : t.shape()) n *= d;
  if (static_cast<int64_t>(t.inline_data().size()) != n * static_cast<int64_t>(sizeof(T))) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor of ", n, " elements has ", t.inline_data().size(), " bytes"));
  }
  std::vector<T> v(n);
  if (n > 0) std::memcpy(v.data(), t.inline_data().data(), n * sizeof(T));
  return v;
}

}  // namespace

std::vector<uint16_t> ToBf16(std::span<const float> values) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = kernels::F32ToBf16Bits(values[i]);
  return out;
}

v1::Tensor PackBf16(std::span<const uint16_t> bits, std::initializer_list<int64_t> shape) {
  return Pack(v1::DTYPE_BF16, bits, shape);
}
v1::Tensor PackInt32(std::span<const int32_t> values, std::initializer_list<int64_t> shape) {
  return Pack(v1::DTYPE_INT32, values, shape);
}
v1::Tensor PackF32(std::span<const float> values, std::initializer_list<int64_t> shape) {
  return Pack(v1::DTYPE_F32, values, shape);
}

absl::StatusOr<std::vector<uint16_t>> UnpackBf16(const v1::Tensor& t) {
  return Unpack<uint16_t>(t, v1::DTYPE_BF16);
}
absl::StatusOr<std::vector<float>> UnpackF32(const v1::Tensor& t) {
  return Unpack<float>(t, v1::DTYPE_F32);
}
absl::StatusOr<std::vector<uint8_t>> UnpackBytes(const v1::Tensor& t, v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BF16: {
      SMLA_ASSIGN_OR_RETURN(auto v, Unpack<uint16_t>(t, dtype));
      std::vector<uint8_t> b(v.size() * 2);
      if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
      return b;
    }
    case v1::DTYPE_F32:
    case v1::DTYPE_INT32: {
      SMLA_ASSIGN_OR_RETURN(auto v, Unpack<uint32_t>(t, dtype));
      std::vector<uint8_t> b(v.size() * 4);
      if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
      return b;
    }
    default:
      return Unpack<uint8_t>(t, dtype);
  }
}

Mxfp8Query EncodeMxfp8Query(std::span<const uint16_t> bf16, int64_t rows, int64_t heads,
                            int64_t width) {
  const int64_t lanes = rows * heads * width;
  std::vector<uint8_t> codes(lanes), scales(lanes / kernels::kMxQueryGroup);
  kernels::EncodeMxfp8Query(bf16.data(), lanes, codes.data(), scales.data());
  Mxfp8Query q;
  q.codes = Pack(v1::DTYPE_E4M3, std::span<const uint8_t>(codes), {rows, heads, width});
  q.scales = Pack(v1::DTYPE_E8M0, std::span<const uint8_t>(scales),
                  {rows, heads, width / kernels::kMxQueryGroup});
  return q;
}

absl::Status EncodeSpanQuery(v1::Span* span) {
  const v1::Tensor& q = span->q();
  if (q.shape_size() != 3 || q.shape(2) % kernels::kMxQueryGroup != 0) {
    return absl::InvalidArgumentError("q: not [rows, heads, width] with width a multiple of 32");
  }
  SMLA_ASSIGN_OR_RETURN(auto bits, UnpackBf16(q));
  Mxfp8Query mx = EncodeMxfp8Query(bits, q.shape(0), q.shape(1), q.shape(2));
  *span->mutable_q() = std::move(mx.codes);
  *span->mutable_q_scales() = std::move(mx.scales);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint16_t>> SpanQueryBf16(const v1::Span& span) {
  if (span.q().dtype() != v1::DTYPE_E4M3) return UnpackBf16(span.q());
  SMLA_ASSIGN_OR_RETURN(auto codes, Unpack<uint8_t>(span.q(), v1::DTYPE_E4M3));
  SMLA_ASSIGN_OR_RETURN(auto scales, Unpack<uint8_t>(span.q_scales(), v1::DTYPE_E8M0));
  if (scales.size() * kernels::kMxQueryGroup != codes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_scales: ", scales.size(), " bytes for ", codes.size(), " e4m3 lanes"));
  }
  std::vector<uint16_t> out(codes.size());
  kernels::DecodeMxfp8Query(codes.data(), scales.data(), static_cast<int64_t>(codes.size()),
                            out.data());
  return out;
}

}  // namespace smla::client
