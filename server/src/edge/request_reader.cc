#include "request_reader.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "host_staging.h"
#include "smla/v1/tensor_bytes.h"

namespace smla::server::edge {
namespace {

constexpr uint64_t kAlign = 64;

uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

size_t LandedTensors::total_bytes() const { return buffer ? buffer->size() : 0; }

absl::Status ReadStepRequest(const grpc::ByteBuffer& buffer, StagingPool& pool,
                             v1::ParallelCopier* copier, const std::string& tenant,
                             v1::StepRequest* request, LandedTensors* landed,
                             uint64_t walk_from) {
  if (buffer.Length() < walk_from) {
    grpc::ByteBuffer view(buffer);  // shares the slices
    grpc::ProtoBufferReader in(&view);
    if (!request->ParseFromZeroCopyStream(&in)) {
      return absl::InvalidArgumentError(
          "request: not a valid smla.v1.StepRequest (protobuf cannot parse it)");
    }
    return absl::OkStatus();
  }
  v1::TensorBytesReader reader;
  absl::Status st = reader.Parse(buffer, request);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("request: ", st.message()));
  uint64_t total = 0;
  for (const auto& t : reader.tensors()) total += AlignUp(t.size);
  if (total > 0) {
    auto staging = pool.Lease(total, tenant);
    if (!staging.ok()) return staging.status();
    landed->buffer = *std::move(staging);
  }
  uint8_t* dst = total > 0 ? landed->buffer->data() : nullptr;
  std::vector<v1::CopyPiece> pieces;
  for (const auto& t : reader.tensors()) {
    if (t.size > 0) reader.AppendPieces(t, dst, &pieces);
    landed->bytes[t.tensor] = {dst, t.size};
    if (t.size > 0) dst += AlignUp(t.size);
  }
  if (copier != nullptr) {
    copier->Copy(pieces);
  } else {
    for (const v1::CopyPiece& p : pieces) std::memcpy(p.dst, p.src, p.bytes);
  }
  return absl::OkStatus();
}

}  // namespace smla::server::edge
