#include "smla/server/log_field.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace smla::server {
namespace {

void AppendCut(std::string_view s, size_t max_bytes, std::string* out) {
  if (s.size() > max_bytes) absl::StrAppend(out, "...(+", s.size() - max_bytes, " bytes)");
}

}  // namespace

std::string LogField(std::string_view s, size_t max_bytes) {
  constexpr char kHex[] = "0123456789abcdef";
  const std::string_view shown = s.substr(0, max_bytes);
  std::string out;
  out.reserve(shown.size() + 16);
  for (const char ch : shown) {
    const auto c = static_cast<uint8_t>(ch);
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c >= 0x20 && c < 0x7f) {
          out += ch;
        } else {
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        }
    }
  }
  AppendCut(s, max_bytes, &out);
  return out;
}

std::string Bounded(std::string_view s, size_t max_bytes) {
  std::string out(s.substr(0, max_bytes));
  AppendCut(s, max_bytes, &out);
  return out;
}

}  // namespace smla::server
