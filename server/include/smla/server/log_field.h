// Client-supplied text (request and sequence ids, model and region names, a certificate's
// common name) made safe for a log line or a status message: escaped, so it cannot start a
// line of its own or close a quoted field, and bounded, so a long value costs a short line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace smla::server {

// Bytes of a client string shown by default: the longest id the edge accepts.
inline constexpr size_t kLogFieldBytes = 256;

// `s` with backslash, double quote and every byte outside printable ASCII escaped (\\, \",
// \n, \r, \t, else \xNN), cut to its first `max_bytes` bytes with "...(+N bytes)" naming
// what was left out. The result is printable ASCII of at most 4 * max_bytes bytes plus the
// marker.
std::string LogField(std::string_view s, size_t max_bytes = kLogFieldBytes);

// `s` cut to its first `max_bytes` bytes with the same marker, not escaped (for text that
// goes where it is quoted by its transport, e.g. a gRPC status message).
std::string Bounded(std::string_view s, size_t max_bytes);

}  // namespace smla::server
