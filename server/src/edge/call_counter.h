// Counts the gRPC calls in flight, every method (health and reflection too), so shutdown can
// tell when the last has finished: a call counts from its start until gRPC destroys it, after
// its final status has been handed to the transport.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "grpcpp/support/server_interceptor.h"

namespace smla::server::edge {

class CallCounter {
 public:
  int64_t open() const { return open_.load(std::memory_order_acquire); }
  // An interceptor factory that counts the calls through this counter, which must outlive the
  // server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> Factory();

 private:
  friend class CountingInterceptor;
  std::atomic<int64_t> open_{0};
};

}  // namespace smla::server::edge
