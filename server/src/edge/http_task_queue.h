// The metrics endpoint's connection workers. cpp-httplib serves each connection on one worker
// for the connection's whole life (keep-alive included), so idle connections hold workers: the
// queue gives it enough workers that a few dozen idle connections leave scrapes a free one, and
// bounds the connections waiting for a worker (the accept loop pauses past the bound, leaving
// further connections in the kernel's backlog, where they hold no descriptor).
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "httplib.h"

namespace smla::server::edge {

class BoundedTaskQueue final : public httplib::TaskQueue {
 public:
  BoundedTaskQueue(int workers, int max_waiting);
  ~BoundedTaskQueue() override;

  // Blocks while `max_waiting` tasks wait for a worker.
  void enqueue(std::function<void()> fn) override;
  // Runs what waits, then joins the workers.
  void shutdown() override;

 private:
  void Work();

  const size_t max_waiting_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> waiting_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace smla::server::edge
