#include "smla/models/profile.h"

#include <cmath>

#include "gtest/gtest.h"

namespace smla::models {
namespace {

using kernels::Geometry;
using kernels::KvFormat;

int CountKind(const ModelProfile& p, LayerKind kind, int ratio) {
  int n = 0;
  for (const LayerSpec& l : p.layers) n += (l.kind == kind && l.ratio == ratio) ? 1 : 0;
  return n;
}

TEST(ProfileTest, Dsv4FlashLayersFollowTheCheckpoint) {
  const ModelProfile* p = FindProfile("dsv4-flash");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->num_layers(), 43);
  EXPECT_EQ(CountKind(*p, LayerKind::kSwaOnly, 0), 2);
  EXPECT_EQ(CountKind(*p, LayerKind::kSwaTopK, 4), 21);
  EXPECT_EQ(CountKind(*p, LayerKind::kSwaDense, 128), 20);
  EXPECT_EQ(p->layers[2].kind, LayerKind::kSwaTopK);
  EXPECT_EQ(p->layers[3].kind, LayerKind::kSwaDense);
  EXPECT_EQ(p->layers[42].kind, LayerKind::kSwaTopK);
  EXPECT_EQ(p->layers[2].topk, 512);
  EXPECT_EQ(p->geometry, Geometry::kRopeInside);
  EXPECT_EQ(p->default_format, KvFormat::kFp8Dsv4);
  EXPECT_TRUE(p->has_sink);
  EXPECT_EQ(p->swa_window, 128);
  EXPECT_FLOAT_EQ(p->softmax_scale, 1.0f / std::sqrt(512.0f));
}

TEST(ProfileTest, Dsv41Flash) {
  const ModelProfile* p = FindProfile("dsv4.1-flash");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->num_layers(), 40);
  EXPECT_EQ(CountKind(*p, LayerKind::kSwaOnly, 0), 2);
  EXPECT_EQ(CountKind(*p, LayerKind::kSwaTopK, 2), 18);
  EXPECT_EQ(CountKind(*p, LayerKind::kSwaTopK, 1), 20);
  EXPECT_TRUE(p->has_sink);
}

TEST(ProfileTest, GlmProfiles) {
  const ModelProfile* g52 = FindProfile("glm-5.2");
  ASSERT_NE(g52, nullptr);
  EXPECT_EQ(g52->num_layers(), 78);
  EXPECT_EQ(CountKind(*g52, LayerKind::kChosen, 0), 78);
  EXPECT_EQ(g52->layers[0].topk, 2048);
  EXPECT_EQ(g52->geometry, Geometry::kRopeAppended);
  EXPECT_EQ(g52->default_format, KvFormat::kFp8PerTensor);
  EXPECT_FALSE(g52->has_sink);
  EXPECT_FLOAT_EQ(g52->softmax_scale, 1.0f / std::sqrt(192.0f));
  const ModelProfile* g53 = FindProfile("glm-5.3-flash");
  ASSERT_NE(g53, nullptr);
  EXPECT_EQ(g53->num_layers(), 1);
  EXPECT_EQ(g53->geometry, Geometry::kRopeFree);
  EXPECT_FALSE(g53->has_sink);
  EXPECT_EQ(FindProfile("llama"), nullptr);
  EXPECT_EQ(AllProfiles().size(), 4u);
}

TEST(ProfileTest, MostCommonLayerIsWhatALayerBenchmarkTimes) {
  // dsv4-flash: 21 c4 layers against 20 c128; dsv4.1-flash: 20 c1 against 18 c2.
  EXPECT_EQ(FindProfile("dsv4-flash")->most_common_layer(),
            (LayerSpec{LayerKind::kSwaTopK, 4, 512}));
  EXPECT_EQ(FindProfile("dsv4.1-flash")->most_common_layer(),
            (LayerSpec{LayerKind::kSwaTopK, 1, 512}));
  EXPECT_EQ(FindProfile("glm-5.2")->most_common_layer().kind, LayerKind::kChosen);
}

TEST(ProfileTest, NamesListEveryProfile) {
  EXPECT_EQ(ProfileNames(), "dsv4-flash, dsv4.1-flash, glm-5.2, glm-5.3-flash");
}

}  // namespace
}  // namespace smla::models
