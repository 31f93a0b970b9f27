// The gRPC handlers of smla.v1.Smla on the callback API: parse, check wire-level shapes,
// hand the step to the service core, and finish from the core's completion callback.
//
// Ownership: the service borrows the core and the metrics; both must outlive the gRPC server.
// A step's protobuf request stays alive until its reactor finishes, so the StepRequest handed
// to the core can point into it.
#pragma once

#include <atomic>
#include <map>
#include <string>

#include "auth.h"
#include "edge_metrics.h"
#include "host_staging.h"
#include "response_writer.h"
#include "shm_handover.h"
#include "shm_region.h"
#include "smla/server/service_core.h"
#include "smla/v1/parallel_copy.h"
#include "smla/v1/service.grpc.pb.h"
#include "wire.h"

namespace smla::server::edge {

struct EdgeOptions {
  // Requests of one StepStream read but not yet answered; reading pauses at this bound, so a
  // client that does not read its responses holds at most this many in server memory.
  int32_t stream_max_inflight = 16;
  // The tenant of every call when there is no authentication (`auth` null).
  std::string tenant = "default";
  // Who a call acts for (tokens, mTLS); null: every call acts for `tenant`.
  std::shared_ptr<const Authenticator> auth;
  Limits limits;
  int64_t max_message_bytes = 0;  // reported in ServerInfo
  // Registered shared-memory regions (RegisterRegion, RegionRef tensors); off by default.
  bool allow_shm = false;
  // Bytes of regions page-locked at once (BudgetedPinning).
  uint64_t max_pinned_bytes = 0;
  // Inline tensor bytes (requests and responses) held at once: server-wide, per tenant, and per
  // StepStream (reading pauses past it, with at least one request always read).
  StagingPool::Options staging;
  uint64_t stream_max_inflight_bytes = uint64_t{256} << 20;
  // The region handover socket's address (HandoverSocket::Start; empty: an abstract name).
  std::string shm_socket;
  // Threads that copy a large request's tensor bytes into staging beside the call's own
  // (v1::ParallelCopier); -1: ParallelCopier::DefaultHelpers().
  int32_t copy_threads = -1;
};

// The generated service with Step and StepStream on raw bytes (grpc::ByteBuffer), so that
// inline tensors skip protobuf's copies (request_reader.h, response_writer.h); the other
// methods stay typed.
using SmlaServiceBase = v1::Smla::WithCallbackMethod_GetServerInfo<
    v1::Smla::WithCallbackMethod_CreateSequence<v1::Smla::WithCallbackMethod_ReleaseSequence<
        v1::Smla::WithCallbackMethod_TruncateSequence<v1::Smla::WithCallbackMethod_GetSequence<
            v1::Smla::WithCallbackMethod_SetRopeTable<v1::Smla::WithCallbackMethod_SetSinks<
                v1::Smla::WithRawCallbackMethod_Step<v1::Smla::WithRawCallbackMethod_StepStream<
                    v1::Smla::WithCallbackMethod_RegisterRegion<
                        v1::Smla::WithCallbackMethod_UnregisterRegion<v1::Smla::Service>>>>>>>>>>>;

class SmlaService final : public SmlaServiceBase {
 public:
  SmlaService(ServiceCore* core, EdgeMetrics* metrics, EdgeOptions options);
  // With allow_shm, binds the region handover socket (before the gRPC server starts).
  absl::Status StartHandover();

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx,
                                          const v1::ServerInfoRequest* request,
                                          v1::ServerInfo* response) override;
  grpc::ServerUnaryReactor* CreateSequence(grpc::CallbackServerContext* ctx,
                                           const v1::CreateSequenceRequest* request,
                                           v1::CreateSequenceResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseSequence(grpc::CallbackServerContext* ctx,
                                            const v1::ReleaseSequenceRequest* request,
                                            v1::ReleaseSequenceResponse* response) override;
  grpc::ServerUnaryReactor* TruncateSequence(grpc::CallbackServerContext* ctx,
                                             const v1::TruncateSequenceRequest* request,
                                             v1::TruncateSequenceResponse* response) override;
  grpc::ServerUnaryReactor* GetSequence(grpc::CallbackServerContext* ctx,
                                        const v1::GetSequenceRequest* request,
                                        v1::GetSequenceResponse* response) override;
  grpc::ServerUnaryReactor* SetRopeTable(grpc::CallbackServerContext* ctx,
                                         const v1::SetRopeTableRequest* request,
                                         v1::SetRopeTableResponse* response) override;
  grpc::ServerUnaryReactor* SetSinks(grpc::CallbackServerContext* ctx,
                                     const v1::SetSinksRequest* request,
                                     v1::SetSinksResponse* response) override;
  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StepStream(
      grpc::CallbackServerContext* ctx) override;
  // Defined in shm_region_service.cc.
  grpc::ServerWriteReactor<v1::RegisterRegionResponse>* RegisterRegion(
      grpc::CallbackServerContext* ctx, const v1::RegisterRegionRequest* request) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* ctx,
                                             const v1::UnregisterRegionRequest* request,
                                             v1::UnregisterRegionResponse* response) override;
  // Ends every region's registering call and unmaps what no step still uses (shutdown).
  void CloseRegions() {
    if (regions_) regions_->CloseAll();
  }
  RegionRegistry* regions() const { return regions_.get(); }
  HandoverBox* handover() const { return handover_box_.get(); }

