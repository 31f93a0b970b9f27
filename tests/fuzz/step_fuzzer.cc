// libFuzzer entry: raw bytes through StepRequest parsing, the edge's wire checks, the core's
// validation and execution on the CPU backend. Any crash, sanitizer report or abort is a bug;
// error statuses are the expected answer to most inputs.
#include <cstddef>
#include <cstdint>

#include "fuzz_world.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  smla::fuzz::FuzzWorld::Get().RunOne(data, size).IgnoreError();
  return 0;
}
