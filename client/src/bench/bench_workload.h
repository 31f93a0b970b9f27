// What smla-bench sends: a cell of the docs/performance.md grid ("dsv4.1-flash fp8_dsv4 TP4 decode
// C=32 128K") on one layer or as whole model steps (every layer of the profile in order), and
// the per-worker state that sends it (sequences pre-filled to the context, a connection, a
// stream, a shared-memory region).
//
// Calls repeat at a fixed position: a decode call writes its 6 (or 1) rows at position
// `context` of each of its C sequences and attends there, the next call replaces them (the
// rollback of rejected drafts), so every call does the same work and request payloads are
// generated once. A prefill call writes the next chunk of P rows after what is stored, so the
// context grows by P per call.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench_device_memory.h"
#include "smla/client/client.h"
#include "smla/client/gpu_region.h"
#include "smla/client/shm.h"
#include "smla/client/step_ring.h"
#include "smla/models/grid.h"
#include "smla/v1/info.pb.h"
#include "smla/v1/step.pb.h"

namespace smla::bench {

struct WorkloadSpec {
  // Model, format and TP the server must serve (unset: whatever it serves), shape, context:
  // the positions stored before the timed calls.
  models::Cell cell;
  int layer = -1;  // -1: whole model steps
  v1::OutputFormat output_format = v1::OUTPUT_FORMAT_BF16;
  bool want_lse = false;
  bool inverse_rope = false;
  bool mxfp8_q = false;  // the timed calls' queries travel as MXFP8 (--q_format mxfp8)

  bool prefill() const { return cell.shape == models::Shape::kPrefill; }
  std::string Name() const;  // the cell's name and the layer stepped
};

// kShm: the calls' inputs packed in a registered region, one range per tensor kind
// (StepRequest.packed); kShmSpans: the per-span form (each span's tensors name the region);
// kRing: packed as kShm, sent through a step ring attached to the worker's stream
// (smla/client/step_ring.h) instead of the stream's messages. kGpu / kGpuRing: as kShm /
// kRing, with the packed tensors and outputs in a GPU region of the worker's (the ring itself
// stays in shared memory).
enum class Transport { kInline, kShm, kShmSpans, kRing, kGpu, kGpuRing };

struct Connection {
  std::string server;
  std::unique_ptr<client::Client> client;
};

// Counters of every call the bench made (set-up, warm-up and measured), to compare with the
// server's metrics.
struct CallTotals {
  std::atomic<int64_t> unary_ok{0}, stream_ok{0}, rows_ok{0}, failed{0};
};

// One closed-loop stream (or open-loop sender): its sequences, its requests (one per layer it
// steps), its stream and region.
class Worker {
 public:
  Worker(int index, const WorkloadSpec& spec, const v1::ModelInfo& model, Connection* conn,
         Transport transport, bool streaming, CallTotals* totals);
  ~Worker();

  // Creates the sequences, pre-fills them to the context on every layer it steps (prefill
  // chunks of `chunk` rows), builds the call requests and, for shm, registers a region
  // holding all of them. With `prefill_shm` the pre-fill goes through a region even for the
  // inline transport when the server allows regions (it moves far more bytes than the calls).
  absl::Status Setup(int chunk, uint64_t seed, bool prefill_shm);
  // Releases the sequences and the region.
  void Teardown();

  // One call on `layer_slot` (index into Layers()); fills `response`. The status is the
  // call's (unary) or the response's code (stream).
  absl::Status Call(size_t layer_slot, v1::StepResponse* response);
  const std::vector<int>& Layers() const { return layers_; }
  const std::string& server() const { return conn_->server; }
  // kRing: how long a wait for a response spins before it sleeps (StepRing::set_spin).
  void set_ring_spin(absl::Duration spin) { ring_spin_ = spin; }
  // The worker's stream ended; it cannot send any more.
  bool broken() const { return broken_; }

 private:
  absl::Status Prefill(int chunk, std::mt19937_64& rng);
  // kGpu, kGpuRing: places the calls' requests in a new GPU region.
  absl::Status PlaceInGpuRegion(uint64_t bytes);
  bool InGpu() const { return transport_ == Transport::kGpu || transport_ == Transport::kGpuRing; }
  bool OnRing() const {
    return transport_ == Transport::kRing || transport_ == Transport::kGpuRing;
  }
  absl::Status Send(const std::shared_ptr<v1::StepRequest>& request, v1::StepResponse* response,
                    bool count_rows);

  const int index_;
  const WorkloadSpec spec_;
  const v1::ModelInfo model_;
  Connection* const conn_;
  const Transport transport_;
  const bool streaming_;
  CallTotals* const totals_;
  std::vector<int> layers_;
  std::vector<std::string> sequences_;
  // Per layer slot, placed in the region for shm; shared so that stream writes send from them.
  std::vector<std::shared_ptr<v1::StepRequest>> requests_;
  std::vector<int64_t> next_position_;  // prefill: where the next call writes
  std::unique_ptr<client::StepStream> stream_;
  std::unique_ptr<client::ShmRegion> region_;
  std::unique_ptr<DeviceMemory> device_;           // kGpu, kGpuRing: the calls' tensors
  std::unique_ptr<client::GpuRegion> gpu_region_;  // device_, registered
  std::unique_ptr<client::StepRing> ring_;         // kRing: on stream_, in region_ at ring_offset_
  uint64_t ring_offset_ = 0;
  uint32_t ring_slot_bytes_ = 0;
  absl::Duration ring_spin_ = client::StepRing::kSpin;
  uint64_t prefill_offset_ = 0;  // start of the prefill scratch area in region_
  bool broken_ = false;
};

// Uploads sinks (random, when the model has them) and a rope table (when asked) so steps run.
absl::Status PrepareModel(client::Client* client, const v1::ModelInfo& model,
                          const WorkloadSpec& spec, uint64_t seed);

// The served model matching the spec (profile, TP, format), or NOT_FOUND naming what is there.
absl::StatusOr<v1::ModelInfo> FindModel(const v1::ServerInfo& info, const WorkloadSpec& spec);

}  // namespace smla::bench
