// C++ client of smla.v1.Smla: typed sequence handles, unary calls, and the step stream.
// Statuses come back as absl::Status with the server's code and message.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "smla/v1/parallel_copy.h"
#include "smla/v1/service.grpc.pb.h"

namespace smla::client {

absl::Status FromGrpcStatus(const grpc::Status& status);

struct ClientOptions {
  std::string target;  // HOST:PORT
  // Per-call deadline of the unary calls; InfiniteDuration = none.
  absl::Duration timeout = absl::Seconds(120);
  // Both directions; the server reports its own limit in ServerInfo.limits.
  int max_message_bytes = 1 << 30;
  // Security: TLS when `tls` or any PEM file is given; mTLS with tls_cert + tls_key. The
  // bearer token, when set, goes with every call on the channel.
  bool tls = false;
  std::string tls_ca;           // PEM roots to verify the server (default: the system's)
  std::string tls_cert;         // PEM client certificate chain (mTLS)
  std::string tls_key;          // PEM client private key (mTLS)
  std::string tls_server_name;  // name checked in the server certificate, if not the target's
  std::string token;            // bearer token
  // Extra gRPC channel arguments (name, integer value), e.g. the ones docs/operations.md lists.
  std::vector<std::pair<std::string, int>> grpc_args;
  // Connect sets glibc's malloc to keep freed memory for reuse (smla/v1/allocator.h): without
  // it every multi-MB message maps and faults in fresh pages. Process-wide; turn it off when
  // the frontend manages its allocator itself.
  bool keep_freed_memory = true;
  // Threads that copy a large response's tensor bytes out of gRPC's buffers beside the reading
  // thread (smla/v1/parallel_copy.h); -1: ParallelCopier::DefaultHelpers(), 0: none.
  int copy_threads = -1;
};

// A sequence created on the server: the model it lives in and its id.
struct Sequence {
  std::string model;
  std::string id;
};

// The bidirectional step stream: writes and reads may run on different threads; responses
// arrive in request order.
class StepStream {
 public:
  ~StepStream();
  // Serializes `request` (its tensor bytes are copied) and writes it.
  bool Write(const v1::StepRequest& request);
  // Writes `request` with its large tensor bytes sent from where the message holds them, no
  // copy; the stream keeps `request` alive until gRPC has sent them, and it must not change
  // until then (after the response has been read it is safe to change once use_count() is 1).
  bool Write(std::shared_ptr<const v1::StepRequest> request);
  // False when the stream has ended (then Finish tells why). Large responses' tensor bytes are
  // copied out of gRPC's buffers once, over the client's copy threads.
  bool Read(v1::StepResponse* response);
  bool WritesDone();
  absl::Status Finish();
  // Cancels the call (the server drops this stream's queued work).
  void Cancel();

 private:
  friend class Client;
  StepStream() = default;
  std::unique_ptr<grpc::ClientContext> context_;
  // Raw bytes both ways (step_codec.h); the wire is smla.v1 protobuf.
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream_;
  std::shared_ptr<v1::ParallelCopier> copier_;
  absl::Status read_error_;  // a response that did not parse ends the stream with it
  bool finished_ = false;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  absl::StatusOr<v1::ServerInfo> Info();
  // The grpc.health.v1 status of `service` ("" = the server as a whole): true when SERVING.
  absl::StatusOr<bool> Health(const std::string& service = "");

  absl::StatusOr<Sequence> CreateSequence(const std::string& model, const std::string& id);
  absl::Status Release(const Sequence& sequence);
  absl::Status Truncate(const Sequence& sequence, int64_t length);
  absl::StatusOr<int64_t> Length(const Sequence& sequence, int32_t layer);

  // cos_sin: [positions, 64] f32 (cos 0..31, sin 32..63).
  absl::Status SetRopeTable(const std::string& model, std::span<const float> cos_sin,
                            int32_t positions);
  // sinks: [layers, heads_per_rank] f32.
  absl::Status SetSinks(const std::string& model, std::span<const float> sinks, int32_t layers,
                        int32_t heads);

  // One step; `timeout` overrides the client's default for this call.
  absl::StatusOr<v1::StepResponse> Step(const v1::StepRequest& request,
                                        absl::Duration timeout = absl::ZeroDuration());
  // Opens a step stream; the stream has no deadline unless `timeout` is finite.
  absl::StatusOr<std::unique_ptr<StepStream>> OpenStream(
      absl::Duration timeout = absl::InfiniteDuration());

  v1::Smla::Stub* stub() { return stub_.get(); }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }

 private:
  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Smla::Stub> stub_;
  std::unique_ptr<grpc::internal::RpcMethod> step_stream_method_;  // raw bytes
  std::shared_ptr<v1::ParallelCopier> copier_;
};

}  // namespace smla::client
