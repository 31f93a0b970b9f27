#include "smla/server/scheduler.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "internal.h"
#include "smla/v1/cpu_relax.h"

namespace smla::server {
namespace {

bool IsCancelled(const StepRequest& r) {
  return r.cancelled != nullptr && r.cancelled->load(std::memory_order_relaxed);
}

}  // namespace

Scheduler::Scheduler(const Limits& limits, BatchRunner& runner) : limits_(limits), runner_(runner) {
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() {
  Drain();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    stop_hint_.store(true, std::memory_order_release);
  }
  thread_.join();
}

absl::Status Scheduler::Submit(StepRequest&& request, StepCallback&& done, int64_t rows,
                               int64_t bytes) {
  if (IsCancelled(request)) return absl::CancelledError("step cancelled before admission");
  const absl::Time now = absl::Now();
  if (request.deadline <= now) {
    return absl::DeadlineExceededError("deadline passed before admission");
  }
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("server is draining: no new steps are admitted");
  std::unique_ptr<Queue>& slot = queues_[QueueKey(request.model_index, request.layer)];
  if (slot == nullptr) slot = std::make_unique<Queue>();
  Queue& q = *slot;
  if (static_cast<int64_t>(q.steps.size()) >= limits_.max_queued_requests) {
    return absl::ResourceExhaustedError(Cat("queue of ", request.model, " layer ", request.layer,
                                            " is full (", limits_.max_queued_requests,
                                            " steps queued)"));
  }
  if (q.rows + rows > limits_.max_queued_rows) {
    return absl::ResourceExhaustedError(Cat("queue of ", request.model, " layer ", request.layer,
                                            " is full (", q.rows, " rows queued, the step adds ",
                                            rows, ", at most ", limits_.max_queued_rows, ")"));
  }
  auto item = std::make_unique<Queued>();
  item->request = std::move(request);
  item->done = std::move(done);
  item->rows = rows;
  item->bytes = bytes;
  item->admitted = now;
  q.steps.push_back(std::move(item));
  q.rows += rows;
  ++queued_;
  queued_hint_.store(queued_, std::memory_order_release);
  return absl::OkStatus();
}

void Scheduler::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  mu_.Await(absl::Condition(
      +[](Scheduler* s)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->queued_ == 0 && !s->running_batch_; },
      this));
}

bool Scheduler::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

CoreStats Scheduler::Stats() const {
  absl::MutexLock lock(&mu_);
  CoreStats s = stats_;
  s.queue_depth = queued_;
  return s;
}

bool Scheduler::HasWorkLocked() const { return queued_ > 0; }

void Scheduler::SweepLocked(
    absl::Time now, std::vector<std::pair<std::unique_ptr<Queued>, absl::Status>>& dropped) {
  for (auto& [key, queue] : queues_) {
    auto& steps = queue->steps;
    size_t kept = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      const StepRequest& r = steps[i]->request;
      absl::Status why;
      if (IsCancelled(r)) {
        why = absl::CancelledError("step cancelled while queued; nothing was written");
      } else if (r.deadline <= now) {
        why = absl::DeadlineExceededError(Cat("deadline passed after ",
                                              absl::FormatDuration(now - steps[i]->admitted),
                                              " in the queue; nothing was written"));
      }
      if (why.ok()) {
        steps[kept++] = std::move(steps[i]);
      } else {
        queue->rows -= steps[i]->rows;
        --queued_;
        dropped.emplace_back(std::move(steps[i]), std::move(why));
      }
    }
    steps.resize(kept);
  }
  queued_hint_.store(queued_, std::memory_order_release);
}

Scheduler::Queue* Scheduler::OldestLocked() {
  Queue* best = nullptr;
  for (auto& [key, queue] : queues_) {
    if (queue->steps.empty()) continue;
    if (best == nullptr || queue->steps[0]->admitted < best->steps[0]->admitted) {
      best = queue.get();
    }
  }
  return best;
}

