// Small helpers private to the service core: invariant checks and message formatting (status
// propagation comes from smla/base/status_macros.h).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "smla/base/status_macros.h"  // SMLA_RETURN_IF_ERROR, SMLA_ASSIGN_OR_RETURN

// Invariants (not input checks): a failure is a bug, so the process stops with the location.
#define SMLA_CHECK(cond, msg)                                                                 \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond, msg); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

namespace smla::server {

// Debian's abseil keeps its own string_view type, so std::string_view arguments are converted
// before they reach absl::StrCat.
template <typename T>
decltype(auto) CatArg(const T& v) {
  if constexpr (std::is_same_v<T, std::string_view>) {
    return absl::string_view(v.data(), v.size());
  } else {
    return (v);
  }
}

template <typename... Args>
std::string Cat(const Args&... args) {
  return absl::StrCat(CatArg(args)...);
}

inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace smla::server
