#include "smla/client/client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "channel_auth.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "smla/base/status_macros.h"
#include "smla/client/tensor.h"
#include "smla/v1/allocator.h"
#include "step_codec.h"

namespace smla::client {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

StepStream::~StepStream() {
  if (!finished_ && stream_) {
    context_->TryCancel();
    stream_->Finish().ok();
  }
}

bool StepStream::Write(const v1::StepRequest& request) {
  grpc::ByteBuffer bytes;
  bool own_buffer = false;
  if (!grpc::SerializationTraits<v1::StepRequest>::Serialize(request, &bytes, &own_buffer).ok()) {
    return false;
  }
  return stream_->Write(bytes);
}

bool StepStream::Write(std::shared_ptr<const v1::StepRequest> request) {
  return stream_->Write(EncodeStepRequest(std::move(request)));
}

bool StepStream::Read(v1::StepResponse* response) {
  grpc::ByteBuffer bytes;
  if (!read_error_.ok() || !stream_->Read(&bytes)) return false;
  read_error_ = DecodeStepResponse(bytes, copier_.get(), response);
  if (read_error_.ok()) return true;
  context_->TryCancel();
  return false;
}
bool StepStream::WritesDone() { return stream_->WritesDone(); }
void StepStream::Cancel() { context_->TryCancel(); }

absl::Status StepStream::Finish() {
  finished_ = true;
  absl::Status st = FromGrpcStatus(stream_->Finish());
  return read_error_.ok() ? st : read_error_;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("client: no target");
  auto c = std::unique_ptr<Client>(new Client());
  c->options_ = options;
  if (options.keep_freed_memory) v1::KeepFreedMemoryForReuse();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  for (const auto& [name, value] : options.grpc_args) args.SetInt(name, value);
  SMLA_ASSIGN_OR_RETURN(c->channel_, MakeChannel(options, args));
  c->stub_ = v1::Smla::NewStub(c->channel_);
  c->step_stream_method_ = std::make_unique<grpc::internal::RpcMethod>(
      "/smla.v1.Smla/StepStream", grpc::internal::RpcMethod::BIDI_STREAMING, c->channel_);
  c->copier_ = std::make_shared<v1::ParallelCopier>(
      options.copy_threads >= 0 ? options.copy_threads : v1::ParallelCopier::DefaultHelpers());
  return c;
}

void Client::Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
  if (timeout == absl::ZeroDuration()) timeout = options_.timeout;
  if (timeout != absl::InfiniteDuration()) {
    ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMicroseconds(timeout));
  }
}

absl::StatusOr<v1::ServerInfo> Client::Info() {
  grpc::ClientContext ctx;
  Prepare(&ctx, absl::ZeroDuration());
  v1::ServerInfo info;
  SMLA_RETURN_IF_ERROR(FromGrpcStatus(stub_->GetServerInfo(&ctx, v1::ServerInfoRequest(), &info)));
  return info;
}

absl::StatusOr<bool> Client::Health(const std::string& service) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  Prepare(&ctx, absl::ZeroDuration());
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  SMLA_RETURN_IF_ERROR(FromGrpcStatus(health->Check(&ctx, req, &resp)));
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

absl::StatusOr<Sequence> Client::CreateSequence(const std::string& model, const std::string& id) {
  grpc::ClientContext ctx;
  Prepare(&ctx, absl::ZeroDuration());
  v1::CreateSequenceRequest req;
  req.set_model(model);
  req.set_sequence_id(id);
  v1::CreateSequenceResponse resp;
  SMLA_RETURN_IF_ERROR(FromGrpcStatus(stub_->CreateSequence(&ctx, req, &resp)));
  return Sequence{model, id};
}

absl::Status Client::Release(const Sequence& sequence) {
  grpc::ClientContext ctx;
  Prepare(&ctx, absl::ZeroDuration());
  v1::ReleaseSequenceRequest req;
  req.set_model(sequence.model);
  req.set_sequence_id(sequence.id);
  v1::ReleaseSequenceResponse resp;
  return FromGrpcStatus(stub_->ReleaseSequence(&ctx, req, &resp));
}

absl::Status Client::Truncate(const Sequence& sequence, int64_t length) {
  grpc::ClientContext ctx;
  Prepare(&ctx, absl::ZeroDuration());
  v1::TruncateSequenceRequest req;
  req.set_model(sequence.model);
  req.set_sequence_id(sequence.id);
  req.set_length(length);
  v1::TruncateSequenceResponse resp;
  return FromGrpcStatus(stub_->TruncateSequence(&ctx, req, &resp));
}

absl::StatusOr<int64_t> Client::Length(const Sequence& sequence, int32_t layer) {
  grpc::ClientContext ctx;
  Prepare(&ctx, absl::ZeroDuration());
  v1::GetSequenceRequest req;
  req.set_model(sequence.model);
  req.set_sequence_id(sequence.id);
  req.set_layer(layer);
  v1::GetSequenceResponse resp;
  SMLA_RETURN_IF_ERROR(FromGrpcStatus(stub_->GetSequence(&ctx, req, &resp)));
  return resp.length();
}

absl::Status Client::SetRopeTable(const std::string& model, std::span<const float> cos_sin,
                                  int32_t positions) {
  grpc::ClientContext ctx;
  Prepare(&ctx, absl::ZeroDuration());
  v1::SetRopeTableRequest req;
  req.set_model(model);
  *req.mutable_cos_sin() = PackF32(cos_sin, {positions, 64});
  v1::SetRopeTableResponse resp;
  return FromGrpcStatus(stub_->SetRopeTable(&ctx, req, &resp));
}

absl::Status Client::SetSinks(const std::string& model, std::span<const float> sinks,
                              int32_t layers, int32_t heads) {
  grpc::ClientContext ctx;
  Prepare(&ctx, absl::ZeroDuration());
  v1::SetSinksRequest req;
  req.set_model(model);
  *req.mutable_sinks() = PackF32(sinks, {layers, heads});
  v1::SetSinksResponse resp;
  return FromGrpcStatus(stub_->SetSinks(&ctx, req, &resp));
}

absl::StatusOr<v1::StepResponse> Client::Step(const v1::StepRequest& request,
                                              absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  v1::StepResponse resp;
  SMLA_RETURN_IF_ERROR(FromGrpcStatus(stub_->Step(&ctx, request, &resp)));
  return resp;
}

absl::StatusOr<std::unique_ptr<StepStream>> Client::OpenStream(absl::Duration timeout) {
  std::unique_ptr<StepStream> s(new StepStream());
  s->context_ = std::make_unique<grpc::ClientContext>();
  if (timeout != absl::InfiniteDuration()) Prepare(s->context_.get(), timeout);
  s->stream_.reset(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel_.get(), *step_stream_method_, s->context_.get()));
  if (!s->stream_) return absl::UnavailableError("cannot open StepStream");
  s->copier_ = copier_;
  return s;
}

}  // namespace smla::client
