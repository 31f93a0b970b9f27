// The CPU backend: the reference implementation of docs/operator.md and the embedded default when
// no GPU is present. Multithreaded over rows and head blocks; every call completes before it
// returns (its streams are trivially ordered).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "smla/kernels/backend.h"

namespace smla::kernels {

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const BackendOptions& options = {});

}  // namespace smla::kernels
