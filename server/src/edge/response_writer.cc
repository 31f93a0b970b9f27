#include "response_writer.h"

#include <string>
#include <vector>

#include "host_staging.h"
#include "smla/v1/tensor_bytes.h"

namespace smla::server::edge {
namespace {

void ReleaseStaging(void* keep) { delete static_cast<std::shared_ptr<StagingBuffer>*>(keep); }

}  // namespace

void SerializeStepResponse(v1::StepResponse* response, const StagedOutputs& staged,
                           grpc::ByteBuffer* bytes) {
  // Each staged output tensor, its field in the response, and how to take it out of the message.
  struct Field {
    int number;
    bool has;
    std::span<uint8_t> data;
    const v1::Tensor& (v1::StepResponse::*tensor)() const;
    void (v1::StepResponse::*clear)();
  };
  const Field fields[] = {
      {v1::StepResponse::kOutFieldNumber, response->has_out(), staged.out, &v1::StepResponse::out,
       &v1::StepResponse::clear_out},
      {v1::StepResponse::kMxScalesFieldNumber, response->has_mx_scales(), staged.mx_scales,
       &v1::StepResponse::mx_scales, &v1::StepResponse::clear_mx_scales},
      {v1::StepResponse::kLseFieldNumber, response->has_lse(), staged.lse, &v1::StepResponse::lse,
       &v1::StepResponse::clear_lse},
  };
  // Headers: each tensor's dtype and shape, then the tag and length of its bytes.
  std::vector<std::string> headers;
  std::vector<std::span<uint8_t>> data;
  for (const Field& f : fields) {
    if (!f.has || f.data.empty() || staged.buffer == nullptr) continue;
    const std::string tensor = (response->*f.tensor)().SerializeAsString();
    const std::string bytes_prefix =
        v1::LengthPrefix(v1::Tensor::kInlineDataFieldNumber, f.data.size());
    std::string h = v1::LengthPrefix(f.number, tensor.size() + bytes_prefix.size() + f.data.size());
    h += tensor;
    h += bytes_prefix;
    headers.push_back(std::move(h));
    data.push_back(f.data);
    (response->*f.clear)();
  }
  std::vector<grpc::Slice> slices;
  slices.reserve(1 + 2 * headers.size());
  slices.emplace_back(response->SerializeAsString());
  for (size_t i = 0; i < headers.size(); ++i) {
    slices.emplace_back(headers[i]);
    slices.emplace_back(data[i].data(), data[i].size(), &ReleaseStaging,
                        new std::shared_ptr<StagingBuffer>(staged.buffer));
  }
  grpc::ByteBuffer(slices.data(), slices.size()).Swap(bytes);
}

}  // namespace smla::server::edge
