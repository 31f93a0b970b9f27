#include "demo.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "smla/client/testing/reference.h"
#include "smla/client/testing/workload.h"

namespace smla::client {
namespace {

struct Totals {
  int64_t steps = 0;
  int64_t rows = 0;
  int64_t queued_us = 0;
  int64_t kernel_us = 0;
  int64_t server_us = 0;
  double max_rel_error = 0;
  double max_lse_error = 0;
  int64_t mismatches = 0;
};

// Layers to run: all, or the first layer of each kind.
std::vector<int32_t> PickLayers(const v1::ModelInfo& m, bool all) {
  std::vector<int32_t> layers;
  std::map<std::pair<int, int>, bool> seen;
  for (int32_t i = 0; i < m.layers_size(); ++i) {
    const auto key =
        std::make_pair(static_cast<int>(m.layers(i).kind()), m.layers(i).compression_ratio());
    if (all || !seen[key]) layers.push_back(i);
    seen[key] = true;
  }
  return layers;
}

}  // namespace

int RunDemo(Client& client, const DemoOptions& o) {
  const absl::Time start = absl::Now();
  auto info = client.Info();
  if (!info.ok()) {
    std::fprintf(stderr, "demo: GetServerInfo: %s\n", info.status().ToString().c_str());
    return 2;
  }
  const v1::ModelInfo* model = nullptr;
  for (const auto& m : info->models()) {
    if (o.model.empty() || m.profile() == o.model) {
      model = &m;
      break;
    }
  }
  if (model == nullptr) {
    std::fprintf(stderr, "demo: the server does not serve model '%s'\n", o.model.c_str());
    return 2;
  }
  const std::vector<int32_t> layers = PickLayers(*model, o.all_layers);
  std::printf("demo: %s TP%d (%d heads, %s, %s) on %s; layers %s; %d sequences x %d tokens\n",
              model->profile().c_str(), model->tp(), model->heads_per_rank(),
              model->kv_format().c_str(), model->geometry().c_str(), info->device().name().c_str(),
              absl::StrJoin(layers, ",").c_str(), o.sequences, o.context);
  std::fflush(stdout);

  std::mt19937_64 rng(o.seed);
  const int32_t decode_rows = 6;
  const int32_t max_pos = o.context + o.decode_steps * decode_rows + decode_rows;
  // Every write takes a fresh reference slot; this bounds them with room for the rewrites.
  const int64_t capacity = int64_t{o.sequences} * (2 * max_pos + 64);
  auto ref = Reference::Create(*model, capacity);
  if (!ref.ok()) {
    std::fprintf(stderr, "demo: reference: %s\n", ref.status().ToString().c_str());
    return 2;
  }
  const bool rope = model->geometry() == "rope_inside";
  if (rope) {
    std::vector<float> table = MakeRopeTable(max_pos);
    if (absl::Status st = client.SetRopeTable(model->profile(), table, max_pos); !st.ok()) {
      std::fprintf(stderr, "demo: SetRopeTable: %s\n", st.ToString().c_str());
      return 2;
    }
    (*ref)->SetRopeTable(std::move(table), max_pos);
  }
  if (model->has_sinks()) {
    std::uniform_real_distribution<float> u(-1.0f, 2.0f);
    std::vector<float> sinks(int64_t{model->layers_size()} * model->heads_per_rank());
    for (float& s : sinks) s = u(rng);
    if (absl::Status st =
            client.SetSinks(model->profile(), sinks, model->layers_size(), model->heads_per_rank());
        !st.ok()) {
      std::fprintf(stderr, "demo: SetSinks: %s\n", st.ToString().c_str());
      return 2;
    }
    (*ref)->SetSinks(std::move(sinks));
  }
  const std::string prefix =
      absl::StrCat("demo-", absl::ToUnixMicros(absl::Now()) % 1000000000, "-");
  std::vector<Sequence> seqs;
  for (int32_t i = 0; i < o.sequences; ++i) {
    auto s = client.CreateSequence(model->profile(), absl::StrCat(prefix, i));
    if (!s.ok()) {
      std::fprintf(stderr, "demo: CreateSequence: %s\n", s.status().ToString().c_str());
      return 2;
    }
    seqs.push_back(*s);
  }
  auto release_all = [&] {
    for (const Sequence& s : seqs) client.Release(s).IgnoreError();
  };

  Totals tot;
  // Runs one step, checks it against the reference, and accumulates the report.
  auto run = [&](const v1::StepRequest& req) -> bool {
    auto resp = client.Step(req);
    if (!resp.ok()) {
      std::fprintf(stderr, "demo: Step layer %d: %s\n", req.layer(),
                   resp.status().ToString().c_str());
      return false;
    }
    auto expected = (*ref)->Step(req);
    if (!expected.ok()) {
      std::fprintf(stderr, "demo: reference: %s\n", expected.status().ToString().c_str());
      return false;
    }
    const Comparison c = Reference::Compare(*expected, *resp);
    ++tot.steps;
    tot.rows += expected->rows;
    tot.queued_us += resp->timings().queued_us();
    tot.kernel_us += resp->timings().kernel_us();
    tot.server_us += resp->timings().server_us();
    tot.max_rel_error = std::max(tot.max_rel_error, c.max_rel_error);
    tot.max_lse_error = std::max(tot.max_lse_error, c.max_lse_error);
    if (!c.ok) {
      ++tot.mismatches;
      std::fprintf(stderr, "demo: MISMATCH layer %d: %s\n", req.layer(), c.first_mismatch.c_str());
    }
    return true;
  };

  // Prefill: every sequence's context in chunks, one multi-span step per chunk and layer.
  for (size_t li = 0; li < layers.size(); ++li) {
    const int32_t layer = layers[li];
    for (int32_t first = 0; first < o.context; first += o.chunk) {
      const int32_t rows = std::min(o.chunk, o.context - first);
      std::vector<SpanSpec> spans;
      spans.reserve(seqs.size());
      for (const Sequence& s : seqs) spans.push_back({s.id, first, rows, 0});
      if (!run(MakeStep(*model, layer, spans, {}, rng))) {
        release_all();
        return 2;
      }
    }
    std::fprintf(stderr, "demo: prefill layer %d done (%zu/%zu), %.1f s\n", layer, li + 1,
                 layers.size(), absl::ToDoubleSeconds(absl::Now() - start));
  }

  // Speculative decode: each round writes 1 verify + 5 draft rows per sequence; a random
  // number of drafts is accepted and the next round rewrites from the first rejected one.
  std::vector<int64_t> length(seqs.size(), o.context);
  int64_t rolled_back = 0;
  for (int32_t round = 0; round < o.decode_steps; ++round) {
    StepOptions so;
    so.inverse_rope = rope;
    so.want_lse = true;
    so.output_format = round % 2 == 0 ? v1::OUTPUT_FORMAT_BF16 : v1::OUTPUT_FORMAT_MXFP8;
    std::vector<SpanSpec> spans;
    spans.reserve(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      spans.push_back({seqs[i].id, length[i], decode_rows, decode_rows - 1});
    }
    for (int32_t layer : layers) {
      if (!run(MakeStep(*model, layer, spans, so, rng))) {
        release_all();
        return 2;
      }
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t accepted = static_cast<int64_t>(rng() % decode_rows);
      length[i] += 1 + accepted;
      rolled_back += decode_rows - 1 - accepted;
    }
  }
  release_all();

  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf(
      "demo: %lld steps, %lld rows (%lld draft rows rolled back); max rel error %.3g, max lse "
      "error %.3g\n"
      "demo: server time per step: queued %.0f us, kernel %.0f us, total %.0f us (mean); wall "
      "%.1f s\n"
      "demo: %s\n",
      static_cast<long long>(tot.steps), static_cast<long long>(tot.rows),
      static_cast<long long>(rolled_back), tot.max_rel_error, tot.max_lse_error,
      tot.steps ? double(tot.queued_us) / tot.steps : 0.0,
      tot.steps ? double(tot.kernel_us) / tot.steps : 0.0,
      tot.steps ? double(tot.server_us) / tot.steps : 0.0, wall,
      tot.mismatches == 0 ? "OK: every output matched the reference"
                          : absl::StrCat("FAILED: ", tot.mismatches, " steps mismatched").c_str());
  return tot.mismatches == 0 ? 0 : 1;
}

}  // namespace smla::client
