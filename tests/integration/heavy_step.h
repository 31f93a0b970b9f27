// A step that keeps the backend busy while a test queues other calls behind it, on any backend:
// the server runs with kHoldBackend, which holds every Attend for a while (a GPU finishes the
// step itself in milliseconds, the CPU backend in about a second).
#pragma once

#include <cstdint>
#include <future>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "harness.h"

namespace smla::testing {

inline constexpr int32_t kHeavyBase = 256;
inline constexpr int32_t kHeavyRows = 1536;
inline const char kHoldBackend[] = "--inject_attend_delay_ms=500";

// Prefills sequence "heavy" with kHeavyBase positions and returns a request that appends
// kHeavyRows more, each choosing up to 2,048 earlier positions.
v1::StepRequest PrepareHeavy(Harness& h);

// Pages in use in the served model's pool.
int64_t PagesUsed(Harness& h);

// Waits (up to 30 s) until a launch has reserved `pages` more pages than `pages_before` (the
// heavy step's by default): the step then runs, and its stored length moves only when it ends.
// Fails the test if that never happens.
void WaitLaunched(Harness& h, int64_t pages_before, int64_t pages = -1);

// Sends `heavy` (with the client call's `timeout`, zero = the client's default) and returns once
// the server has launched it, checking that it has not ended yet.
std::future<absl::StatusOr<v1::StepResponse>> LaunchHeavy(
    Harness& h, const v1::StepRequest& heavy, absl::Duration timeout = absl::ZeroDuration());

}  // namespace smla::testing
