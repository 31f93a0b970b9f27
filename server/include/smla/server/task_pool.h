// A few worker threads that run the parts of one piece of host work beside the caller (the
// executor splits a batch's top-k translation across them). Run() hands out tasks 0..n-1 to the
// caller and the workers, and returns once every task has finished; one Run at a time (the
// executor's thread). Workers sleep between runs, so a run pays a wake-up per worker.
#pragma once

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace smla::server {

class TaskPool {
 public:
  explicit TaskPool(int workers);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Workers for a machine of `cores` hardware threads: a quarter of them, at most 3, none on
  // machines of fewer than 8 (the executor thread shares them with the edge's threads).
  static int WorkersFor(unsigned cores);

  int workers() const { return static_cast<int>(threads_.size()); }

  // Calls fn(i) for i in [0, n), each once, on the caller and the workers.
  void Run(int n, absl::FunctionRef<void(int)> fn);

 private:
  void Work();
  // Takes and runs tasks of the current run until none is left. Requires mu_ held; releases it
  // while a task runs.
  void Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  // The current run's function; null between runs.
  const absl::FunctionRef<void(int)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int tasks_ ABSL_GUARDED_BY(mu_) = 0;     // of the current run
  int next_ ABSL_GUARDED_BY(mu_) = 0;      // next task to hand out
  int finished_ ABSL_GUARDED_BY(mu_) = 0;  // tasks done
  uint64_t run_ ABSL_GUARDED_BY(mu_) = 0;  // counts runs, so a worker wakes once per run
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar wake_;  // a run began, or stop_
  absl::CondVar done_;  // the last task of a run finished
  std::vector<std::thread> threads_;
};

}  // namespace smla::server
