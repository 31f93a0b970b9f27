// A small fixed pool of worker threads owned by the CPU backend. ParallelFor hands out
// indices one at a time from a shared counter, so uneven items balance themselves.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace smla::kernels::cpu {

class ThreadPool {
 public:
  // `threads` counts the calling thread: threads - 1 workers are started.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i, worker) for every i in [0, n) and returns when all are done; worker is in
  // [0, size()) and unique among the threads running at one time (for per-thread scratch).
  // Concurrent callers are served one after another.
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int)> fn);

 private:
  void WorkerLoop(int worker);
  void RunItems(int worker);

  absl::Mutex call_mu_;  // serialises ParallelFor callers
  absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // workers still inside the current job
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The current job; written under mu_ before generation_ moves, read by workers after.
  const absl::FunctionRef<void(int64_t, int)>* job_ = nullptr;
  int64_t job_size_ = 0;
  std::atomic<int64_t> next_{0};
  std::vector<std::thread> workers_;
};

}  // namespace smla::kernels::cpu
