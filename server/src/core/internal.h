// Small helpers private to the service core: invariant checks; status propagation and message
// formatting (Cat, Sv) come from smla::base.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "smla/base/status_macros.h"  // SMLA_RETURN_IF_ERROR, SMLA_ASSIGN_OR_RETURN
#include "smla/base/strings.h"        // Cat, Sv

// Invariants (not input checks): a failure is a bug, so the process stops with the location.
#define SMLA_CHECK(cond, msg)                                                                 \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond, msg); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)
