#include "harness.h"

namespace smla::testing {

void Harness::Start(const std::vector<std::string>& args, const std::string& model) {
  auto s = ServerProcess::Start(args);
  ASSERT_TRUE(s.ok()) << s.status();
  server = std::move(*s);
  Attach(server->Connect(), model);
}

void Harness::Attach(std::unique_ptr<client::Client> c, const std::string& model) {
  ASSERT_NE(c, nullptr);
  client = std::move(c);
  auto info = client->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  bool found = false;
  for (const auto& m : info->models()) {
    if (m.profile() == model) {
      model_ = m;
      found = true;
    }
  }
  ASSERT_TRUE(found) << "server does not serve " << model;
  auto r = client::Reference::Create(model_, 1 << 16);
  ASSERT_TRUE(r.ok()) << r.status();
  ref = std::move(*r);
}

void Harness::UploadTables(int32_t positions) {
  if (model_.has_sinks()) {
    std::uniform_real_distribution<float> u(-1.0f, 2.0f);
    std::vector<float> sinks(int64_t{model_.layers_size()} * model_.heads_per_rank());
    for (float& s : sinks) s = u(rng);
    ASSERT_TRUE(
        client->SetSinks(model_.profile(), sinks, model_.layers_size(), model_.heads_per_rank())
            .ok());
    ref->SetSinks(sinks);
  }
  if (model_.geometry() == "rope_inside") {
    std::vector<float> table = client::MakeRopeTable(positions);
    ASSERT_TRUE(client->SetRopeTable(model_.profile(), table, positions).ok());
    ref->SetRopeTable(table, positions);
  }
}

v1::StepRequest Harness::Make(int32_t layer, const std::vector<client::SpanSpec>& spans,
                              const client::StepOptions& options) {
  return client::MakeStep(model_, layer, spans, options, rng);
}

void Harness::Check(const v1::StepRequest& request, const v1::StepResponse& response) {
  auto expected = ref->Step(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const client::Comparison c = client::Reference::Compare(*expected, response);
  EXPECT_TRUE(c.ok) << "layer " << request.layer() << ": " << c.first_mismatch;
}

v1::StepResponse Harness::StepAndCheck(const v1::StepRequest& request) {
  auto resp = client->Step(request);
  EXPECT_TRUE(resp.ok()) << resp.status();
  if (!resp.ok()) return {};
  Check(request, *resp);
  return *resp;
}

int64_t Harness::Length(const std::string& sequence, int32_t layer) {
  auto len = client->Length({model_.profile(), sequence}, layer);
  EXPECT_TRUE(len.ok()) << len.status();
  return len.ok() ? *len : -1;
}

void SendStep(client::Client& c, client::StepStream* stream, const v1::StepRequest& request,
              v1::StepResponse* response) {
  if (stream == nullptr) {
    auto r = c.Step(request);
    ASSERT_TRUE(r.ok()) << r.status();
    *response = *r;
    return;
  }
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(stream->Read(response));
  ASSERT_EQ(response->code(), 0) << response->message();
}

void ExpectSameOutputs(const v1::StepResponse& inlined, const v1::StepResponse& want,
                       const std::string& what) {
  EXPECT_TRUE(inlined.out().inline_data() == want.out().inline_data())
      << what << ": output differs from the inline call";
  EXPECT_TRUE(inlined.mx_scales().inline_data() == want.mx_scales().inline_data()) << what;
  EXPECT_TRUE(inlined.lse().inline_data() == want.lse().inline_data()) << what;
  EXPECT_EQ(inlined.out().shape_size(), want.out().shape_size()) << what;
}

}  // namespace smla::testing
