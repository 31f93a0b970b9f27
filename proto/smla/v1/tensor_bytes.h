// Reading and writing protobuf messages whose tensors carry large inline bytes, without
// protobuf's copies. A reader parses everything but each Tensor's `inline_data` with protobuf
// and leaves those bytes in gRPC's buffer until the caller places them where they belong
// (staging the device copies from, an output buffer the caller owns). The wire stays plain
// protobuf: the result is what ParseFromString would give (repeated messages appended,
// singular ones merged, the last oneof member and the last occurrence of a field winning).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"
#include "smla/v1/parallel_copy.h"
#include "smla/v1/tensor.pb.h"

namespace smla::v1 {

// Below this many bytes a message is parsed by protobuf as a whole: its tensors are small, and
// the per-field walk costs more than the copies it saves (docs/results/bench-h200.md).
inline constexpr uint64_t kWalkFromBytes = uint64_t{256} << 10;

class TensorBytesReader {
 public:
  // A tensor's inline bytes: `size` bytes at `offset` of the message.
  struct Bytes {
    const Tensor* tensor;
    uint64_t offset;
    uint64_t size;
  };

  TensorBytesReader();
  ~TensorBytesReader();

  // Parses `buffer` into `msg` (empty) but for the inline bytes of the tensors in it (fields of
  // type Tensor, directly or inside a Span). INVALID_ARGUMENT naming the type and byte offset
  // when the message is malformed.
  absl::Status Parse(const grpc::ByteBuffer& buffer, google::protobuf::Message* msg);

  // The tensors with inline bytes, one entry each (its last occurrence), in wire order.
  const std::vector<Bytes>& tensors() const { return tensors_; }
  // Copies an entry's bytes to `dst`; entries are cheapest to copy in order.
  void CopyTo(const Bytes& bytes, uint8_t* dst);
  // Where an entry's bytes lie in the buffer: the pieces that copy them to `dst`, appended in
  // order (for a ParallelCopier). They point into the buffer, which must outlive them.
  void AppendPieces(const Bytes& bytes, uint8_t* dst, std::vector<CopyPiece>* pieces);

 private:
  class Cursor;
  std::unique_ptr<Cursor> in_;
  std::vector<Bytes> tensors_;
};

// Protobuf's base-128 varint, appended to `out`, and its length.
void AppendVarint(uint64_t v, std::string* out);
size_t VarintSize(uint64_t v);

// The bytes that start a field of length-delimited type (tag and length) before `size` bytes.
std::string LengthPrefix(int field, uint64_t size);

}  // namespace smla::v1
