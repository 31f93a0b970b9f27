#include "bench_workload.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "smla/base/align.h"
#include "smla/base/status_macros.h"
#include "smla/client/testing/workload.h"

namespace smla::bench {
namespace {

// A closed-loop worker has one call in flight.
constexpr uint32_t kRingSlots = 2;

}  // namespace

std::string WorkloadSpec::Name() const {
  return absl::StrCat(cell.Name(),
                      layer < 0 ? " (model step)" : absl::StrCat(" (layer ", layer, ")"));
}

absl::StatusOr<v1::ModelInfo> FindModel(const v1::ServerInfo& info, const WorkloadSpec& spec) {
  std::string served;
  for (const v1::ModelInfo& m : info.models()) {
    absl::StrAppend(&served, served.empty() ? "" : ", ", m.profile(), " TP", m.tp(), " ",
                    m.kv_format());
    if (m.profile() != spec.cell.model->name) continue;
    if (spec.cell.tp > 0 && m.tp() != spec.cell.tp) continue;
    if (spec.cell.format && m.kv_format() != kernels::KvFormatName(*spec.cell.format)) continue;
    return m;
  }
  return absl::NotFoundError(
      absl::StrCat("the server does not serve ", spec.Name(), "; it serves: ", served));
}

absl::Status PrepareModel(client::Client* client, const v1::ModelInfo& model,
                          const WorkloadSpec& spec, uint64_t seed) {
  std::mt19937_64 rng(seed);
  if (model.has_sinks()) {
    std::uniform_real_distribution<float> u(-1.0f, 2.0f);
    std::vector<float> sinks(int64_t{model.layers_size()} * model.heads_per_rank());
    for (float& s : sinks) s = u(rng);
    if (absl::Status st =
            client->SetSinks(model.profile(), sinks, model.layers_size(), model.heads_per_rank());
        !st.ok()) {
      return st;
    }
  }
  if (spec.inverse_rope) {
    const int64_t most = spec.cell.context + (spec.prefill() ? 64 * spec.cell.prefill_rows : 64);
    const int32_t positions = static_cast<int32_t>(std::min<int64_t>(most, 1 << 22));
    std::vector<float> table = client::MakeRopeTable(positions);
    if (absl::Status st = client->SetRopeTable(model.profile(), table, positions); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

Worker::Worker(int index, const WorkloadSpec& spec, const v1::ModelInfo& model, Connection* conn,
               Transport transport, bool streaming, CallTotals* totals)
    : index_(index),
      spec_(spec),
      model_(model),
      conn_(conn),
      transport_(transport),
      streaming_(streaming),
      totals_(totals) {
  if (spec.layer >= 0) {
    layers_.push_back(spec.layer);
  } else {
    for (int l = 0; l < model.layers_size(); ++l) layers_.push_back(l);
  }
}

Worker::~Worker() { Teardown(); }

absl::Status Worker::Setup(int chunk, uint64_t seed, bool prefill_shm) {
  std::mt19937_64 rng(seed + 7919 * static_cast<uint64_t>(index_));
  for (int j = 0; j < spec_.cell.sequences(); ++j) {
    std::string id = absl::StrCat("bench-", getpid(), "-w", index_, "-s", j);
    SMLA_ASSIGN_OR_RETURN(auto seq, conn_->client->CreateSequence(model_.profile(), id));
    sequences_.push_back(id);
  }
  // The timed requests, inline first.
  const models::Cell& cell = spec_.cell;
  const int64_t call_first = spec_.prefill() ? cell.context - cell.prefill_rows : cell.context;
  if (call_first < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("context ", cell.context, " is shorter than the prefill chunk"));
  }
  client::StepOptions o;
  o.output_format = spec_.output_format;
  o.want_lse = spec_.want_lse;
  o.inverse_rope = spec_.inverse_rope;
  o.mxfp8_q = spec_.mxfp8_q;
  for (int layer : layers_) {
    std::vector<client::SpanSpec> spans;
    spans.reserve(sequences_.size());
    for (const std::string& s : sequences_) {
      spans.push_back({s, call_first, cell.rows_per_request(), cell.drafts()});
    }
    requests_.push_back(
        std::make_shared<v1::StepRequest>(client::MakeStep(model_, layer, spans, o, rng)));
    next_position_.push_back(call_first);
  }
  const bool calls_in_region = transport_ != Transport::kInline;
  uint64_t call_bytes = 0;
  if (calls_in_region) {
    for (const auto& r : requests_) call_bytes += client::ShmRegion::BytesFor(*r);
  }
  if (InGpu()) SMLA_RETURN_IF_ERROR(PlaceInGpuRegion(call_bytes));
  // Shared memory holds the calls (kShm, kShmSpans, kRing), the ring, and the pre-fill.
  const bool calls_in_shm = calls_in_region && !InGpu();
  if (calls_in_shm || OnRing() || (prefill_shm && call_first > 0)) {
    uint64_t bytes = calls_in_shm ? call_bytes : 0;
    if (OnRing()) {
      // Slots hold the placed requests: a few region references plus each span's id,
      // positions and roles (the requests are still inline here, so this is an upper bound).
      uint64_t largest = 0;
      for (const auto& r : requests_) {
        uint64_t b = 1024 + r->request_id().size();
        for (const auto& sp : r->spans()) b += 64 + sp.sequence_id().size() + 2 * sp.roles_size();
        largest = std::max(largest, b);
      }
      ring_slot_bytes_ = static_cast<uint32_t>(std::max<uint64_t>(4096, (largest + 63) / 64 * 64));
      ring_offset_ = (bytes + 63) / 64 * 64;
      bytes = ring_offset_ + client::StepRing::BytesFor(kRingSlots, ring_slot_bytes_);
    }
    prefill_offset_ = bytes;
    // Scratch for the largest pre-fill chunk request.
    int64_t scratch = 0;
    if (call_first > 0) {
      const int c = static_cast<int>(std::min<int64_t>(chunk, call_first));
      for (int layer : layers_) {
        std::mt19937_64 tmp(1);
        std::vector<client::SpanSpec> one = {{sequences_[0], 0, c, 0}};
        scratch = std::max<int64_t>(
            scratch, static_cast<int64_t>(client::ShmRegion::BytesFor(
                         client::MakeStep(model_, layer, one, client::StepOptions{}, tmp))));
      }
    }
    auto region = client::ShmRegion::Create(conn_->client.get(),
                                            absl::StrCat("bench-", getpid(), "-w", index_),
                                            bytes + static_cast<uint64_t>(scratch) + 64);
    if (region.ok()) {
      region_ = *std::move(region);
    } else if (calls_in_shm || OnRing()) {
      return region.status();
    }  // else: the server takes no regions, so the pre-fill goes inline too
    uint64_t at = 0;
    for (size_t i = 0; calls_in_shm && i < requests_.size(); ++i) {
      SMLA_ASSIGN_OR_RETURN(at, region_->Place(requests_[i].get(), at,
                                               transport_ == Transport::kShmSpans
                                                   ? client::ShmRegion::Layout::kPerSpan
                                                   : client::ShmRegion::Layout::kPacked));
    }
  }
  SMLA_RETURN_IF_ERROR(Prefill(chunk, rng));
  if (streaming_) {
    SMLA_ASSIGN_OR_RETURN(stream_, conn_->client->OpenStream());
  }
  if (OnRing()) {
    if (!streaming_) return absl::InvalidArgumentError("--transport ring needs --mode stream");
    SMLA_ASSIGN_OR_RETURN(
        ring_, client::StepRing::Attach(stream_.get(), region_.get(), ring_offset_, kRingSlots,
                                        ring_slot_bytes_));
    ring_->set_spin(ring_spin_);
  }
  return absl::OkStatus();
}

absl::Status Worker::PlaceInGpuRegion(uint64_t bytes) {
  SMLA_ASSIGN_OR_RETURN(device_, DeviceMemory::Create(bytes + 64));
  SMLA_ASSIGN_OR_RETURN(
      gpu_region_,
      client::GpuRegion::Register(conn_->client.get(), device_->ipc_handle(), device_->size()));
  // Laid out in a host mirror, then uploaded once: the calls reuse their placed inputs, as a
  // frontend's buffers stay where its model wrote them.
  std::vector<uint8_t> mirror(device_->size());
  uint64_t at = 0;
  for (const auto& r : requests_) {
    SMLA_ASSIGN_OR_RETURN(
        at, client::ShmRegion::PlaceInto(mirror.data(), mirror.size(), gpu_region_->name(), r.get(),
                                         at, client::ShmRegion::Layout::kPacked));
  }
  return device_->Upload(mirror);
}

absl::Status Worker::Prefill(int chunk, std::mt19937_64& rng) {
  const int64_t upto = next_position_.empty() ? 0 : next_position_[0];
  for (size_t slot = 0; slot < layers_.size(); ++slot) {
    // One request per chunk length, re-aimed at each sequence and chunk: its top-k choices
    // were drawn for the first chunk, so they stay visible later, and chunk starts are
    // multiples of every compression ratio when the chunk is, so the compressed entry count
    // does not change. In a region the template's tensors are placed once and reused.
    v1::StepRequest tmpl;
    int tmpl_rows = -1;
    for (int64_t first = 0; first < upto; first += chunk) {
      const int rows = static_cast<int>(std::min<int64_t>(chunk, upto - first));
      const int64_t r = model_.layers(layers_[slot]).compression_ratio();
      const bool aligned = r <= 0 || first % r == 0;
      if (rows != tmpl_rows || !aligned) {
        std::vector<client::SpanSpec> spans = {{sequences_[0], first, rows, 0}};
        tmpl = client::MakeStep(model_, layers_[slot], spans, client::StepOptions{}, rng);
        tmpl_rows = aligned ? rows : -1;
        if (region_) {
          SMLA_RETURN_IF_ERROR(region_->Place(&tmpl, prefill_offset_).status());
        }
      }
      for (const std::string& seq : sequences_) {
        tmpl.mutable_spans(0)->set_sequence_id(seq);
        tmpl.mutable_spans(0)->set_first_position(first);
        auto resp = conn_->client->Step(tmpl);
        if (!resp.ok()) {
          totals_->failed++;
          return absl::Status(resp.status().code(),
                              absl::StrCat("pre-fill of layer ", layers_[slot], " at ", first, ": ",
                                           resp.status().message()));
        }
        totals_->unary_ok++;
        totals_->rows_ok += rows;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Worker::Send(const std::shared_ptr<v1::StepRequest>& shared,
                          v1::StepResponse* response, bool count_rows) {
  const v1::StepRequest& request = *shared;
  int64_t rows = 0;
  for (const auto& s : request.spans()) rows += s.num_rows();
  absl::Status st;
  if (broken_) return absl::UnavailableError("step stream ended");
  if (ring_) {
    // Same accounting as the stream: the ring is the stream's transport.
    st = ring_->Call(request, response);
    if (!st.ok()) {
      broken_ = true;
      totals_->failed++;
      return st;
    }
    st = absl::Status(static_cast<absl::StatusCode>(response->code()), response->message());
    if (st.ok()) totals_->stream_ok++;
  } else if (streaming_) {
    // Inline tensors go out from the request's own bytes (no serialization copy).
    if (!stream_->Write(std::shared_ptr<const v1::StepRequest>(shared)) ||
        !stream_->Read(response)) {
      st = stream_->Finish();
      if (st.ok()) st = absl::UnavailableError("step stream ended");
      broken_ = true;
      totals_->failed++;
      return st;
    }
    st = absl::Status(static_cast<absl::StatusCode>(response->code()), response->message());
    if (st.ok()) totals_->stream_ok++;
  } else {
    auto r = conn_->client->Step(request);
    st = r.status();
    if (r.ok()) {
      *response = *std::move(r);
      totals_->unary_ok++;
    }
  }
  if (st.ok() && count_rows) totals_->rows_ok += rows;
  if (!st.ok()) totals_->failed++;
  return st;
}

absl::Status Worker::Call(size_t layer_slot, v1::StepResponse* response) {
  std::shared_ptr<v1::StepRequest>& req = requests_[layer_slot];
  if (spec_.prefill()) {
    // gRPC may still hold the last call's bytes of this request: change a copy then.
    if (req.use_count() > 1) req = std::make_shared<v1::StepRequest>(*req);
    for (auto& s : *req->mutable_spans()) s.set_first_position(next_position_[layer_slot]);
  }
  absl::Status st = Send(req, response, true);
  if (st.ok() && spec_.prefill()) next_position_[layer_slot] += spec_.cell.prefill_rows;
  return st;
}

void Worker::Teardown() {
  ring_.reset();
  if (stream_ && !broken_) {
    stream_->WritesDone();
    stream_->Finish().IgnoreError();  // tearing down: a failed finish changes nothing
    stream_.reset();
  }
  for (const std::string& s : sequences_) {
    conn_->client->Release({model_.profile(), s}).IgnoreError();
  }
  sequences_.clear();
  region_.reset();
  gpu_region_.reset();  // the server drops the region before the memory is freed
  device_.reset();
}

}  // namespace smla::bench
