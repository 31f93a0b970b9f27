#include "request_reader.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "host_staging.h"
#include "smla/base/align.h"
#include "smla/v1/tensor_bytes.h"

namespace smla::server::edge {
namespace {

constexpr uint64_t kAlign = 64;

// The order tensors land in: all spans' queries, then their query scales, KV rows, compressed
// rows and chosen entries, each kind in span order, then anything else in wire order. The
// executor copies each kind into one device buffer in span order, so a kind that lies
// contiguous here (sizes are multiples of 64 bytes at every served shape) goes to the device in
// one copy instead of one per span.
std::vector<const v1::TensorBytesReader::Bytes*> LandingOrder(
    const v1::StepRequest& request, const std::vector<v1::TensorBytesReader::Bytes>& tensors) {
  absl::flat_hash_map<const v1::Tensor*, std::pair<int, int>> rank;
  for (int i = 0; i < request.spans_size(); ++i) {
    const v1::Span& s = request.spans(i);
    const v1::Tensor* kinds[] = {&s.q(), &s.q_scales(), &s.kv_rows(), &s.compressed_rows(),
                                 &s.topk()};
    for (int k = 0; k < 5; ++k) rank[kinds[k]] = {k, i};
  }
  std::vector<const v1::TensorBytesReader::Bytes*> order;
  order.reserve(tensors.size());
  for (const auto& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [&](const auto* a, const auto* b) {
    auto ra = rank.find(a->tensor), rb = rank.find(b->tensor);
    const std::pair<int, int> last{5, 0};
    return (ra == rank.end() ? last : ra->second) < (rb == rank.end() ? last : rb->second);
  });
  return order;
}

}  // namespace

size_t LandedTensors::total_bytes() const { return buffer ? buffer->size() : 0; }

absl::Status ReadStepRequest(const grpc::ByteBuffer& buffer, StagingPool& pool,
                             v1::ParallelCopier* copier, const std::string& tenant,
                             v1::StepRequest* request, LandedTensors* landed, uint64_t walk_from) {
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
  for (const auto& t : reader.tensors()) total += AlignUp(t.size, kAlign);
  if (total > 0) {
    auto staging = pool.Lease(total, tenant);
    if (!staging.ok()) return staging.status();
    landed->buffer = *std::move(staging);
  }
  uint8_t* dst = total > 0 ? landed->buffer->data() : nullptr;
  std::vector<v1::CopyPiece> pieces;
  for (const auto* t : LandingOrder(*request, reader.tensors())) {
    if (t->size > 0) reader.AppendPieces(*t, dst, &pieces);
    landed->bytes[t->tensor] = {dst, t->size};
    if (t->size > 0) dst += AlignUp(t->size, kAlign);
  }
  v1::CopyPieces(pieces, copier);
  return absl::OkStatus();
}

}  // namespace smla::server::edge
