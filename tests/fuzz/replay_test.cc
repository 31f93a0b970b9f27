// Replays the fuzzer's regression inputs (tests/fuzz/regressions: every crash found, kept)
// and freshly generated seeds (inline and packed in a shared-memory region) through the same
// path as the fuzzer, under the normal build.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "fuzz_world.h"
#include "gtest/gtest.h"
#include "packed_seed.h"
#include "smla/client/testing/workload.h"

namespace smla::fuzz {
namespace {

TEST(FuzzReplayTest, RegressionInputs) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(SMLA_FUZZ_REGRESSIONS)) {
    if (!e.is_regular_file() || e.path().filename() == "README.md") continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string bytes = ss.str();
    FuzzWorld::Get()
        .RunOne(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())
        .IgnoreError();  // a crash fails the test; any status is an answer
    ++n;
  }
  std::printf("replayed %d regression inputs\n", n);
}

TEST(FuzzReplayTest, ValidSeedsRunAndMutantsAreAnswered) {
  FuzzWorld& w = FuzzWorld::Get();
  std::mt19937_64 rng(3);
  for (const v1::ModelInfo& m : w.info().models()) {
    for (int32_t layer :
         std::set<int32_t>{0, std::min(2, m.layers_size() - 1), m.layers_size() - 1}) {
      const v1::StepRequest req =
          client::MakeStep(m, layer, {{"a", 0, 16, 4}, {"b", 0, 5, 0}}, {}, rng);
      // Inline, and packed in the world's region (StepRequest.packed).
      for (const v1::StepRequest& r : {req, PackedSeed(w, req)}) {
        std::string bytes = r.SerializeAsString();
        absl::Status st = w.RunOne(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
        EXPECT_TRUE(st.ok()) << m.profile() << " layer " << layer
                             << (r.has_packed() ? " packed: " : ": ") << st;
        // Byte flips: every one is answered (no crash); most are errors.
        for (int i = 0; i < 200; ++i) {
          std::string mutant = bytes;
          char& c = mutant[rng() % mutant.size()];
          c = static_cast<char>(c ^ (1 + rng() % 255));
          w.RunOne(reinterpret_cast<const uint8_t*>(mutant.data()), mutant.size()).IgnoreError();
        }
      }
    }
  }
}

}  // namespace
}  // namespace smla::fuzz
