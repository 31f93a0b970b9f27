#include "step_stream_reactor.h"

#include <utility>

#include "host_staging.h"
#include "request_reader.h"
#include "response_writer.h"
#include "smla_service.h"

namespace smla::server::edge {
StepStreamReactor::Entry::Entry()
    : arena(FirstBlock(first_block, sizeof first_block)),
      request(google::protobuf::Arena::CreateMessage<v1::StepRequest>(&arena)),
      response(google::protobuf::Arena::CreateMessage<v1::StepResponse>(&arena)) {}

StepStreamReactor::StepStreamReactor(SmlaService* service, grpc::CallbackServerContext* ctx,
                                     std::string tenant)
    : service_(service),
      tenant_(std::move(tenant)),
      call_deadline_(CallDeadline(*ctx)),
      cancel_(std::make_shared<std::atomic<bool>>(false)) {
  service_->metrics()->StreamOpened();
  Actions a;
  {
    absl::MutexLock lock(&mu_);
    a = NextActions();
  }
  Run(a);
}

StepStreamReactor::Actions StepStreamReactor::NextActions() {
  Actions a;
  if (finished_) return a;
  // A client that does not read its responses holds at most this much in server memory; one
  // request is always read, whatever its size, so that any legal step can be served.
  const EdgeOptions& o = service_->options();
  const bool room =
      inflight_.empty() || (static_cast<int32_t>(inflight_.size()) < o.stream_max_inflight &&
                            inflight_bytes_ < o.stream_max_inflight_bytes);
  if (!broken_ && !reads_done_ && !read_pending_ && room) {
    reading_ = std::make_unique<Entry>();
    read_pending_ = true;
    a.read = &reading_->request_bytes;
  }
  if (broken_) {
    // Nothing more is sent; entries whose callbacks ran can go.
    while (!writing_ && !inflight_.empty() && inflight_.front()->done) Pop();
  } else if (!writing_ && !inflight_.empty() && inflight_.front()->done) {
    writing_ = true;
    a.write = &inflight_.front()->response_bytes;
  }
  if ((reads_done_ || broken_) && ring_live_ && !ring_stopping_) {
    ring_stopping_ = true;
    a.stop_ring = ring_.get();
  }
  if ((reads_done_ || broken_) && !read_pending_ && !writing_ && inflight_.empty() &&
      outstanding_ == 0 && !ring_live_) {
    finished_ = true;
    a.finish = true;
    a.cancelled = broken_ && cancel_->load();
  }
  return a;
}

void StepStreamReactor::Run(const Actions& a) {
  if (a.read != nullptr) StartRead(a.read);
  if (a.write != nullptr) StartWrite(a.write);
  if (a.finish) {
    Finish(a.cancelled ? grpc::Status::CANCELLED : grpc::Status::OK);
  }
  // Last: the ring's on_idle may finish the call from inside Stop.
  if (a.stop_ring != nullptr) a.stop_ring->Stop();
}

void StepStreamReactor::OnReadDone(bool ok) {
  Entry* entry = nullptr;
  {
    absl::MutexLock lock(&mu_);
    read_pending_ = false;
    if (!ok) {
      reads_done_ = true;
    } else {
      std::unique_ptr<Entry> e = std::move(reading_);
      e->start = absl::Now();
      entry = e.get();
      inflight_.push_back(std::move(e));
      ++outstanding_;  // held until Complete, for both paths below
    }
  }
  absl::Status st;
  StepRequest step;
  // Read without protobuf: a packed request (never a ring_attach), prepared as below.
  bool decoded = false;
  if (entry != nullptr) {
    decoded = service_->PrepareDecoded(tenant_, entry->request_bytes, call_deadline_, cancel_,
                                       &step, &entry->storage, &entry->staged, &st);
    if (!decoded) {
      st = ReadStepRequest(entry->request_bytes, service_->staging(), &service_->copier(), tenant_,
                           entry->request, &entry->storage.landed);
    }
    entry->request_bytes.Clear();  // gRPC's receive buffers go back now
  }
  if (entry != nullptr && !decoded && st.ok() && entry->request->has_ring_attach()) {
    AttachRing(entry);
  } else if (entry != nullptr) {
    if (!decoded && st.ok()) {
      st = service_->PrepareStaged(tenant_, *entry->request, call_deadline_, cancel_, &step,
                                   &entry->storage, &entry->staged);
    }
    {
      absl::MutexLock lock(&mu_);
      entry->bytes = entry->storage.landed.total_bytes() +
                     (entry->staged.buffer ? entry->staged.buffer->size() : 0);
      inflight_bytes_ += entry->bytes;
    }
    entry->request_id = step.request_id.empty() ? entry->request->request_id() : step.request_id;
    entry->parsed = absl::Now();
    if (!st.ok()) {
      Complete(entry, st);
    } else {
      service_->core()->Submit(std::move(step), [this, entry](const absl::StatusOr<StepResult>& r) {
        Complete(entry, r);
      });
    }
  }
  Actions a;
  {
    absl::MutexLock lock(&mu_);
    a = NextActions();
  }
  Run(a);
}

void StepStreamReactor::Complete(Entry* entry, const absl::StatusOr<StepResult>& result) {
  service_->AnswerStepBytes("StepStream", entry->request_id, entry->start, entry->parsed, result,
                            &entry->storage.outputs, entry->staged, entry->response,
                            &entry->response_bytes);
  Answered(entry);
}

void StepStreamReactor::Pop() {
  inflight_bytes_ -= inflight_.front()->bytes;
  inflight_.pop_front();
}

void StepStreamReactor::Answered(Entry* entry) {
  Actions a;
  {
    absl::MutexLock lock(&mu_);
    entry->done = true;
    --outstanding_;
    a = NextActions();
  }
  Run(a);
}

void StepStreamReactor::AttachRing(Entry* entry) {
  const v1::StepRequest& pb = *entry->request;
  absl::Status st;
  bool already = false;
  {
    absl::MutexLock lock(&mu_);
    already = ring_ != nullptr;
  }
  if (already) {
    st = absl::FailedPreconditionError("ring_attach: this stream already has a ring");
  } else if (pb.spans_size() > 0 || pb.has_packed()) {
    st = absl::InvalidArgumentError("ring_attach: a ring_attach request carries no step");
  } else {
    absl::StatusOr<std::unique_ptr<StepRing>> ring =
        StepRing::Attach(service_, tenant_, call_deadline_, cancel_, pb.ring_attach(), [this] {
          Actions a;
          {
            absl::MutexLock lock(&mu_);
            ring_live_ = false;
            a = NextActions();
          }
          Run(a);
        });
    st = ring.status();
    if (ring.ok()) {
      absl::MutexLock lock(&mu_);
      ring_ = *std::move(ring);
      ring_live_ = true;
    }
  }
  v1::StepResponse& resp = *entry->response;
  resp.set_request_id(pb.request_id());
  const grpc::Status g = service_->Finished("RingAttach", pb.request_id(), st);
  resp.set_code(static_cast<int32_t>(g.error_code()));
  resp.set_message(g.error_message());
  SerializeStepResponse(&resp, StagedOutputs{}, &entry->response_bytes);
  Answered(entry);
}

void StepStreamReactor::OnWriteDone(bool ok) {
  Actions a;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    Pop();
    if (!ok) broken_ = true;
    a = NextActions();
  }
  Run(a);
}

void StepStreamReactor::OnCancel() {
  cancel_->store(true);
  Actions a;
  {
    absl::MutexLock lock(&mu_);
    broken_ = true;
    a = NextActions();
  }
  Run(a);
}

void StepStreamReactor::OnDone() {
  service_->metrics()->StreamClosed();
  service_->streams().Close(tenant_);
  delete this;
}

}  // namespace smla::server::edge
