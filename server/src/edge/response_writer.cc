#include "response_writer.h"

#include <string>
#include <vector>

#include "host_staging.h"
#include "smla/v1/tensor_bytes.h"

namespace smla::server::edge {
namespace {

constexpr uint32_t kLen = 2;
constexpr uint32_t kInlineDataTag = (3 << 3) | kLen;  // Tensor.inline_data

void ReleaseStaging(void* keep) { delete static_cast<std::shared_ptr<StagingBuffer>*>(keep); }

}  // namespace

void SerializeStepResponse(v1::StepResponse* response, const StagedOutputs& staged,
                           grpc::ByteBuffer* bytes) {
  struct Field {
    int number;
    bool has;
    std::span<uint8_t> data;
  };
  const Field fields[] = {
      {2, response->has_out(), staged.out},
      {3, response->has_mx_scales(), staged.mx_scales},
      {4, response->has_lse(), staged.lse},
  };
  // Headers: each tensor's dtype and shape, then the tag and length of its bytes.
  std::vector<std::string> headers;
  std::vector<std::span<uint8_t>> data;
  for (const Field& f : fields) {
    if (!f.has || f.data.empty() || staged.buffer == nullptr) continue;
    const v1::Tensor& t = f.number == 2   ? response->out()
                          : f.number == 3 ? response->mx_scales()
                                          : response->lse();
    const std::string tensor = t.SerializeAsString();
    const uint64_t body = tensor.size() + v1::VarintSize(kInlineDataTag) +
                          v1::VarintSize(f.data.size()) + f.data.size();
    std::string h = v1::LengthPrefix(f.number, body);
    h += tensor;
    v1::AppendVarint(kInlineDataTag, &h);
    v1::AppendVarint(f.data.size(), &h);
    headers.push_back(std::move(h));
    data.push_back(f.data);
    switch (f.number) {
      case 2:
        response->clear_out();
        break;
      case 3:
        response->clear_mx_scales();
        break;
      default:
        response->clear_lse();
        break;
    }
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
