#include "smla/server/model_profile.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace smla::server {
namespace {

using kernels::Geometry;
using kernels::KvFormat;
using ::testing::HasSubstr;

TEST(ModelProfileTest, ParseFullSpec) {
  absl::StatusOr<ModelConfig> c =
      ParseModelConfig("dsv4.1-flash:tp=4:kv=fp8_dsv4:page_rows=64:pool=4GiB");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->profile, "dsv4.1-flash");
  EXPECT_EQ(c->tp, 4);
  EXPECT_EQ(c->heads_per_rank, 16);
  EXPECT_EQ(c->kv_format, KvFormat::kFp8Dsv4);
  EXPECT_EQ(c->page_rows, 64);
  const int64_t page = kernels::ServingPitch(KvFormat::kFp8Dsv4, Geometry::kRopeInside, 64);
  EXPECT_EQ(c->pool_pages, (int64_t{4} << 30) / page);
  EXPECT_EQ(c->pool_bytes, c->pool_pages * page);
  EXPECT_FLOAT_EQ(c->softmax_scale, 1.0f / std::sqrt(512.0f));
}

TEST(ModelProfileTest, ParseDefaultsAndOverrides) {
  absl::StatusOr<ModelConfig> c =
      ParseModelConfig("glm-5.2:tp=8:pool_pages=10:kv_scale=0.5:softmax_scale=0.1352");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kv_format, KvFormat::kFp8PerTensor);  // the profile's default
  EXPECT_EQ(c->heads_per_rank, 8);
  EXPECT_EQ(c->pool_pages, 10);
  EXPECT_EQ(c->pool_bytes,
            10 * kernels::ServingPitch(KvFormat::kFp8PerTensor, Geometry::kRopeAppended, 64));
  EXPECT_FLOAT_EQ(c->kv_scale, 0.5f);
  EXPECT_FLOAT_EQ(c->softmax_scale, 0.1352f);
  absl::StatusOr<ModelConfig> bf16 = ParseModelConfig("dsv4.1-flash:kv=bf16:pool=1MiB");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->kv_format, KvFormat::kBf16);
}

TEST(ModelProfileTest, ParseRejectsBadSpecs) {
  struct Case {
    const char* spec;
    const char* message;
  } cases[] = {
      {"gpt-9:pool=1GiB", "unknown model profile 'gpt-9'"},
      {"dsv4-flash:tp=3:pool=1GiB", "tp must be 1, 2, 4 or 8 (got 3)"},
      {"dsv4-flash:tp=16:pool=1GiB", "tp: 16 outside [1, 8]"},
      {"dsv4-flash:kv=fp8_ds_mla:pool=1GiB", "cannot store rope_inside rows"},
      {"glm-5.2:kv=fp8_dsv4:pool=1GiB", "cannot store rope_appended rows"},
      {"dsv4-flash:page_rows=48:pool=1GiB", "power of two"},
      {"dsv4-flash:pool=12", "holds no page"},
      {"dsv4-flash", "holds no page"},
      {"dsv4-flash:pool=1XB", "not a byte size"},
      {"dsv4-flash:colour=blue", "unknown key 'colour'"},
      {"glm-5.2:pool=1GiB:kv_scale=-1", "kv_scale must be positive"},
      {"dsv4-flash:page_rows=1:pool_pages=3000000000", "int32 slot ids"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ModelConfig> r = ParseModelConfig(c.spec);
    ASSERT_FALSE(r.ok()) << c.spec;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.spec;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message)) << c.spec;
  }
}

TEST(ModelProfileTest, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_EQ(*ParseByteSize("3KiB"), 3072);
  EXPECT_EQ(*ParseByteSize("2MiB"), 2 << 20);
  EXPECT_EQ(*ParseByteSize("1TiB"), int64_t{1} << 40);
  EXPECT_FALSE(ParseByteSize("-1").ok());
  EXPECT_FALSE(ParseByteSize("GiB").ok());
  EXPECT_FALSE(ParseByteSize("99999999999TiB").ok());
}

}  // namespace
}  // namespace smla::server
