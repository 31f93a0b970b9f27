// smla: command-line client of smla-server.
//   smla --server HOST:PORT info | health | demo [--sequences N --context T ...]
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "demo.h"
#include "smla/client/client.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "Server HOST:PORT");
ABSL_FLAG(std::string, model, "", "demo: model profile (default: the server's first)");
ABSL_FLAG(int32_t, sequences, 2, "demo: sequences");
ABSL_FLAG(int32_t, context, 2048, "demo: prefill tokens per sequence");
ABSL_FLAG(int32_t, chunk, 512, "demo: prefill rows per sequence per step");
ABSL_FLAG(int32_t, decode_steps, 6, "demo: speculative decode rounds (1 verify + 5 drafts)");
ABSL_FLAG(bool, all_layers, false, "demo: every layer of the model (default: one per kind)");
ABSL_FLAG(uint64_t, seed, 1, "demo: random seed");
ABSL_FLAG(int32_t, timeout_s, 300, "Per-call deadline in seconds");
ABSL_FLAG(bool, tls, false, "Connect with TLS (implied by --tls_ca or --tls_cert)");
ABSL_FLAG(std::string, tls_ca, "", "PEM roots that verify the server certificate");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (mTLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM client private key (mTLS)");
ABSL_FLAG(std::string, tls_server_name, "", "Name expected in the server certificate");
ABSL_FLAG(std::string, token_file, "",
          "File whose first line is the bearer token (kept out of argv and shell history)");

namespace smla::client {
namespace {

int Info(Client& client) {
  auto info = client.Info();
  if (!info.ok()) {
    std::fprintf(stderr, "info: %s\n", info.status().ToString().c_str());
    return 2;
  }
  std::printf("server %s (gRPC %s, protobuf %s), %s\n", info->server_version().c_str(),
              info->grpc_version().c_str(), info->protobuf_version().c_str(),
              info->healthy() ? "healthy" : "UNHEALTHY");
  const auto& d = info->device();
  std::printf("backend %s: %s (%s, %d compute units, %lld bytes)\n", d.backend().c_str(),
              d.name().c_str(), d.arch().c_str(), d.compute_units(),
              static_cast<long long>(d.total_memory()));
  for (const auto& m : info->models()) {
    std::map<std::string, int> kinds;
    for (const auto& l : m.layers()) {
      std::string k = v1::LayerKind_Name(l.kind()).substr(strlen("LAYER_KIND_"));
      if (l.compression_ratio() > 0) absl::StrAppend(&k, "/", l.compression_ratio());
      if (l.topk() > 0) absl::StrAppend(&k, " top-", l.topk());
      ++kinds[k];
    }
    std::vector<std::string> parts;
    parts.reserve(kinds.size());
    for (const auto& [k, n] : kinds) parts.push_back(absl::StrCat(n, " x ", k));
    std::printf(
        "model %s TP%d: %d heads/rank, %s (%d wide), kv %s, softmax scale %g, sinks %s\n"
        "  layers %d: %s\n"
        "  pool: %lld/%lld pages used, %d rows x %lld bytes per page\n",
        m.profile().c_str(), m.tp(), m.heads_per_rank(), m.geometry().c_str(), m.qk_width(),
        m.kv_format().c_str(), m.softmax_scale(), m.has_sinks() ? "yes" : "no", m.layers_size(),
        absl::StrJoin(parts, ", ").c_str(), static_cast<long long>(m.pool().pages_used()),
        static_cast<long long>(m.pool().pages_total()), m.pool().page_rows(),
        static_cast<long long>(m.pool().page_bytes()));
  }
  const auto& l = info->limits();
  std::printf(
      "limits: %d rows/step, %d spans/step, %d rows/batch, %d queued requests, stream "
      "in-flight %d, message %lld bytes; %lld sequences live\n",
      l.max_rows_per_step(), l.max_spans_per_step(), l.max_batch_rows(), l.max_queued_requests(),
      l.stream_max_inflight(), static_cast<long long>(l.max_message_bytes()),
      static_cast<long long>(info->sequences()));
  return 0;
}

int Health(Client& client) {
  auto serving = client.Health();
  if (!serving.ok()) {
    std::fprintf(stderr, "health: %s\n", serving.status().ToString().c_str());
    return 2;
  }
  std::printf("%s\n", *serving ? "SERVING" : "NOT_SERVING");
  return *serving ? 0 : 1;
}

}  // namespace
}  // namespace smla::client

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "smla --server HOST:PORT info|health|demo [--sequences N --context T --all_layers]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: %s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  const std::string command = args[1];
  // Numbers out of range are usage errors here, before any call.
  for (const auto& [name, value, min] :
       {std::tuple<const char*, int32_t, int32_t>{"timeout_s", absl::GetFlag(FLAGS_timeout_s), 1},
        {"sequences", absl::GetFlag(FLAGS_sequences), 1},
        {"context", absl::GetFlag(FLAGS_context), 1},
        {"chunk", absl::GetFlag(FLAGS_chunk), 1},
        {"decode_steps", absl::GetFlag(FLAGS_decode_steps), 0}}) {
    if (value < min) {
      std::fprintf(stderr, "--%s: %d is out of range (minimum %d)\n", name, value, min);
      return 2;
    }
  }
  smla::client::ClientOptions options;
  options.target = absl::GetFlag(FLAGS_server);
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  options.tls = absl::GetFlag(FLAGS_tls);
  options.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    std::ifstream in(absl::GetFlag(FLAGS_token_file));
    if (!in || !std::getline(in, options.token) || options.token.empty()) {
      std::fprintf(stderr, "--token_file: cannot read a token from %s\n",
                   absl::GetFlag(FLAGS_token_file).c_str());
      return 2;
    }
  }
  auto client = smla::client::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 2;
  }
  if (command == "info") return smla::client::Info(**client);
  if (command == "health") return smla::client::Health(**client);
  if (command == "demo") {
    smla::client::DemoOptions d;
    d.model = absl::GetFlag(FLAGS_model);
    d.sequences = absl::GetFlag(FLAGS_sequences);
    d.context = absl::GetFlag(FLAGS_context);
    d.chunk = absl::GetFlag(FLAGS_chunk);
    d.decode_steps = absl::GetFlag(FLAGS_decode_steps);
    d.all_layers = absl::GetFlag(FLAGS_all_layers);
    d.seed = absl::GetFlag(FLAGS_seed);
    return smla::client::RunDemo(**client, d);
  }
  std::fprintf(stderr, "unknown command '%s' (info, health, demo)\n", command.c_str());
  return 2;
}
