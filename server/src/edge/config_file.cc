#include "config_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "limit_fields.h"
#include "smla/server/model_profile.h"

namespace smla::server::edge {
namespace {

// Collects the text-format parser's errors into one message.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    absl::StrAppend(&errors_, errors_.empty() ? "" : "; ", "line ", line + 1, ":", column + 1, ": ",
                    message);
  }
  const std::string& errors() const { return errors_; }

 private:
  std::string errors_;
};

absl::StatusOr<ModelConfig> ToModelConfig(const v1::ModelSpec& spec, int index) {
  const std::string field = absl::StrCat("models[", index, "]");
  if (!spec.spec().empty()) {
    auto m = ParseModelConfig(spec.spec());
    if (!m.ok())
      return absl::InvalidArgumentError(absl::StrCat(field, ".spec: ", m.status().message()));
    return m;
  }
  ModelConfig m;
  m.profile = spec.profile();
  const ModelProfile* profile = FindProfile(m.profile);
  if (profile == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".profile: unknown '", m.profile, "'"));
  }
  // Zero is "unset"; any other value, negative ones included, goes to the profile's checks.
  if (spec.tp() != 0) m.tp = spec.tp();
  m.kv_format = profile->default_format;
  if (!spec.kv_format().empty()) {
    auto f = kernels::ParseKvFormat(spec.kv_format());
    if (!f) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".kv_format: unknown '", spec.kv_format(), "'"));
    }
    m.kv_format = *f;
  }
  if (spec.page_rows() != 0) m.page_rows = spec.page_rows();
  if (spec.pool_bytes() < 0 || spec.pool_pages() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, spec.pool_bytes() < 0 ? ".pool_bytes: " : ".pool_pages: ",
        spec.pool_bytes() < 0 ? spec.pool_bytes() : spec.pool_pages(), " is negative"));
  }
  m.pool_bytes = spec.pool_bytes();
  m.pool_pages = spec.pool_pages();
  if (spec.kv_scale() != 0) m.kv_scale = spec.kv_scale();
  auto resolved = ResolveModelConfig(m);
  if (!resolved.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", resolved.status().message()));
  }
  return resolved;
}

}  // namespace

absl::StatusOr<v1::ServerConfig> ReadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("config file ", path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  v1::ServerConfig config;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text.str(), &config)) {
    return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": ", errors.errors()));
  }
  return config;
}

absl::Status ApplyConfig(const v1::ServerConfig& file, ServerConfig* config,
                         int32_t* stream_max_inflight, int32_t* shutdown_grace_s) {
  if (!file.listen().empty()) config->listen = file.listen();
  if (!file.metrics_listen().empty()) config->metrics_listen = file.metrics_listen();
  if (!file.backend().empty()) {
    auto b = kernels::ParseBackendChoice(file.backend());
    if (!b)
      return absl::InvalidArgumentError(absl::StrCat("backend: unknown '", file.backend(), "'"));
    config->backend = *b;
  }
  if (file.models_size() > 0) {
    config->models.clear();
    for (int i = 0; i < file.models_size(); ++i) {
      auto m = ToModelConfig(file.models(i), i);
      if (!m.ok()) return m.status();
      config->models.push_back(*m);
    }
  }
  // Every limits field the file sets (a proto3 zero reads as unset; scheduler_spin_us has
  // presence, so an explicit 0 is seen) goes through the flags' table.
  const LimitTargets targets{&config->limits, stream_max_inflight, shutdown_grace_s};
  const v1::LimitsConfig& l = file.limits();
  const google::protobuf::Reflection* reflection = l.GetReflection();
  const google::protobuf::Descriptor* descriptor = l.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = descriptor->field(i);
    if (!reflection->HasField(l, f)) continue;
    const int64_t value = f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT32
                              ? reflection->GetInt32(l, f)
                              : reflection->GetInt64(l, f);
    if (absl::Status st = SetLimit("limits.", f->name(), value, targets); !st.ok()) return st;
  }
  if (file.shutdown_grace_s() != 0) {
    return SetLimit("", "shutdown_grace_s", file.shutdown_grace_s(), targets);
  }
  return absl::OkStatus();
}

}  // namespace smla::server::edge
