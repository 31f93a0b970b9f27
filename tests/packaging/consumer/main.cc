// Uses the installed client as a frontend would: options, a connection, a call, and an MXFP8
// query encoding (the client's own codec, without the kernels). Nothing listens on the target,
// so the call must fail with a status rather than crash or hang.
#include <cstdio>
#include <vector>

#include "smla/client/client.h"
#include "smla/client/tensor.h"

int main() {
  smla::client::ClientOptions options;
  options.target = "127.0.0.1:1";
  options.timeout = absl::Seconds(5);
  auto client = smla::client::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "consumer: connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto info = (*client)->Info();
  if (info.ok()) {
    std::fprintf(stderr, "consumer: something answers on %s\n", options.target.c_str());
    return 1;
  }

  std::vector<float> q(32);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i) - 16.0f;
  const std::vector<uint16_t> bf16 = smla::client::ToBf16(q);
  const smla::client::Mxfp8Query mx = smla::client::EncodeMxfp8Query(bf16, 1, 1, 32);
  if (mx.codes.inline_data().size() != 32 || mx.scales.inline_data().size() != 1) {
    std::fprintf(stderr, "consumer: MXFP8 query of %zu codes and %zu scales\n",
                 mx.codes.inline_data().size(), mx.scales.inline_data().size());
    return 1;
  }
  std::printf("consumer: Info without a server: %s; MXFP8 query encoded\n",
              info.status().ToString().c_str());
  return 0;
}
