#include "smla/models/grid.h"

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace smla::models {
namespace {

using kernels::KvFormat;
using ::testing::HasSubstr;

TEST(GridTest, ParsesAFullCellName) {
  absl::StatusOr<Cell> c = ParseCell("dsv4.1-flash fp8_dsv4 TP4 decode C=32 128K");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model, FindProfile("dsv4.1-flash"));
  EXPECT_EQ(c->format, KvFormat::kFp8Dsv4);
  EXPECT_EQ(c->tp, 4);
  EXPECT_EQ(c->heads(), 16);
  EXPECT_EQ(c->shape, Shape::kDecode);
  EXPECT_EQ(c->requests, 32);
  EXPECT_EQ(c->rows_per_request(), 6);
  EXPECT_EQ(c->rows(), 192);
  EXPECT_EQ(c->context, 131072);
  EXPECT_EQ(c->Name(), "dsv4.1-flash fp8_dsv4 TP4 decode C=32 128K");
}

TEST(GridTest, PartsComeInAnyOrderAndDefault) {
  absl::StatusOr<Cell> c = ParseCell("glm-5.3-flash 256K prefill 16K TP8");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shape, Shape::kPrefill);
  EXPECT_EQ(c->prefill_rows, 16384);
  EXPECT_EQ(c->rows(), 16384);
  EXPECT_EQ(c->sequences(), 1);
  EXPECT_EQ(c->context, 262144);
  EXPECT_FALSE(c->format.has_value());
  EXPECT_EQ(c->Name(), "glm-5.3-flash TP8 prefill 16K 256K");

  absl::StatusOr<Cell> d = ParseCell("dsv4-flash decode1 C=8");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->tp, 0);
  EXPECT_EQ(d->rows(), 8);
  EXPECT_EQ(d->drafts(), 0);
  EXPECT_EQ(d->Name(), "dsv4-flash decode1 C=8 128K");
  // A context that is not a multiple of 1024 is named by its number.
  d->context = 100;
  EXPECT_EQ(d->Name(), "dsv4-flash decode1 C=8 100");
}

TEST(GridTest, RejectsWhatItDoesNotKnow) {
  EXPECT_THAT(ParseCell("llama decode").status().message(), HasSubstr("unknown model 'llama'"));
  EXPECT_THAT(ParseCell("dsv4-flash TPx").status().message(), HasSubstr("bad TP 'TPx'"));
  EXPECT_THAT(ParseCell("dsv4-flash C=0").status().message(), HasSubstr("bad 'C=0'"));
  EXPECT_THAT(ParseCell("dsv4-flash fp9").status().message(), HasSubstr("unknown part 'fp9'"));
  EXPECT_FALSE(ParseCell("  ").ok());
}

TEST(GridTest, EveryGridCellParsesBackFromItsName) {
  const std::vector<Cell> cells = GridCells();
  // dsv4.1-flash in two formats, three more models in one: 5 x 2 contexts x 4 TPs x 11 shapes.
  EXPECT_EQ(cells.size(), 5u * 2 * 4 * 11);
  std::set<std::string> names;
  for (const Cell& c : cells) {
    EXPECT_TRUE(names.insert(c.Name()).second) << c.Name();
    absl::StatusOr<Cell> back = ParseCell(c.Name());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->Name(), c.Name());
    EXPECT_EQ(back->rows(), c.rows());
    EXPECT_EQ(back->heads(), c.heads());
  }
  EXPECT_EQ(cells.front().Name(), "dsv4.1-flash fp8_dsv4 TP8 decode C=1 128K");
}

TEST(GridTest, FiltersNarrowTheGrid) {
  GridFilter f;
  f.models = {"glm-5.3-flash"};
  f.shapes = {"decode C=32", "prefill"};
  f.tps = {4};
  f.contexts = {"128K"};
  std::vector<std::string> names;
  for (const Cell& c : GridCells(f)) names.push_back(c.Name());
  EXPECT_THAT(names, ::testing::ElementsAre("glm-5.3-flash fp8_per_tensor TP4 decode C=32 128K",
                                            "glm-5.3-flash fp8_per_tensor TP4 prefill 8K 128K",
                                            "glm-5.3-flash fp8_per_tensor TP4 prefill 16K 128K"));
  f = {};
  f.formats = {"bf16"};
  for (const Cell& c : GridCells(f)) EXPECT_EQ(c.model->name, "dsv4.1-flash");
}

TEST(GridTest, BarCells) {
  std::vector<std::string> bar;
  for (const Cell& c : GridCells()) {
    if (IsBarCell(c)) bar.push_back(c.Name());
  }
  EXPECT_THAT(bar,
              ::testing::UnorderedElementsAre("dsv4.1-flash fp8_dsv4 TP4 decode C=32 128K",
                                              "dsv4.1-flash fp8_dsv4 TP4 decode C=64 128K",
                                              "dsv4.1-flash fp8_dsv4 TP2 decode C=32 128K",
                                              "dsv4.1-flash fp8_dsv4 TP2 decode C=64 128K",
                                              "glm-5.3-flash fp8_per_tensor TP4 decode C=32 128K"));
}

TEST(GridTest, LayerLabels) {
  EXPECT_EQ(LayerLabel(FindProfile("dsv4.1-flash")->most_common_layer()), "c1");
  EXPECT_EQ(LayerLabel(FindProfile("dsv4-flash")->most_common_layer()), "c4");
  EXPECT_EQ(LayerLabel(FindProfile("glm-5.2")->most_common_layer()), "glm");
  EXPECT_EQ(LayerLabel(FindProfile("dsv4-flash")->layers[0]), "swa");
}

}  // namespace
}  // namespace smla::models
