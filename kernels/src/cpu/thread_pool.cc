#include "cpu/thread_pool.h"

#include <algorithm>

namespace smla::kernels::cpu {

ThreadPool::ThreadPool(int threads) {
  const int workers = std::max(threads, 1) - 1;
  workers_.reserve(workers);
  for (int w = 0; w < workers; ++w) workers_.emplace_back([this, w] { WorkerLoop(w + 1); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunItems(int worker) {
  for (;;) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= job_size_) return;
    (*job_)(i, worker);
  }
}

void ThreadPool::WorkerLoop(int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      struct Wake {
        ThreadPool* pool;
        uint64_t seen;
      } wake{this, seen};
      mu_.Await(absl::Condition(
          +[](Wake* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->pool->mu_) {
            return w->pool->stop_ || w->pool->generation_ != w->seen;
          },
          &wake));
      if (stop_) return;
      seen = generation_;
    }
    RunItems(worker);
    absl::MutexLock lock(&mu_);
    --pending_;
  }
}

void ThreadPool::ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int)> fn) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty()) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  absl::MutexLock call_lock(&call_mu_);
  {
    absl::MutexLock lock(&mu_);
    job_ = &fn;
    job_size_ = n;
    next_.store(0, std::memory_order_relaxed);
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  RunItems(0);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
  job_ = nullptr;
}

}  // namespace smla::kernels::cpu
