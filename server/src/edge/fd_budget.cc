#include "fd_budget.h"

#include <sys/resource.h>

#include <algorithm>
#include <limits>

namespace smla::server::edge {
namespace {

// The metrics endpoint holds up to 128 connections (its workers and those waiting for one);
// the rest covers the backend, logs, gRPC's epoll and wake-up descriptors and a margin.
constexpr int64_t kFixedReserve = 128 + 64;

int32_t ToInt32(int64_t v) {
  return static_cast<int32_t>(std::clamp<int64_t>(v, 1, std::numeric_limits<int32_t>::max()));
}

}  // namespace

int64_t RaiseFdLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return FdLimit();
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);  // on failure the old limit stays, and is reported
  }
  return FdLimit();
}

int64_t FdLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) {
    return std::numeric_limits<int32_t>::max();
  }
  return static_cast<int64_t>(r.rlim_cur);
}

FdBudget DefaultFdBudget(int64_t fd_limit) {
  const int64_t usable = fd_limit - kFixedReserve - fd_limit / 16;
  FdBudget b;
  b.max_connections = ToInt32(usable / 4);
  b.max_regions = ToInt32(usable / 2);
  return b;
}

}  // namespace smla::server::edge
