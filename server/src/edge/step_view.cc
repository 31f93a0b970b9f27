#include "step_view.h"

namespace smla::server::edge {

void StepView::Clear() {
  std::vector<SpanView> keep = std::move(spans);
  keep.clear();
  *this = StepView();
  spans = std::move(keep);
}

RefView ViewOf(const v1::RegionRef& ref, bool set) {
  return {set, ref.region(), ref.offset(), ref.size()};
}

OutputsView OutputsOf(const v1::StepRequest& pb) {
  return {pb.want_lse(), ViewOf(pb.out_region(), pb.has_out_region()),
          ViewOf(pb.mx_scales_region(), pb.has_mx_scales_region()),
          ViewOf(pb.lse_region(), pb.has_lse_region())};
}

void ViewOf(const v1::StepRequest& pb, StepView* out) {
  out->Clear();
  out->request_id = pb.request_id();
  out->model = pb.model();
  out->layer = pb.layer();
  out->output_format = pb.output_format();
  out->inverse_rope = pb.inverse_rope();
  out->timeout_us = pb.timeout_us();
  out->spans.reserve(pb.spans_size());
  for (const v1::Span& s : pb.spans()) {
    SpanView& v = out->spans.emplace_back();
    v.sequence_id = s.sequence_id();
    v.first_position = s.first_position();
    v.num_rows = s.num_rows();
    v.roles.assign(s.roles().begin(), s.roles().end());
  }
  if (pb.has_packed()) {
    const v1::PackedInputs& p = pb.packed();
    out->packed = {true,
                   ViewOf(p.kv_rows(), p.has_kv_rows()),
                   ViewOf(p.q(), p.has_q()),
                   ViewOf(p.compressed_rows(), p.has_compressed_rows()),
                   ViewOf(p.topk(), p.has_topk()),
                   ViewOf(p.q_scales(), p.has_q_scales()),
                   p.topk_width()};
  }
  out->outputs = OutputsOf(pb);
}

}  // namespace smla::server::edge
