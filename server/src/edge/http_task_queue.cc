#include "http_task_queue.h"

#include <utility>

namespace smla::server::edge {

BoundedTaskQueue::BoundedTaskQueue(int workers, int max_waiting)
    : max_waiting_(static_cast<size_t>(max_waiting)) {
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { Work(); });
}

BoundedTaskQueue::~BoundedTaskQueue() { shutdown(); }

void BoundedTaskQueue::enqueue(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](BoundedTaskQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) {
        return q->shutdown_ || q->waiting_.size() < q->max_waiting_;
      },
      this));
  waiting_.push_back(std::move(fn));
}

void BoundedTaskQueue::shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void BoundedTaskQueue::Work() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](BoundedTaskQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) {
            return q->shutdown_ || !q->waiting_.empty();
          },
          this));
      if (waiting_.empty()) return;  // shut down and nothing left
      fn = std::move(waiting_.front());
      waiting_.pop_front();
    }
    fn();  // serves the connection, then closes it
  }
}

}  // namespace smla::server::edge
