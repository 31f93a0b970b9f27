#include "call_counter.h"

namespace smla::server::edge {

class CountingInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit CountingInterceptor(CallCounter* counter) : counter_(counter) {
    counter_->open_.fetch_add(1, std::memory_order_acq_rel);
  }
  ~CountingInterceptor() override { counter_->open_.fetch_sub(1, std::memory_order_acq_rel); }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  CallCounter* const counter_;
};

namespace {

class CountingFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CountingFactory(CallCounter* counter) : counter_(counter) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo*) override {
    return new CountingInterceptor(counter_);
  }

 private:
  CallCounter* const counter_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> CallCounter::Factory() {
  return std::make_unique<CountingFactory>(this);
}

}  // namespace smla::server::edge
