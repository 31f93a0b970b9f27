// Shared pieces of the integration tests: a server process, a client, the served model's
// description and a client-side reference that checks every output.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_process.h"
#include "smla/client/client.h"
#include "smla/client/testing/reference.h"
#include "smla/client/testing/workload.h"

namespace smla::testing {

class Harness {
 public:
  // Starts a server with `args` and picks `model` from its ServerInfo.
  void Start(const std::vector<std::string>& args, const std::string& model);
  // Acts through `c` (one more client, e.g. another tenant) on a server owned elsewhere.
  void Attach(std::unique_ptr<client::Client> c, const std::string& model);
  // Uploads sinks (when the model has them) and a rope table of `positions` rows, to the
  // server and to the reference.
  void UploadTables(int32_t positions);

  v1::StepRequest Make(int32_t layer, const std::vector<client::SpanSpec>& spans,
                       const client::StepOptions& options = {});
  // Runs a unary step that must succeed and match the reference.
  v1::StepResponse StepAndCheck(const v1::StepRequest& request);
  // Checks a successful response against the reference (recording the step's writes).
  void Check(const v1::StepRequest& request, const v1::StepResponse& response);
  int64_t Length(const std::string& sequence, int32_t layer);
  std::string ModelName() const { return model_.profile(); }

  std::unique_ptr<ServerProcess> server;
  std::unique_ptr<client::Client> client;
  v1::ModelInfo model_;
  std::unique_ptr<client::Reference> ref;
  std::mt19937_64 rng{12345};
};

// Sends a step that must succeed as a unary call through `c`, or on `stream` when not null.
void SendStep(client::Client& c, client::StepStream* stream, const v1::StepRequest& request,
              v1::StepResponse* response);
// A response whose outputs name a shared-memory region, copied inline (`inlined`), equals the
// inline call's outputs bit for bit.
void ExpectSameOutputs(const v1::StepResponse& inlined, const v1::StepResponse& want,
                       const std::string& what);

// Step options the transport tests compare every transport on: bf16 output with the LSE, and
// MXFP8 output with inverse RoPE and the LSE.
inline client::StepOptions Bf16WithLse() {
  client::StepOptions o;
  o.want_lse = true;
  return o;
}
inline client::StepOptions Mxfp8WithRope() {
  client::StepOptions o;
  o.output_format = v1::OUTPUT_FORMAT_MXFP8;
  o.inverse_rope = true;
  o.want_lse = true;
  return o;
}

// A small DeepSeek-V4.1 rank (8 heads) with a small pool.
inline const char kDsv41[] = "--model=dsv4.1-flash:tp=8:kv=fp8_dsv4:page_rows=16:pool=48MiB";
// GLM-5.2 (8 heads, rope_appended: 576-lane queries and rows).
inline const char kGlm52[] = "--model=glm-5.2:tp=8:page_rows=16:pool=64MiB";
// One GLM-5.3-Flash layer (8 heads); no sinks and no rope, the full cache grows page by page.
inline const char kGlm53[] = "--model=glm-5.3-flash:tp=8:page_rows=16:pool=32MiB";

}  // namespace smla::testing
