// Open file descriptors as a budget: connections and shared-memory regions each hold
// descriptors, and running out of them stops more than the work that took them (gRPC 1.51's
// accept loop ends for good at its first EMFILE; region and metrics calls fail). The defaults
// here leave every other user a reserve.
#pragma once

#include <cstdint>

namespace smla::server::edge {

// Raises the soft RLIMIT_NOFILE to the hard limit (servers that do not use select() have no
// reason to stay under the historical 1024) and returns the soft limit now in force.
int64_t RaiseFdLimit();
// The soft RLIMIT_NOFILE.
int64_t FdLimit();

struct FdBudget {
  int32_t max_connections = 0;  // gRPC connections (two descriptors each: ours and gRPC's)
  int32_t max_regions = 0;      // registered shared-memory regions (one descriptor each)
};

// The defaults under `fd_limit`: past a reserve for the process (the backend, the metrics
// endpoint's connections, logs, gRPC's own), a half of the descriptors for connections and a
// half for regions.
FdBudget DefaultFdBudget(int64_t fd_limit);

}  // namespace smla::server::edge
