// std::string_view where abseil takes its own string type.
//
// Debian 12's abseil keeps absl::string_view as a class of its own (newer abseil builds alias
// std::string_view), so a std::string_view does not convert where abseil takes one: StrCat,
// StrFormat's %s, StrSplit, SimpleAtoi, EqualsIgnoreCase. Sv converts without a copy; Cat is
// absl::StrCat that also takes std::string_view arguments.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace smla {

inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

namespace strings_internal {
template <typename T>
decltype(auto) CatArg(const T& v) {
  if constexpr (std::is_same_v<T, std::string_view>) {
    return Sv(v);
  } else {
    return (v);
  }
}
}  // namespace strings_internal

template <typename... Args>
std::string Cat(const Args&... args) {
  return absl::StrCat(strings_internal::CatArg(args)...);
}

}  // namespace smla
