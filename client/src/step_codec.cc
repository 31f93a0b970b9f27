#include "step_codec.h"

#include <string>
#include <utility>
#include <vector>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "smla/v1/tensor_bytes.h"

namespace smla::client {
namespace {

// Collects a serialized message as runs of its own bytes (tags, lengths, small fields) and runs
// that alias the message's large strings.
class AliasingOutput final : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  explicit AliasingOutput(std::shared_ptr<const void> keep) : keep_(std::move(keep)) {}

  bool Next(void** data, int* size) override {
    const size_t at = owned_.size();
    owned_.resize(at + kBlock);
    *data = owned_.data() + at;
    *size = static_cast<int>(kBlock);
    Extend(Run{at, kBlock, nullptr});
    return true;
  }
  void BackUp(int count) override {
    owned_.resize(owned_.size() - static_cast<size_t>(count));
    runs_.back().size -= static_cast<size_t>(count);
    bytes_ -= count;
  }
  int64_t ByteCount() const override { return bytes_; }
  bool AllowsAliasing() const override { return true; }
  bool WriteAliasedRaw(const void* data, int size) override {
    runs_.push_back(Run{0, static_cast<size_t>(size), static_cast<const char*>(data)});
    bytes_ += size;
    return true;
  }

  grpc::ByteBuffer Finish() {
    std::vector<grpc::Slice> slices;
    slices.reserve(runs_.size());
    for (const Run& r : runs_) {
      if (r.size == 0) continue;
      if (r.alias == nullptr) {
        slices.emplace_back(owned_.data() + r.offset, r.size);  // copies: a few bytes
        continue;
      }
      // The slice holds a reference to the message until gRPC has sent it.
      auto* hold = new std::shared_ptr<const void>(keep_);
      slices.emplace_back(
          const_cast<char*>(r.alias), r.size,
          [](void* p) { delete static_cast<std::shared_ptr<const void>*>(p); }, hold);
    }
    if (slices.empty()) slices.emplace_back("", 0);  // an empty message is still a message
    return grpc::ByteBuffer(slices.data(), slices.size());
  }

 private:
  static constexpr size_t kBlock = 4096;
  struct Run {
    size_t offset;  // owned runs: where in owned_
    size_t size;
    const char* alias;  // aliased runs: the message's bytes
  };
  // A new owned block continues the previous owned run when nothing came between them.
  void Extend(Run run) {
    bytes_ += static_cast<int64_t>(run.size);
    if (!runs_.empty() && runs_.back().alias == nullptr &&
        runs_.back().offset + runs_.back().size == run.offset) {
      runs_.back().size += run.size;
      return;
    }
    runs_.push_back(run);
  }

  std::shared_ptr<const void> keep_;
  std::string owned_;
  std::vector<Run> runs_;
  int64_t bytes_ = 0;
};

}  // namespace

grpc::ByteBuffer EncodeStepRequest(std::shared_ptr<const v1::StepRequest> request) {
  const v1::StepRequest& msg = *request;
  static_cast<void>(msg.ByteSizeLong());  // caches the sizes SerializeWithCachedSizes writes
  AliasingOutput out(std::move(request));
  {
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.EnableAliasing(true);
    msg.SerializeWithCachedSizes(&coded);
  }  // the coded stream hands back what it did not use
  return out.Finish();
}

absl::Status DecodeStepResponse(const grpc::ByteBuffer& buffer, v1::ParallelCopier* copier,
                                v1::StepResponse* response) {
  // The bytes of the tensors `response` held are kept across its Clear and take the new ones:
  // a string already as long as the new tensor is overwritten as it is, where resize would
  // first write that many zeros (megabytes a call, on the caller's thread).
  std::string kept_out, kept_scales, kept_lse;
  if (response->has_out()) kept_out.swap(*response->mutable_out()->mutable_inline_data());
  if (response->has_mx_scales()) {
    kept_scales.swap(*response->mutable_mx_scales()->mutable_inline_data());
  }
  if (response->has_lse()) kept_lse.swap(*response->mutable_lse()->mutable_inline_data());
  response->Clear();
  if (buffer.Length() < v1::kWalkFromBytes) {
    grpc::ByteBuffer view(buffer);  // shares the slices
    grpc::ProtoBufferReader in(&view);
    if (!response->ParseFromZeroCopyStream(&in)) {
      return absl::InvalidArgumentError("response: not a valid smla.v1.StepResponse");
    }
    return absl::OkStatus();
  }
  v1::TensorBytesReader reader;
  absl::Status st = reader.Parse(buffer, response);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("response: ", st.message()));
  std::vector<v1::CopyPiece> pieces;
  for (const auto& t : reader.tensors()) {
    // The reader's tensors are fields of `response`, which this call owns.
    std::string* data = const_cast<v1::Tensor*>(t.tensor)->mutable_inline_data();
    std::string* kept = t.tensor == &response->out()         ? &kept_out
                        : t.tensor == &response->mx_scales() ? &kept_scales
                        : t.tensor == &response->lse()       ? &kept_lse
                                                             : nullptr;
    if (kept != nullptr) data->swap(*kept);
    data->resize(t.size);
    reader.AppendPieces(t, reinterpret_cast<uint8_t*>(data->data()), &pieces);
  }
  v1::CopyPieces(pieces, copier);
  return absl::OkStatus();
}

}  // namespace smla::client
