#include "smla/client/testing/workload.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "smla/client/tensor.h"

namespace smla::client {
namespace {

std::vector<uint16_t> RandomBf16(int64_t n, float range, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-range, range);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return ToBf16(v);
}

// Visible entries of a row at position p on a layer (compressed entries or positions).
int64_t Visible(const v1::LayerInfo& l, int64_t p) {
  if (l.kind() == v1::LAYER_KIND_SWA_TOPK) return (p + 1) / l.compression_ratio();
  return p + 1;
}

}  // namespace

v1::StepRequest MakeStep(const v1::ModelInfo& model, int32_t layer,
                         const std::vector<SpanSpec>& spans, const StepOptions& options,
                         std::mt19937_64& rng) {
  const v1::LayerInfo& l = model.layers(layer);
  const int64_t w = model.qk_width();
  const int64_t h = model.heads_per_rank();
  v1::StepRequest req;
  req.set_model(model.profile());
  req.set_layer(layer);
  req.set_output_format(options.output_format);
  req.set_want_lse(options.want_lse);
  req.set_inverse_rope(options.inverse_rope);
  for (const SpanSpec& s : spans) {
    v1::Span* span = req.add_spans();
    span->set_sequence_id(s.sequence);
    span->set_first_position(s.first_position);
    span->set_num_rows(s.rows);
    if (s.drafts > 0) {
      for (int32_t t = 0; t < s.rows; ++t) {
        span->add_roles(t >= s.rows - s.drafts ? v1::ROW_ROLE_DRAFT : v1::ROW_ROLE_VERIFY);
      }
    }
    *span->mutable_kv_rows() =
        PackBf16(RandomBf16(s.rows * w, options.value_range, rng), {s.rows, w});
    *span->mutable_q() =
        PackBf16(RandomBf16(s.rows * h * w, options.value_range, rng), {s.rows, h, w});
    // Cannot fail: q was just built as bf16 [rows, h, w] and w is 512 or 576.
    if (options.mxfp8_q) static_cast<void>(EncodeSpanQuery(span));
    if (l.compression_ratio() > 0) {
      const int64_t r = l.compression_ratio();
      const int64_t n = (s.first_position + s.rows) / r - s.first_position / r;
      *span->mutable_compressed_rows() =
          PackBf16(RandomBf16(n * w, options.value_range, rng), {n, w});
    }
    if (l.topk() > 0) {
      const int64_t last = s.first_position + s.rows - 1;
      const int32_t k =
          static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(l.topk(), Visible(l, last))));
      std::vector<int32_t> ids(int64_t{s.rows} * k, -1);
      std::vector<int32_t> prev;
      for (int32_t t = 0; t < s.rows; ++t) {
        const int64_t visible = Visible(l, s.first_position + t);
        std::vector<int32_t> chosen;
        // Keep about three quarters of the previous row's choices, draw the rest afresh.
        for (int32_t e : prev) {
          if (e < visible && chosen.size() < static_cast<size_t>(k) && rng() % 4 != 0) {
            chosen.push_back(e);
          }
        }
        const int64_t want = std::min<int64_t>(k, visible);
        std::uniform_int_distribution<int64_t> pick(0, std::max<int64_t>(0, visible - 1));
        while (static_cast<int64_t>(chosen.size()) < want) {
          const int32_t e = static_cast<int32_t>(pick(rng));
          if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
        }
        std::shuffle(chosen.begin(), chosen.end(), rng);
        std::copy(chosen.begin(), chosen.end(), ids.begin() + int64_t{t} * k);
        prev = chosen;
      }
      *span->mutable_topk() = PackInt32(ids, {s.rows, k});
    }
  }
  return req;
}

std::vector<float> MakeRopeTable(int32_t positions) {
  std::vector<float> t(int64_t{positions} * 64);
  for (int32_t p = 0; p < positions; ++p) {
    for (int k = 0; k < 32; ++k) {
      const double theta = std::pow(10000.0, -k / 32.0);
      t[int64_t{p} * 64 + k] = static_cast<float>(std::cos(p * theta));
      t[int64_t{p} * 64 + 32 + k] = static_cast<float>(std::sin(p * theta));
    }
  }
  return t;
}

}  // namespace smla::client
