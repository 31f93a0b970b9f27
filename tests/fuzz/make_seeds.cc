// Writes serialized valid StepRequests for the fuzz world's models into a directory: every
// layer kind, one and several spans, drafts, both output formats, LSE and inverse RoPE; each
// inline and packed in the world's shared-memory region (StepRequest.packed).
#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include "fuzz_world.h"
#include "packed_seed.h"
#include "smla/client/testing/workload.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  smla::fuzz::FuzzWorld& world = smla::fuzz::FuzzWorld::Get();
  std::mt19937_64 rng(1);
  int n = 0, ok = 0;
  for (const smla::v1::ModelInfo& m : world.info().models()) {
    for (int32_t layer = 0; layer < m.layers_size(); ++layer) {
      // One seed per layer kind is enough for the fuzzer to mutate; take the first few layers
      // and every layer whose kind differs from its predecessor.
      if (layer > 2 && m.layers(layer).kind() == m.layers(layer - 1).kind()) continue;
      for (int variant = 0; variant < 3; ++variant) {
        smla::client::StepOptions o;
        o.want_lse = variant != 0;
        o.output_format =
            variant == 2 ? smla::v1::OUTPUT_FORMAT_MXFP8 : smla::v1::OUTPUT_FORMAT_BF16;
        o.inverse_rope = variant == 1 && m.geometry() == "rope_inside";
        std::vector<smla::client::SpanSpec> spans = {{"a", 0, 8 + 8 * variant, variant}};
        if (variant > 0) spans.push_back({"b", 0, 5, 0});
        const smla::v1::StepRequest req = smla::client::MakeStep(m, layer, spans, o, rng);
        // The inline request, and the same step packed in the world's region.
        for (const smla::v1::StepRequest& r : {req, smla::fuzz::PackedSeed(world, req)}) {
          const std::string bytes = r.SerializeAsString();
          const std::string path = dir + "/seed_" + std::to_string(n++);
          std::ofstream(path, std::ios::binary) << bytes;
          if (world.RunOne(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()).ok()) {
            ++ok;
          } else {
            std::fprintf(stderr, "make_seeds: %s fails: %s\n", path.c_str(),
                         world.RunOne(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())
                             .ToString()
                             .c_str());
          }
        }
      }
    }
  }
  std::printf("make_seeds: %d seeds in %s, %d run successfully\n", n, dir.c_str(), ok);
  return ok == n ? 0 : 1;
}
