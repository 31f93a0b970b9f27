// The config file's limits and the flags' table (edge/limit_fields.h): every LimitsConfig
// field is a known limit, values apply, zero keeps a default where it says so, and a negative or
// out-of-range value is an error naming the field, never silently dropped.
#include <string>

#include "edge/config_file.h"
#include "edge/limit_fields.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace smla::server::edge {
namespace {

using ::testing::HasSubstr;

struct Applied {
  ServerConfig config;
  int32_t stream_max_inflight = 16;
  int32_t shutdown_grace_s = 10;
  absl::Status status;
};

Applied Apply(const std::string& text) {
  v1::ServerConfig file;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &file)) << text;
  Applied a;
  a.status = ApplyConfig(file, &a.config, &a.stream_max_inflight, &a.shutdown_grace_s);
  return a;
}

TEST(ConfigLimitsTest, EveryLimitsConfigFieldIsInTheTable) {
  const google::protobuf::Descriptor* d = v1::LimitsConfig::descriptor();
  ASSERT_GT(d->field_count(), 0);
  for (int i = 0; i < d->field_count(); ++i) {
    const std::string name = d->field(i)->name();
    Limits limits;
    int32_t inflight = 0, grace = 0;
    EXPECT_TRUE(SetLimit("limits.", name, 7, {&limits, &inflight, &grace}).ok()) << name;
  }
  // The flags cover the same table, plus shutdown_grace_s and the tenant quotas.
  EXPECT_EQ(LimitNames().size(), static_cast<size_t>(d->field_count()) + 5);
}

TEST(ConfigLimitsTest, FileValuesApplyAndZeroKeepsTheDefault) {
  const Limits defaults;
  Applied a = Apply(R"(
    limits { max_rows_per_step: 1000 max_spans_per_step: 9 max_batch_rows: 0 max_batch_bytes: 4096
             max_queued_requests: 3 max_queued_rows: 77 batch_wait_us: 1500 max_sequences: 5
             max_context: 8192 stream_max_inflight: 4 scheduler_spin_us: 0 }
    shutdown_grace_s: 3)");
  ASSERT_TRUE(a.status.ok()) << a.status;
  const Limits& l = a.config.limits;
  EXPECT_EQ(l.max_rows_per_step, 1000);
  EXPECT_EQ(l.max_spans_per_step, 9);
  EXPECT_EQ(l.max_batch_rows, defaults.max_batch_rows);  // 0 keeps the default
  EXPECT_EQ(l.max_batch_bytes, 4096);
  EXPECT_EQ(l.max_queued_requests, 3);
  EXPECT_EQ(l.max_queued_rows, 77);
  EXPECT_EQ(l.batch_wait, absl::Microseconds(1500));
  EXPECT_EQ(l.max_sequences, 5);
  EXPECT_EQ(l.max_context, 8192);
  EXPECT_EQ(l.scheduler_spin, absl::ZeroDuration());  // an explicit 0 parks at once
  EXPECT_EQ(a.stream_max_inflight, 4);
  EXPECT_EQ(a.shutdown_grace_s, 3);

  // Left out, scheduler_spin_us keeps its default.
  Applied unset = Apply("limits { max_context: 8192 }");
  ASSERT_TRUE(unset.status.ok()) << unset.status;
  EXPECT_EQ(unset.config.limits.scheduler_spin, defaults.scheduler_spin);
}

TEST(ConfigLimitsTest, NegativeValuesAreErrorsNamingTheField) {
  for (const std::string field :
       {"max_rows_per_step", "max_spans_per_step", "max_batch_rows", "max_batch_bytes",
        "max_queued_requests", "max_queued_rows", "batch_wait_us", "max_sequences", "max_context",
        "stream_max_inflight", "scheduler_spin_us"}) {
    SCOPED_TRACE(field);
    Applied a = Apply("limits { " + field + ": -5 }");
    EXPECT_EQ(a.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(a.status.message()), HasSubstr("limits." + field + ": -5 is negative"));
  }
  Applied grace = Apply("shutdown_grace_s: -1");
  EXPECT_EQ(grace.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(grace.status.message()), HasSubstr("shutdown_grace_s: -1 is negative"));
}

TEST(ConfigLimitsTest, NegativeModelFieldsAreErrorsNamingTheField) {
  for (const auto& [text, want] :
       {std::pair<std::string, std::string>{"tp: -4", "tp must be 1, 2, 4 or 8 (got -4)"},
        {"page_rows: -64", "page_rows must be a power of two in [1, 1024] (got -64)"},
        {"pool_bytes: -1", "models[0].pool_bytes: -1 is negative"},
        {"pool_pages: -3", "models[0].pool_pages: -3 is negative"}}) {
    SCOPED_TRACE(text);
    Applied a = Apply("models { profile: \"dsv4.1-flash\" " + text + " }");
    EXPECT_EQ(a.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(a.status.message()), HasSubstr(want));
  }
  Applied ok = Apply("models { profile: \"dsv4.1-flash\" tp: 4 pool_pages: 8 }");
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(ok.config.models.at(0).tp, 4);
  EXPECT_EQ(ok.config.models.at(0).pool_pages, 8);
}

TEST(ConfigLimitsTest, FlagValuesPastAnInt32FieldAreErrors) {
  Limits limits;
  int32_t inflight = 16, grace = 10;
  const absl::Status st =
      SetLimit("--", "max_batch_rows", int64_t{1} << 31, {&limits, &inflight, &grace});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("--max_batch_rows: 2147483648 is out of range"));
  EXPECT_EQ(limits.max_batch_rows, Limits{}.max_batch_rows);
  // Quotas take 0 as a value (no quota), and an unknown name is the table's bug.
  ASSERT_TRUE(SetLimit("--", "tenant_max_pages", 12, {&limits, &inflight, &grace}).ok());
  ASSERT_TRUE(SetLimit("--", "tenant_max_pages", 0, {&limits, &inflight, &grace}).ok());
  EXPECT_EQ(limits.tenant_max_pages, 0);
  EXPECT_EQ(SetLimit("--", "max_nothing", 1, {&limits, &inflight, &grace}).code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace smla::server::edge