std::vector<std::unique_ptr<Scheduler::Queued>> Scheduler::TakeBatchLocked(Queue& queue) {
  auto& steps = queue.steps;
  const StepRequest& head = steps[0]->request;
  // The (tenant, sequence) of every span taken, built only once a second step is considered: a
  // step alone in its queue (a closed loop) is taken without it.
  absl::flat_hash_set<std::pair<std::string_view, std::string_view>> sequences;
  auto take_sequences = [&sequences](const StepRequest& r) {
    for (const SpanInput& span : r.spans) sequences.insert({r.tenant, span.sequence_id});
  };
  int64_t rows = 0, bytes = 0;
  size_t n = 0;
  for (; n < steps.size(); ++n) {
    const Queued& s = *steps[n];
    const StepRequest& r = s.request;
    if (n > 0) {
      if (r.output_format != head.output_format || r.inverse_rope != head.inverse_rope ||
          r.q_format != head.q_format) {
        break;
      }
      if (rows + s.rows > limits_.max_batch_rows || bytes + s.bytes > limits_.max_batch_bytes) {
        break;
      }
      if (n == 1) take_sequences(head);
      bool repeats = false;
      for (const SpanInput& span : r.spans) {
        repeats = repeats || sequences.contains({r.tenant, span.sequence_id});
      }
      if (repeats) break;
      take_sequences(r);
    }
    rows += s.rows;
    bytes += s.bytes;
  }
  std::vector<std::unique_ptr<Queued>> batch;
  batch.reserve(n);
  for (size_t i = 0; i < n; ++i) batch.push_back(std::move(steps[i]));
  steps.erase(steps.begin(), steps.begin() + n);
  queue.rows -= rows;
  queued_ -= static_cast<int64_t>(n);
  queued_hint_.store(queued_, std::memory_order_release);
  return batch;
}

void Scheduler::SpinForWork() const {
  if (limits_.scheduler_spin <= absl::ZeroDuration()) return;
  const absl::Time until = absl::Now() + limits_.scheduler_spin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (queued_hint_.load(std::memory_order_acquire) > 0 ||
          stop_hint_.load(std::memory_order_acquire)) {
        return;
      }
      v1::CpuRelax();
    }
    if (absl::Now() >= until) return;
  }
}

void Scheduler::Loop() {
  for (;;) {
    std::vector<std::pair<std::unique_ptr<Queued>, absl::Status>> dropped;
    std::vector<std::unique_ptr<Queued>> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Scheduler* s)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->queued_ > 0 || s->stop_; },
          this));
      if (queued_ == 0 && stop_) return;
      SweepLocked(absl::Now(), dropped);
      Queue* queue = OldestLocked();
      if (queue != nullptr && limits_.batch_wait > absl::ZeroDuration()) {
        // Give more steps a moment to join, unless the batch is already full.
        const absl::Time until = queue->steps[0]->admitted + limits_.batch_wait;
        struct Ready {
          Scheduler* s;
          Queue* q;
        } ready{this, queue};
        mu_.AwaitWithDeadline(absl::Condition(
                                  +[](Ready* r) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                    return r->q->rows >= r->s->limits_.max_batch_rows ||
                                           r->s->draining_ || r->s->stop_;
                                  },
                                  &ready),
                              until);
        SweepLocked(absl::Now(), dropped);
        queue = OldestLocked();
      }
      if (queue != nullptr) batch = TakeBatchLocked(*queue);
      running_batch_ = !batch.empty() || !dropped.empty();
    }
    for (auto& [step, why] : dropped) step->done(std::move(why));
    if (!batch.empty()) {
      std::vector<const StepRequest*> requests;
      int64_t rows = 0;
      for (const auto& s : batch) {
        requests.push_back(&s->request);
        rows += s->rows;
      }
      const absl::Time launch = absl::Now();
      std::vector<absl::StatusOr<StepResult>> results = runner_.RunBatch(requests);
      const absl::Duration batch_time = absl::Now() - launch;
      {
        absl::MutexLock lock(&mu_);
        ++stats_.batches;
        stats_.batched_requests += static_cast<int64_t>(batch.size());
        stats_.rows += rows;
      }
      for (size_t i = 0; i < batch.size(); ++i) {
        absl::StatusOr<StepResult>& result = results[i];
        if (result.ok()) {
          result->timings.queued = launch - batch[i]->admitted;
          result->timings.batch = batch_time;
          result->timings.admitted = batch[i]->admitted;
          result->timings.batch_requests = static_cast<int32_t>(batch.size());
          result->timings.batch_rows = static_cast<int32_t>(rows);
        }
        batch[i]->done(std::move(result));
      }
    }
    {
      absl::MutexLock lock(&mu_);
      running_batch_ = false;
    }
    // Every pass past the Await ran a batch or dropped steps: right after work, wait for the
    // next step spinning rather than parked (a closed-loop client sends it right after its
    // answer), so it needs no thread wake-up. The Await above stays the fallback.
    SpinForWork();
  }
}

}  // namespace smla::server
