// `smla demo`: fills caches through steps, runs speculative decode with rollback, and checks
// every output against the client-side reference.
#pragma once

#include <cstdint>
#include <string>

#include "smla/client/client.h"

namespace smla::client {

struct DemoOptions {
  std::string model;  // empty = the server's first model
  int32_t sequences = 2;
  int32_t context = 2048;    // prefill tokens per sequence
  int32_t chunk = 512;       // prefill rows per sequence per step
  int32_t decode_steps = 6;  // rounds of 1 verify + 5 drafts
  bool all_layers = false;   // else one layer of each kind
  uint64_t seed = 1;
};

// Returns 0 when every output matched, 1 on a mismatch, 2 on an error.
int RunDemo(Client& client, const DemoOptions& options);

}  // namespace smla::client
