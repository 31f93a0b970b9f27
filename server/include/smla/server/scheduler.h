// The scheduler/batcher: one bounded queue per (model, layer) and one executor thread (one
// backend stream). While a batch runs, new steps accumulate; when the executor is free it
// takes the queue whose oldest step waited longest and launches, as one batch, the longest
// prefix of that queue that fits Limits::max_batch_rows / max_batch_bytes, shares one output
// format and inverse-RoPE choice, and names each (tenant, sequence) at most once (steps of one
// sequence on one layer apply in queue order, one per launch). A batch always takes at least
// one step, so a step larger than the batch limits runs alone.
//
// Waking: after each batch the executor spins (no lock held, a CPU pause between checks) for up
// to Limits::scheduler_spin, watching an atomic mirror of the queued count, before it parks on
// the mutex; a step submitted meanwhile is taken without a thread wake-up (in a closed loop
// the next step arrives shortly after the previous one's answer). The park is the fallback
// and correctness never depends on the spin; an idle scheduler parks and uses no CPU; 0
// parks at once.
//
// Ownership: the scheduler owns queued steps (and the caller-borrowed tensors they point to
// stay alive until their callback runs). Each admitted step's callback runs exactly once, on
// the executor thread: with the runner's result, or CANCELLED / DEADLINE_EXCEEDED when the
// step was cancelled or expired while queued (it then changes nothing).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "smla/server/config.h"
#include "smla/server/service_core.h"
#include "smla/server/step.h"

namespace smla::server {

// Runs one launch of steps of a single (model, layer). Returns one result per step, in order;
// a result's timings.kernel is the runner's to set, the scheduler fills the rest.
class BatchRunner {
 public:
  virtual ~BatchRunner() = default;
  virtual std::vector<absl::StatusOr<StepResult>> RunBatch(
      std::span<const StepRequest* const> steps) = 0;
};

class Scheduler {
 public:
  Scheduler(const Limits& limits, BatchRunner& runner);
  // Drains, then stops the executor thread.
  ~Scheduler();

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Admission: UNAVAILABLE while draining; RESOURCE_EXHAUSTED when the step's (model, layer)
  // queue already holds max_queued_requests steps or the step's rows would take it past
  // max_queued_rows. On an error `done` is not called (the caller reports the error).
  // `rows` and `bytes` are the step's size (StepRows, StepBytes). Both arguments are moved
  // from only when the step is admitted.
  absl::Status Submit(StepRequest&& request, StepCallback&& done, int64_t rows, int64_t bytes);

  // Stops admitting, waits until every queued step has finished. Idempotent.
  void Drain();
  bool draining() const;

  CoreStats Stats() const;

 private:
  struct Queued {
    StepRequest request;
    StepCallback done;
    int64_t rows = 0;
    int64_t bytes = 0;
    absl::Time admitted;
  };
  struct Queue {
    std::vector<std::unique_ptr<Queued>> steps;  // FIFO; front is steps[0]
    int64_t rows = 0;
  };
  using QueueKey = std::pair<int32_t, int32_t>;  // (StepRequest::model_index, layer)

  void Loop();
  // Spins up to limits_.scheduler_spin until a step is queued or the scheduler stops.
  void SpinForWork() const;
  // Removes cancelled and expired steps of every queue into `dropped`.
  void SweepLocked(absl::Time now,
                   std::vector<std::pair<std::unique_ptr<Queued>, absl::Status>>& dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Queue* OldestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::unique_ptr<Queued>> TakeBatchLocked(Queue& queue)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Limits limits_;
  BatchRunner& runner_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<QueueKey, std::unique_ptr<Queue>> queues_ ABSL_GUARDED_BY(mu_);
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  // Mirrors of queued_ and stop_, stored under mu_ whenever those change and read without it
  // by SpinForWork.
  std::atomic<int64_t> queued_hint_{0};
  std::atomic<bool> stop_hint_{false};
  bool running_batch_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  CoreStats stats_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;
};

}  // namespace smla::server
