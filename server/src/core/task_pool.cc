#include "smla/server/task_pool.h"

#include <algorithm>

namespace smla::server {

TaskPool::TaskPool(int workers) {
  threads_.reserve(std::max(workers, 0));
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { Work(); });
}

TaskPool::~TaskPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wake_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
}

int TaskPool::WorkersFor(unsigned cores) {
  if (cores < 8) return 0;
  return static_cast<int>(std::min(cores / 4, 3u));
}

void TaskPool::Run(int n, absl::FunctionRef<void(int)> fn) {
  if (threads_.empty() || n <= 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  absl::MutexLock lock(&mu_);
  fn_ = &fn;
  tasks_ = n;
  next_ = 0;
  finished_ = 0;
  ++run_;
  wake_.SignalAll();
  Drain();
  // The function lives in this frame: no task may be running once Run returns.
  while (finished_ < tasks_) done_.Wait(&mu_);
  fn_ = nullptr;
}

void TaskPool::Drain() {
  while (next_ < tasks_) {
    const int i = next_++;
    const absl::FunctionRef<void(int)> fn = *fn_;
    mu_.Unlock();
    fn(i);
    mu_.Lock();
    if (++finished_ == tasks_) done_.Signal();
  }
}

void TaskPool::Work() {
  absl::MutexLock lock(&mu_);
  uint64_t seen = run_;
  while (true) {
    while (!stop_ && run_ == seen) wake_.Wait(&mu_);
    if (stop_) return;
    seen = run_;
    Drain();
  }
}

}  // namespace smla::server
