// Reads a serialized smla.v1.StepRequest of the packed form (StepRequest.packed: the form a
// step ring carries) straight into a StepView, without building a protobuf message, which is
// most of what reading such a request costs (docs/architecture.md, "Reading a packed request";
// the times in docs/performance.md, "The host's share of a launch"). Its strings are views
// into the wire bytes.
//
// It reads only what that form holds: the request's scalars and strings, its spans' ids,
// positions, rows and roles, the packed inputs and the output regions. On anything else it
// declines and the caller reads the request with protobuf: any other field (a span's tensors,
// ring_attach, a field this build does not know), a wrong wire type, a singular message that
// occurs twice (protobuf merges those), a string with a byte above 0x7F (protobuf checks
// UTF-8), a request without `packed`, and bytes protobuf would refuse. It also declines a
// string longer than any id the server accepts (kMaxIdBytes) and more than kMaxDecodedSpans
// spans, so that the view a ring keeps for its next request, and the output region names a
// slot keeps for its answer, stay small whatever a client writes. So what it accepts reads
// exactly as protobuf reads it: a scalar or string that occurs twice keeps its last value,
// spans and roles append, roles come packed or one by one. It checks nothing of what the
// values mean: that is ParseStepView's (wire.h), whose errors the protobuf path words.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "step_view.h"

namespace smla::server::edge {

inline constexpr size_t kMaxDecodedSpans = 1024;

// True when `wire` was read into `out`; false when the caller must parse it with protobuf
// (`out` then holds nothing of use).
bool DecodePackedStep(std::span<const uint8_t> wire, StepView* out);

}  // namespace smla::server::edge
