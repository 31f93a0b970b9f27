#include "smla_service.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/stubs/common.h"
#include "grpcpp/grpcpp.h"
#include "id_limits.h"
#include "packed_step_decoder.h"
#include "smla/base/align.h"
#include "smla/server/log_field.h"
#include "smla/server/model_profile.h"
#include "spdlog/spdlog.h"
#include "status_map.h"
#include "step_stream_reactor.h"

#ifndef SMLA_VERSION
#define SMLA_VERSION "unknown"
#endif

namespace smla::server::edge {
namespace {

v1::LayerKind ToWire(LayerKind kind) {
  switch (kind) {
    case LayerKind::kSwaOnly:
      return v1::LAYER_KIND_SWA;
    case LayerKind::kSwaTopK:
      return v1::LAYER_KIND_SWA_TOPK;
    case LayerKind::kSwaDense:
      return v1::LAYER_KIND_SWA_ALL_COMPRESSED;
    case LayerKind::kChosen:
      return v1::LAYER_KIND_TOPK;
  }
  return v1::LAYER_KIND_UNSPECIFIED;
}

// The model and sequence id of a sequence call, bounded (id_limits.h).
absl::Status CheckSequenceNames(const std::string& model, const std::string& sequence_id) {
  absl::Status st = CheckIdLength("model", model);
  if (st.ok()) st = CheckIdLength("sequence_id", sequence_id);
  return st;
}

// How much earlier than the server a client may see the call's deadline (the request's time in
// flight, generous for loaded machines).
constexpr absl::Duration kDeadlineSkew = absl::Milliseconds(250);

// A unary step on raw bytes: reads and submits in the constructor and finishes from the core's
// callback. The request and response messages live on the reactor's arena.
class StepUnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  StepUnaryReactor(SmlaService* service, grpc::CallbackServerContext* ctx,
                   const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : service_(service),
        response_bytes_(response),
        request_(google::protobuf::Arena::CreateMessage<v1::StepRequest>(&arena_)),
        response_(google::protobuf::Arena::CreateMessage<v1::StepResponse>(&arena_)),
        cancel_(std::make_shared<std::atomic<bool>>(false)),
        start_(absl::Now()),
        deadline_(CallDeadline(*ctx)) {
    StepRequest step;
    absl::StatusOr<std::string> tenant = service_->TenantOf(*ctx);
    if (!tenant.ok()) {
      Finish(service_->Finished("Step", "", tenant.status()));
      return;
    }
    absl::Status st = service_->PrepareBytes(*tenant, *request, deadline_, cancel_, request_, &step,
                                             &storage_, &staged_);
    request_id_ = step.request_id;
    parsed_ = absl::Now();
    if (!st.ok()) {
      Finish(service_->Finished("Step", request_id_, st));
      return;
    }
    service_->core()->Submit(std::move(step), [this](const absl::StatusOr<StepResult>& result) {
      if (!result.ok()) {
        Finish(service_->Finished("Step", request_id_, result.status()));
        return;
      }
      service_->AnswerStepBytes("Step", request_id_, start_, parsed_, result, &storage_.outputs,
                                staged_, response_, response_bytes_);
      Finish(grpc::Status::OK);
    });
  }

  // gRPC reports an expired deadline as a cancellation too; the core's own deadline check then
  // drops the step with DEADLINE_EXCEEDED, which is what happened. The client measures the same
  // timeout from an earlier instant (the send, not the receipt), so its own deadline's cancel can
  // arrive shortly before ours: one within kDeadlineSkew of it counts as the deadline.
  void OnCancel() override {
    if (absl::Now() < deadline_ - kDeadlineSkew) cancel_->store(true);
  }
  void OnDone() override { delete this; }

 private:
  SmlaService* const service_;
  grpc::ByteBuffer* const response_bytes_;
  google::protobuf::Arena arena_;
  v1::StepRequest* const request_;
  v1::StepResponse* const response_;
  const CancelFlag cancel_;
  const absl::Time start_;
  const absl::Time deadline_;
  absl::Time parsed_;
  std::string request_id_;
  ParseStorage storage_;
  StagedOutputs staged_;
};

// A stream refused before it starts (authentication, tenant stream quota).
class RejectedStream final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RejectedStream(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

absl::Time CallDeadline(const grpc::CallbackServerContext& ctx) {
  const auto d = ctx.deadline();
  if (d >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(d);
}

SmlaService::SmlaService(ServiceCore* core, EdgeMetrics* metrics, EdgeOptions options)
    : core_(core),
      metrics_(metrics),
      options_(std::move(options)),
      streams_(options_.limits.tenant_max_streams) {
  // Regions and inline staging share one budget of page-locked bytes.
  const HostPinning pinning = BudgetedPinning(
      HostPinning{[core](void* p, size_t n) { return core->RegisterHostMemory(p, n); },
                  [core](void* p) { core->UnregisterHostMemory(p); }},
      options_.max_pinned_bytes);
  if (options_.allow_shm) {
    regions_ = std::make_unique<RegionRegistry>(
        pinning, RegionCaps{options_.limits.max_regions, options_.limits.tenant_max_regions});
    handover_box_ = std::make_unique<HandoverBox>();
  }
  staging_ = std::make_unique<StagingPool>(pinning, options_.staging);
  copier_ = std::make_unique<v1::ParallelCopier>(
      options_.copy_threads >= 0 ? options_.copy_threads : v1::ParallelCopier::DefaultHelpers());
  for (const ModelConfig& m : core_->Info().models) {
    const ModelProfile* profile = FindProfile(m.profile);
    if (profile == nullptr) continue;
    models_[m.profile] = MakeWireModel(m.heads_per_rank, *profile);
  }
}

absl::Status SmlaService::StartHandover() {
  if (handover_box_ == nullptr) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<HandoverSocket>> socket =
      HandoverSocket::Start(options_.shm_socket, handover_box_.get());
  if (!socket.ok()) return socket.status();
  handover_socket_ = *std::move(socket);
  return absl::OkStatus();
}

absl::StatusOr<std::string> SmlaService::TenantOf(const grpc::CallbackServerContext& ctx) const {
  if (options_.auth == nullptr) return options_.tenant;
  return options_.auth->TenantOf(ctx);
}

absl::Status SmlaService::Prepare(const std::string& tenant, const v1::StepRequest& pb,
                                  absl::Time call_deadline, CancelFlag cancel, StepRequest* out,
                                  ParseStorage* storage) {
  const RegionContext regions{regions_.get(), tenant};
  absl::Status st =
      ParseStepRequest(pb, FindModel(pb.model()), options_.limits, out, storage, &regions);
  return Admit(std::move(st), tenant, pb.timeout_us(), call_deadline, std::move(cancel), out);
}

absl::Status SmlaService::PrepareView(const std::string& tenant, const StepView& view,
                                      absl::Time call_deadline, CancelFlag cancel, StepRequest* out,
                                      ParseStorage* storage) {
  const RegionContext regions{regions_.get(), tenant};
  absl::Status st =
      ParseStepView(view, FindModel(view.model), options_.limits, out, storage, &regions);
  return Admit(std::move(st), tenant, view.timeout_us, call_deadline, std::move(cancel), out);
}

const WireModel* SmlaService::FindModel(std::string_view model) const {
  const auto it = models_.find(model);
  return it == models_.end() ? nullptr : &it->second;
}

absl::Status SmlaService::Admit(absl::Status parsed, const std::string& tenant, int64_t timeout_us,
                                absl::Time call_deadline, CancelFlag cancel, StepRequest* out) {
  // A request refused before its id was read (an over-long id is not copied anywhere) is logged
  // and answered under an id of the server's.
  if (out->request_id.empty()) {
    out->request_id = absl::StrFormat("s%x", next_request_.fetch_add(1));
  }
  if (!parsed.ok()) return parsed;
  if (timeout_us < 0) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_us: ", timeout_us, " is negative"));
  }
  out->tenant = tenant;
  out->deadline = call_deadline;
  if (timeout_us > 0) {
    out->deadline = std::min(out->deadline, absl::Now() + absl::Microseconds(timeout_us));
  }
  out->cancelled = std::move(cancel);
  return absl::OkStatus();
}

bool SmlaService::PrepareDecoded(const std::string& tenant, const grpc::ByteBuffer& bytes,
                                 absl::Time call_deadline, const CancelFlag& cancel,
                                 StepRequest* out, ParseStorage* storage, StagedOutputs* staged,
                                 absl::Status* status) {
  if (bytes.Length() > kDecodedBytes) return false;
  grpc::Slice slice;
  if (!bytes.TrySingleSlice(&slice).ok() && !bytes.DumpToSingleSlice(&slice).ok()) return false;
  StepView view;
  if (!DecodePackedStep({slice.begin(), slice.size()}, &view)) return false;
  *status = PrepareView(tenant, view, call_deadline, cancel, out, storage);
  if (status->ok() && out->destination.out.empty()) *status = StageOutputs(tenant, out, staged);
  return true;
}

absl::Status SmlaService::PrepareBytes(const std::string& tenant, const grpc::ByteBuffer& bytes,
                                       absl::Time call_deadline, CancelFlag cancel,
                                       v1::StepRequest* pb, StepRequest* out, ParseStorage* storage,
                                       StagedOutputs* staged) {
  absl::Status st;
  if (PrepareDecoded(tenant, bytes, call_deadline, cancel, out, storage, staged, &st)) return st;
  st = ReadStepRequest(bytes, *staging_, copier_.get(), tenant, pb, &storage->landed);
  if (!st.ok()) {
    out->request_id = absl::StrFormat("s%x", next_request_.fetch_add(1));
    return st;
  }
  return PrepareStaged(tenant, *pb, call_deadline, std::move(cancel), out, storage, staged);
}

absl::Status SmlaService::PrepareStaged(const std::string& tenant, const v1::StepRequest& pb,
                                        absl::Time call_deadline, CancelFlag cancel,
                                        StepRequest* out, ParseStorage* storage,
                                        StagedOutputs* staged) {
  absl::Status st = Prepare(tenant, pb, call_deadline, std::move(cancel), out, storage);
  if (!st.ok() || !out->destination.out.empty()) return st;
  return StageOutputs(tenant, out, staged);
}

absl::Status SmlaService::StageOutputs(const std::string& tenant, StepRequest* out,
                                       StagedOutputs* staged) {
  // Outputs for the response: into staging, sent from there (response_writer.h). An unknown
  // model is the core's NOT_FOUND, with nothing to stage.
  const auto it = models_.find(out->model);
  if (it == models_.end()) return absl::OkStatus();
  int64_t rows = 0;
  for (const SpanInput& span : out->spans) rows += span.num_rows;
  const bool mx = out->output_format == kernels::OutputFormat::kMxfp8;
  const int64_t cells = rows * it->second.heads;
  const size_t out_bytes = cells * kernels::kValueWidth * (mx ? 1 : 2);
  const size_t mx_bytes = mx ? cells * kernels::kMxGroupsPerHead : 0;
  const size_t lse_bytes = out->want_lse ? cells * sizeof(float) : 0;
  // out, mx_scales and lse one after another, each 64-byte aligned.
  const size_t mx_at = AlignUp(out_bytes, 64);
  const size_t lse_at = mx_at + AlignUp(mx_bytes, 64);
  auto buffer = staging_->Lease(lse_at + lse_bytes, tenant);
  if (!buffer.ok()) return buffer.status();
  staged->buffer = *std::move(buffer);
  uint8_t* p = staged->buffer->data();
  staged->out = {p, out_bytes};
  staged->mx_scales = {p + mx_at, mx_bytes};
  staged->lse = {p + lse_at, lse_bytes};
  out->destination = {staged->out, staged->mx_scales, staged->lse};
  return absl::OkStatus();
}

void SmlaService::AnswerStepBytes(std::string_view method, const std::string& request_id,
                                  absl::Time start, absl::Time parsed,
                                  const absl::StatusOr<StepResult>& result,
                                  const OutputsView* request, const StagedOutputs& staged,
                                  v1::StepResponse* response, grpc::ByteBuffer* bytes) {
  AnswerStreamStep(request_id, start, parsed, result, request, response, staged.buffer != nullptr,
                   method);
  SerializeStepResponse(response, result.ok() ? staged : StagedOutputs{}, bytes);
}

void SmlaService::AnswerStreamStep(const std::string& request_id, absl::Time start,
                                   absl::Time parsed, const absl::StatusOr<StepResult>& result,
                                   const OutputsView* request, v1::StepResponse* response,
                                   bool staged, std::string_view method) {
  response->set_request_id(request_id);
  if (result.ok()) {
    const absl::Duration server_time = absl::Now() - start;
    FillStepResponse(*result, response, request, staged);
    v1::StepTimings* tm = response->mutable_timings();
    tm->set_server_us(absl::ToInt64Microseconds(server_time));
    tm->set_parse_us(absl::ToInt64Microseconds(parsed - start));
    tm->set_admit_us(absl::ToInt64Microseconds(result->timings.admitted - parsed));
    metrics_->ObserveStep(*result, server_time);
  }
  const grpc::Status g = Finished(method, request_id, result.status());
  response->set_code(static_cast<int32_t>(g.error_code()));
  response->set_message(g.error_message());
}

grpc::Status SmlaService::Finished(std::string_view method, const std::string& request_id,
                                   const absl::Status& status) {
  metrics_->CountRequest(method, status.code());
  // The request id and the message may carry client text: escaped and bounded (log_field.h).
  if (status.ok()) {
    if (spdlog::should_log(spdlog::level::debug)) {
      spdlog::debug("rpc={} req=\"{}\" code=OK", method, LogField(request_id));
    }
  } else {
    spdlog::info(
        "rpc={} req=\"{}\" code={} msg=\"{}\"", method, LogField(request_id),
        absl::StatusCodeToString(status.code()),
        LogField({status.message().data(), status.message().size()}, kMaxStatusMessageBytes));
  }
  return ToGrpcStatus(status);
}

grpc::ServerUnaryReactor* SmlaService::Reply(grpc::CallbackServerContext* ctx,
                                             std::string_view method, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(Finished(method, "", status));
  return reactor;
}

grpc::ServerUnaryReactor* SmlaService::GetServerInfo(grpc::CallbackServerContext* ctx,
                                                     const v1::ServerInfoRequest*,
                                                     v1::ServerInfo* response) {
  if (absl::StatusOr<std::string> t = TenantOf(*ctx); !t.ok()) {
    return Reply(ctx, "GetServerInfo", t.status());
  }
  FillServerInfo(*core_, options_, response);
  if (handover_socket_ != nullptr) response->set_shm_socket(handover_socket_->address());
  return Reply(ctx, "GetServerInfo", absl::OkStatus());
}

grpc::ServerUnaryReactor* SmlaService::CreateSequence(grpc::CallbackServerContext* ctx,
                                                      const v1::CreateSequenceRequest* request,
                                                      v1::CreateSequenceResponse*) {
  absl::StatusOr<std::string> tenant = TenantOf(*ctx);
  if (!tenant.ok()) return Reply(ctx, "CreateSequence", tenant.status());
  absl::Status st = CheckSequenceNames(request->model(), request->sequence_id());
  if (st.ok() && request->sequence_id().empty()) {
    st = absl::InvalidArgumentError("sequence_id: empty");
  }
  if (st.ok()) st = core_->CreateSequence(*tenant, request->model(), request->sequence_id());
  return Reply(ctx, "CreateSequence", st);
}

grpc::ServerUnaryReactor* SmlaService::ReleaseSequence(grpc::CallbackServerContext* ctx,
                                                       const v1::ReleaseSequenceRequest* request,
                                                       v1::ReleaseSequenceResponse*) {
  absl::StatusOr<std::string> tenant = TenantOf(*ctx);
  if (!tenant.ok()) return Reply(ctx, "ReleaseSequence", tenant.status());
  absl::Status st = CheckSequenceNames(request->model(), request->sequence_id());
  if (st.ok()) st = core_->ReleaseSequence(*tenant, request->model(), request->sequence_id());
  return Reply(ctx, "ReleaseSequence", st);
}

grpc::ServerUnaryReactor* SmlaService::TruncateSequence(grpc::CallbackServerContext* ctx,
                                                        const v1::TruncateSequenceRequest* request,
                                                        v1::TruncateSequenceResponse*) {
  absl::StatusOr<std::string> tenant = TenantOf(*ctx);
  if (!tenant.ok()) return Reply(ctx, "TruncateSequence", tenant.status());
  absl::Status st = CheckSequenceNames(request->model(), request->sequence_id());
  if (st.ok() && request->length() < 0) {
    st = absl::InvalidArgumentError(absl::StrCat("length: ", request->length(), " is negative"));
  }
  if (st.ok()) {
    st = core_->TruncateSequence(*tenant, request->model(), request->sequence_id(),
                                 request->length());
  }
  return Reply(ctx, "TruncateSequence", st);
}

grpc::ServerUnaryReactor* SmlaService::GetSequence(grpc::CallbackServerContext* ctx,
                                                   const v1::GetSequenceRequest* request,
                                                   v1::GetSequenceResponse* response) {
  absl::StatusOr<std::string> tenant = TenantOf(*ctx);
  if (!tenant.ok()) return Reply(ctx, "GetSequence", tenant.status());
  if (absl::Status st = CheckSequenceNames(request->model(), request->sequence_id()); !st.ok()) {
    return Reply(ctx, "GetSequence", st);
  }
  auto len =
      core_->SequenceLength(*tenant, request->model(), request->sequence_id(), request->layer());
  if (len.ok()) response->set_length(*len);
  return Reply(ctx, "GetSequence", len.status());
}

grpc::ServerUnaryReactor* SmlaService::SetRopeTable(grpc::CallbackServerContext* ctx,
                                                    const v1::SetRopeTableRequest* request,
                                                    v1::SetRopeTableResponse*) {
  if (absl::StatusOr<std::string> t = TenantOf(*ctx); !t.ok()) {
    return Reply(ctx, "SetRopeTable", t.status());
  }
  if (absl::Status st = CheckIdLength("model", request->model()); !st.ok()) {
    return Reply(ctx, "SetRopeTable", st);
  }
  auto table = ParseF32Tensor(request->cos_sin(), "cos_sin", {-1, 64});
  absl::Status st = table.status();
  if (st.ok()) {
    st = core_->SetRopeTable(request->model(), *table,
                             static_cast<int32_t>(request->cos_sin().shape(0)));
  }
  return Reply(ctx, "SetRopeTable", st);
}

grpc::ServerUnaryReactor* SmlaService::SetSinks(grpc::CallbackServerContext* ctx,
                                                const v1::SetSinksRequest* request,
                                                v1::SetSinksResponse*) {
  if (absl::StatusOr<std::string> t = TenantOf(*ctx); !t.ok()) {
    return Reply(ctx, "SetSinks", t.status());
  }
  if (absl::Status st = CheckIdLength("model", request->model()); !st.ok()) {
    return Reply(ctx, "SetSinks", st);
  }
  std::vector<int64_t> shape = {-1, -1};
  const auto it = models_.find(request->model());
  if (it != models_.end()) {
    const ModelProfile* profile = FindProfile(request->model());
    shape = {profile->num_layers(), it->second.heads};
  }
  auto sinks = ParseF32Tensor(request->sinks(), "sinks", shape);
  absl::Status st = sinks.status();
  if (st.ok()) st = core_->SetSinks(request->model(), *sinks);
  return Reply(ctx, "SetSinks", st);
}

grpc::ServerUnaryReactor* SmlaService::Step(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) {
  return new StepUnaryReactor(this, ctx, request, response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* SmlaService::StepStream(
    grpc::CallbackServerContext* ctx) {
  absl::StatusOr<std::string> tenant = TenantOf(*ctx);
  absl::Status st = tenant.status();
  if (st.ok()) st = streams_.Open(*tenant);
  if (!st.ok()) return new RejectedStream(Finished("StepStream", "", st));
  return new StepStreamReactor(this, ctx, *tenant);
}

void FillServerInfo(const ServiceCore& core, const EdgeOptions& options, v1::ServerInfo* out) {
  const ServerInfo info = core.Info();
  out->set_server_version(SMLA_VERSION);
  out->set_grpc_version(grpc::Version());
  out->set_protobuf_version(google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION));
  v1::DeviceInfo* dev = out->mutable_device();
  dev->set_backend(std::string(kernels::BackendKindName(info.device.kind)));
  dev->set_name(info.device.name);
  dev->set_arch(info.device.arch);
  dev->set_compute_units(info.device.compute_units);
  dev->set_total_memory(info.device.total_memory);
  for (const ModelConfig& m : info.models) {
    v1::ModelInfo* mi = out->add_models();
    mi->set_profile(m.profile);
    mi->set_tp(m.tp);
    mi->set_heads_per_rank(m.heads_per_rank);
    mi->set_kv_format(std::string(kernels::KvFormatName(m.kv_format)));
    mi->set_kv_scale(m.kv_scale);
    mi->set_swa_rollback(m.swa_rollback);
    const ModelProfile* profile = FindProfile(m.profile);
    if (profile != nullptr) {
      mi->set_geometry(std::string(kernels::GeometryName(profile->geometry)));
      mi->set_qk_width(kernels::QkWidth(profile->geometry));
      mi->set_softmax_scale(m.softmax_scale > 0 ? m.softmax_scale : profile->softmax_scale);
      mi->set_has_sinks(profile->has_sink);
      for (const LayerSpec& l : profile->layers) {
        v1::LayerInfo* li = mi->add_layers();
        li->set_kind(ToWire(l.kind));
        li->set_window(l.has_window() ? profile->swa_window : 0);
        li->set_compression_ratio(l.ratio);
        li->set_topk(l.topk);
      }
    }
    for (const PoolUsage& p : info.pools) {
      if (p.model != m.profile) continue;
      v1::PoolInfo* pool = mi->mutable_pool();
      pool->set_pages_total(p.pages_total);
      pool->set_pages_used(p.pages_used);
      pool->set_page_bytes(p.page_bytes);
      pool->set_page_rows(m.page_rows);
    }
  }
  const Limits& l = options.limits;
  v1::Limits* lim = out->mutable_limits();
  lim->set_max_rows_per_step(l.max_rows_per_step);
  lim->set_max_spans_per_step(l.max_spans_per_step);
  lim->set_max_batch_rows(l.max_batch_rows);
  lim->set_max_batch_bytes(l.max_batch_bytes);
  lim->set_max_queued_requests(l.max_queued_requests);
  lim->set_max_queued_rows(l.max_queued_rows);
  lim->set_batch_wait_us(absl::ToInt64Microseconds(l.batch_wait));
  lim->set_scheduler_spin_us(absl::ToInt64Microseconds(l.scheduler_spin));
  lim->set_max_sequences(l.max_sequences);
  lim->set_max_context(l.max_context);
  lim->set_stream_max_inflight(options.stream_max_inflight);
  lim->set_max_message_bytes(options.max_message_bytes);
  out->set_sequences(info.sequences);
  out->set_healthy(core.Healthy());
}

}  // namespace smla::server::edge