  // The tenant a call acts for, or UNAUTHENTICATED.
  absl::StatusOr<std::string> TenantOf(const grpc::CallbackServerContext& ctx) const;
  TenantStreams& streams() { return streams_; }

  // Parses `pb` into `out` with tenant, request id, deadline and cancel flag filled in.
  absl::Status Prepare(const std::string& tenant, const v1::StepRequest& pb,
                       absl::Time call_deadline, CancelFlag cancel, StepRequest* out,
                       ParseStorage* storage);
  // Prepare of a packed request read into a view (packed_step_decoder.h): the same result and
  // the same errors as Prepare of the message protobuf reads from the same bytes.
  absl::Status PrepareView(const std::string& tenant, const StepView& view,
                           absl::Time call_deadline, CancelFlag cancel, StepRequest* out,
                           ParseStorage* storage);

  // A serialized step of the packed form, of at most kDecodedBytes, read without protobuf
  // (packed_step_decoder.h) and prepared as PrepareBytes prepares it: true when the decoder read
  // `bytes`, `*status` then saying how the step was prepared; false when protobuf must read them.
  bool PrepareDecoded(const std::string& tenant, const grpc::ByteBuffer& bytes,
                      absl::Time call_deadline, const CancelFlag& cancel, StepRequest* out,
                      ParseStorage* storage, StagedOutputs* staged, absl::Status* status);
  static constexpr size_t kDecodedBytes = size_t{64} << 10;
  // Reads a serialized step (PrepareDecoded, else request_reader.h into `pb`, empty and kept
  // alive by the caller) and prepares it as Prepare does; outputs not sent to client regions get
  // staging in `staged`.
  absl::Status PrepareBytes(const std::string& tenant, const grpc::ByteBuffer& bytes,
                            absl::Time call_deadline, CancelFlag cancel, v1::StepRequest* pb,
                            StepRequest* out, ParseStorage* storage, StagedOutputs* staged);
  // The second half of PrepareBytes, for a request already read into `pb`.
  absl::Status PrepareStaged(const std::string& tenant, const v1::StepRequest& pb,
                             absl::Time call_deadline, CancelFlag cancel, StepRequest* out,
                             ParseStorage* storage, StagedOutputs* staged);
  // Fills `response` as AnswerStreamStep does and serializes it with the staged outputs.
  void AnswerStepBytes(std::string_view method, const std::string& request_id, absl::Time start,
                       absl::Time parsed, const absl::StatusOr<StepResult>& result,
                       const OutputsView* request, const StagedOutputs& staged,
                       v1::StepResponse* response, grpc::ByteBuffer* bytes);

  StagingPool& staging() { return *staging_; }
  v1::ParallelCopier& copier() { return *copier_; }
  ServiceCore* core() const { return core_; }
  EdgeMetrics* metrics() const { return metrics_; }
  const EdgeOptions& options() const { return options_; }

  // Logs and counts a finished call, and turns its status into a gRPC one.
  grpc::Status Finished(std::string_view method, const std::string& request_id,
                        const absl::Status& status);
  // Fills the response of one StepStream step (the stream's or its ring's): on success the
  // outputs, the timings (server time from `start`, parse to `parsed`, admit to the core's
  // admission) and the step metrics; in every case the call's count, code and message.
  // `request` is what the step asked for (may be null).
  void AnswerStreamStep(const std::string& request_id, absl::Time start, absl::Time parsed,
                        const absl::StatusOr<StepResult>& result, const OutputsView* request,
                        v1::StepResponse* response, bool staged = false,
                        std::string_view method = "StepStream");

 private:
  // The served model's shapes, or null for a model not served (the core's NOT_FOUND).
  const WireModel* FindModel(std::string_view model) const;
  // Staging for the outputs of a step that sends them back inline (none in client regions).
  absl::Status StageOutputs(const std::string& tenant, StepRequest* out, StagedOutputs* staged);
  // The end of Prepare: a server request id when the request's was not read, then (once
  // `parsed` is OK) the timeout's check, tenant, deadline and cancel flag.
  absl::Status Admit(absl::Status parsed, const std::string& tenant, int64_t timeout_us,
                     absl::Time call_deadline, CancelFlag cancel, StepRequest* out);

  grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, std::string_view method,
                                  const absl::Status& status);

  ServiceCore* core_;
  EdgeMetrics* metrics_;
  const EdgeOptions options_;
  std::map<std::string, WireModel, std::less<>> models_;  // by profile; fixed after construction
  std::atomic<uint64_t> next_request_{1};
  TenantStreams streams_;
  std::unique_ptr<StagingPool> staging_;
  std::unique_ptr<v1::ParallelCopier> copier_;
  std::unique_ptr<RegionRegistry> regions_;          // null unless allow_shm
  std::unique_ptr<HandoverBox> handover_box_;        // null unless allow_shm
  std::unique_ptr<HandoverSocket> handover_socket_;  // set by Start with allow_shm
};

// Fills a ServerInfo message from the core (versions, device, models with layer plans and
// pools, limits).
void FillServerInfo(const ServiceCore& core, const EdgeOptions& options, v1::ServerInfo* out);

// The call's deadline as absl time (InfiniteFuture when none).
absl::Time CallDeadline(const grpc::CallbackServerContext& ctx);

}  // namespace smla::server::edge
