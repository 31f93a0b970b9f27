// The StepStream call: requests are read ahead up to a bound (a count and the bytes their
// inline tensors hold), submitted to the core as they arrive (so one stream's steps can share
// batches with other streams), and answered in request order. Requests and responses travel as
// raw bytes: inline tensors land in staging and outputs are sent from it (request_reader.h,
// response_writer.h). A failed request gets its code in its response; the stream goes on. A request
// with ring_attach attaches a step ring (step_ring.h) that serves steps beside the stream
// until the stream ends.
//
// Lifetime: the reactor deletes itself in OnDone, which gRPC calls after Finish; Finish is
// called only once no core callback is outstanding and no read or write is pending, so no
// callback can touch a deleted reactor, and only once its ring (if any) has stopped and
// answered its last step.
#pragma once

#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/arena.h"
#include "grpcpp/grpcpp.h"
#include "response_writer.h"
#include "smla/server/step.h"
#include "smla/v1/step.pb.h"
#include "step_ring.h"
#include "wire.h"

namespace smla::server::edge {

class SmlaService;

class StepStreamReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `tenant` has a stream counted open in service->streams(); OnDone closes it.
  StepStreamReactor(SmlaService* service, grpc::CallbackServerContext* ctx, std::string tenant);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // One request from its read to its response's write. Request and response live on the
  // entry's arena, which starts in the entry itself: reading a packed request, or an inline
  // one of a few spans, allocates nothing more.
  struct Entry {
    Entry();
    alignas(8) char first_block[8192];
    google::protobuf::Arena arena;  // destroyed after the members below, which point into it
    v1::StepRequest* const request;
    ParseStorage storage;
    StagedOutputs staged;
    grpc::ByteBuffer request_bytes;   // the pending read's target; cleared once parsed
    grpc::ByteBuffer response_bytes;  // written once answered
    std::string request_id;
    absl::Time start;
    absl::Time parsed;  // written before the step is submitted, read by its callback
    v1::StepResponse* const response;
    bool done = false;
    uint64_t bytes = 0;  // counted against the stream's byte bound while in flight
  };
  // What to start once the lock is released (gRPC calls are never made under mu_).
  struct Actions {
    grpc::ByteBuffer* read = nullptr;
    const grpc::ByteBuffer* write = nullptr;
    bool finish = false;
    bool cancelled = false;  // finish with CANCELLED
    StepRing* stop_ring = nullptr;
  };

  void Complete(Entry* entry, const absl::StatusOr<StepResult>& result);
  // Answers a ring_attach request (the ring starts when it is accepted).
  void AttachRing(Entry* entry);
  // Marks the entry answered and starts what that allows (writes in request order, the finish).
  void Answered(Entry* entry);
  // Drops the answered front entry.
  void Pop() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Picks the next read, write or finish.
  Actions NextActions() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(const Actions& a);

  SmlaService* const service_;
  const std::string tenant_;
  const absl::Time call_deadline_;
  const CancelFlag cancel_;
  // Also guards each Entry's `done` and `bytes` once the entry is in inflight_.
  absl::Mutex mu_;
  // Request order; front is written first.
  std::deque<std::unique_ptr<Entry>> inflight_ ABSL_GUARDED_BY(mu_);
  // Its request is the pending read's target.
  std::unique_ptr<Entry> reading_ ABSL_GUARDED_BY(mu_);
  uint64_t inflight_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // Entry::bytes over inflight_
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;          // core callbacks not yet run
  bool read_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;  // cancelled or a write failed: drop responses
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Set once by AttachRing; destroyed with the reactor.
  std::unique_ptr<StepRing> ring_ ABSL_GUARDED_BY(mu_);
  bool ring_live_ ABSL_GUARDED_BY(mu_) = false;  // attached and not yet idle (on_idle)
  bool ring_stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace smla::server::edge
