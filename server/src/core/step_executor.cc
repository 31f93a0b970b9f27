#include "smla/server/step_executor.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "internal.h"
#include "smla/base/align.h"
#include "smla/kernels/codec/mxfp8_query.h"
#include "smla/kernels/codec/row_codec.h"
#include "smla/server/segment_builder.h"
#include "smla/server/step_validation.h"
#include "spdlog/spdlog.h"

namespace smla::server {
namespace {

using kernels::OutputFormat;

// Appends a copy, merged into the previous one where it continues it on both sides.
void AddCopy(std::vector<kernels::CopyOp>& copies, uint8_t* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (!copies.empty()) {
    kernels::CopyOp& last = copies.back();
    if (static_cast<uint8_t*>(last.dst) + last.bytes == dst &&
        static_cast<const uint8_t*>(last.src) + last.bytes == src) {
      last.bytes += bytes;
      return;
    }
  }
  copies.push_back(kernels::CopyOp{dst, src, bytes});
}

// Input ranges of one span that CheckInputs reads: the queries (MXFP8 codes, or bf16 ones read
// from a GPU region) and MXFP8 scales. The KV and compressed rows are checked as they are
// written (RowWrites).
constexpr size_t kChecksPerSpan = 2;

}  // namespace

StepExecutor::StepExecutor(kernels::Backend& backend, std::unique_ptr<kernels::Stream> stream,
                           Events events, const std::vector<ModelRuntime*>& models)
    : backend_(backend), stream_(std::move(stream)), events_(std::move(events)) {
  for (ModelRuntime* m : models) {
    SMLA_CHECK(m->index() == static_cast<int32_t>(models_.size()), "models out of index order");
    models_.push_back(m);
  }
}

absl::StatusOr<std::unique_ptr<StepExecutor>> StepExecutor::Create(
    kernels::Backend& backend, const std::vector<ModelRuntime*>& models,
    int32_t phase_timings_every) {
  if (phase_timings_every < 1) {
    return absl::InvalidArgumentError(
        Cat("phase_timings_every: ", phase_timings_every, " is not a positive count"));
  }
  absl::StatusOr<std::unique_ptr<kernels::Stream>> stream = backend.CreateStream();
  if (!stream.ok()) return stream.status();
  Events events;
  for (std::unique_ptr<kernels::Event>* e :
       {&events.start, &events.copied_in, &events.built, &events.attend_begin, &events.attend_end,
        &events.end}) {
    absl::StatusOr<std::unique_ptr<kernels::Event>> created = backend.CreateEvent();
    if (!created.ok()) return created.status();
    *e = *std::move(created);
  }
  std::unique_ptr<StepExecutor> executor(
      new StepExecutor(backend, *std::move(stream), std::move(events), models));
  executor->phase_timings_every_ = phase_timings_every;
  // Learns whether the backend has page-locked memory (pinned()) before the first launch.
  absl::StatusOr<uint8_t*> arena = executor->HostArena(size_t{1} << 20);
  if (!arena.ok()) return arena.status();
  return executor;
}

absl::Status StepExecutor::Ensure(kernels::Buffer& buffer, size_t bytes) {
  if (buffer.size() >= bytes && buffer.data() != nullptr) return absl::OkStatus();
  // Grow geometrically so that a slowly growing batch does not reallocate every launch.
  const size_t size = std::max<size_t>({bytes, buffer.size() * 2, 4096});
  buffer = kernels::Buffer();
  absl::StatusOr<kernels::Buffer> fresh = backend_.Allocate(size);
  if (!fresh.ok()) return fresh.status();
  buffer = *std::move(fresh);
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> StepExecutor::HostArena(size_t bytes) {
  if (host_pinned_ok_) {
    if (host_pinned_.size() >= bytes && host_pinned_.data() != nullptr) {
      return host_pinned_.as<uint8_t>();
    }
    const size_t size = std::max<size_t>({bytes, host_pinned_.size() * 2, size_t{1} << 20});
    host_pinned_ = kernels::Buffer();
    absl::StatusOr<kernels::Buffer> fresh = backend_.AllocateHost(size);
    if (fresh.ok()) {
      host_pinned_ = *std::move(fresh);
      return host_pinned_.as<uint8_t>();
    }
    if (!absl::IsUnimplemented(fresh.status())) return fresh.status();
    host_pinned_ok_ = false;
  }
  const size_t words = (bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t) + 8;
  if (host_plain_.size() < words) host_plain_.resize(std::max(words, host_plain_.size() * 2));
  // 64-byte alignment inside the vector's 8-byte-aligned storage.
  auto* p = reinterpret_cast<uint8_t*>(host_plain_.data());
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  return p + (AlignUp(at, 64) - at);
}

absl::Status StepExecutor::WarmUp() {
  for (ModelRuntime* model : models_) {
    const int32_t heads = model->config().heads_per_rank;
    const int qk = kernels::QkWidth(model->profile().geometry);
    SMLA_RETURN_IF_ERROR(Ensure(q_, size_t{2} * heads * qk));
    SMLA_RETURN_IF_ERROR(Ensure(out_, size_t{2} * heads * kernels::kValueWidth));
    SMLA_RETURN_IF_ERROR(backend_.Fill(q_.data(), 0, size_t{2} * heads * qk, *stream_));
    const int32_t indptr[2] = {0, 0};
    kernels::AttendParams p;
    p.num_rows = 1;
    p.num_heads = heads;
    p.geometry = model->profile().geometry;
    p.q = q_.data();
    p.softmax_scale = model->config().softmax_scale;
    p.main.cache = model->store().cache().view();
    p.main.indptr = indptr;
    p.out.format = OutputFormat::kBf16;
    p.out.bf16 = out_.data();
    SMLA_RETURN_IF_ERROR(backend_.Attend(p, *stream_));
    SMLA_RETURN_IF_ERROR(backend_.Synchronize(*stream_));
  }
  return absl::OkStatus();
}

std::vector<absl::StatusOr<StepResult>> StepExecutor::RunBatch(
    std::span<const StepRequest* const> steps) {
  std::vector<absl::StatusOr<StepResult>> results(steps.size(),
                                                  absl::InternalError("step was not run"));
  const int32_t index = steps[0]->model_index;
  SMLA_CHECK(index >= 0 && index < static_cast<int32_t>(models_.size()),
             "batch for a model the executor does not serve");
  ModelRuntime& model = *models_[index];
  const int32_t layer = steps[0]->layer;
  KvStore& store = model.store();
  const ModelRuntime::Rope rope = model.rope();

  store.BeginBatch();
  std::vector<std::unique_ptr<PreparedStep>> prepared(steps.size());
  std::vector<size_t> included;
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepRequest& r = *steps[i];
    SMLA_CHECK(r.model_index == index && r.layer == layer, "batch mixes queues");
    // The table may have been replaced by a shorter one since admission.
    if (r.inverse_rope) {
      absl::Status rope_status;
      for (size_t s = 0; s < r.spans.size() && rope_status.ok(); ++s) {
        const SpanInput& span = r.spans[s];
        if (span.first_position + span.num_rows > rope.positions) {
          rope_status = absl::InvalidArgumentError(
              Cat("spans[", s, "]: positions up to ", span.first_position + span.num_rows - 1,
                  " outside the cos/sin table (", rope.positions, " positions)"));
        }
      }
      if (!rope_status.ok()) {
        results[i] = rope_status;
        continue;
      }
    }
    std::vector<SpanWrite> writes;
    writes.reserve(r.spans.size());
    for (const SpanInput& s : r.spans) {
      writes.push_back(SpanWrite{s.sequence_id, s.first_position, s.num_rows});
    }
    absl::StatusOr<std::unique_ptr<PreparedStep>> p = store.Prepare(r.tenant, layer, writes);
    if (!p.ok()) {
      results[i] = p.status();
      continue;
    }
    prepared[i] = *std::move(p);
    included.push_back(i);
  }
  if (!included.empty()) {
    const absl::Status status = Launch(model, layer, rope, steps, included, prepared, results);
    // After a failure, work already enqueued may still read the pages and the buffers that the
    // next batch reuses.
    if (!status.ok()) static_cast<void>(backend_.Synchronize(*stream_));
    for (size_t i : included) {
      if (status.ok() && results[i].ok()) {
        store.Commit(*prepared[i]);
      } else if (status.ok()) {
        store.Abort(*prepared[i]);  // its inputs failed the launch's checks: it changed nothing
      } else {
        store.Abort(*prepared[i]);
        results[i] = absl::InternalError(Cat("backend failure: ", status.message()));
      }
    }
    if (!status.ok()) {
      // Rows of the failed batch may have been written over stored positions, so the core
      // stops serving rather than risk answering from a half-updated cache.
      spdlog::error("backend failure on {} layer {} ({} steps); service is now unhealthy: {}",
                    steps[0]->model, layer, included.size(), std::string(status.message()));
      healthy_.store(false);
    }
  }
  store.EndBatch();
  return results;
}

// The device checks' arrays at the start of the arena, before the slot lists and segments: the
// spans' lists of table blocks, the stale blocks and their writes into the table heap, the
// TranslateRows, the PositionRuns and their window pages, the CheckRanges and the RowWrites. All
// of them go up in the one copy of the arena's arrays; the segments the device writes follow
// that copy in arrays_.
struct StepExecutor::CheckLayout {
  size_t stale = 0;      // the stale blocks, after the block lists
  size_t writes = 0;     // the TableBlockWrites, after the stale blocks
  size_t rows = 0;       // the TranslateRows, after the writes
  size_t runs = 0;       // the PositionRuns, after the rows
  size_t run_pages = 0;  // the runs' window pages, after the runs
  size_t ranges = 0;     // the CheckRanges, after the window pages
  size_t new_rows = 0;   // the RowWrites, after the ranges
  // [block lists | stale blocks | writes | rows | runs | pages | ranges | new rows]
  size_t bytes = 0;

  static CheckLayout Of(const SegmentCounts& c, size_t spans) {
    CheckLayout l;
    const auto stale = static_cast<size_t>(c.stale_blocks);
    l.stale = AlignUp(static_cast<size_t>(c.table_blocks) * sizeof(const int32_t*), 64);
    l.writes = AlignUp(l.stale + stale * kTableBlock * sizeof(int32_t), 64);
    l.rows = AlignUp(l.writes + stale * sizeof(kernels::TableBlockWrite), 64);
    l.runs =
        AlignUp(l.rows + static_cast<size_t>(c.chosen_rows) * sizeof(kernels::TranslateRow), 64);
    l.run_pages = AlignUp(l.runs + static_cast<size_t>(c.runs) * sizeof(kernels::PositionRun), 64);
    l.ranges = AlignUp(l.run_pages + static_cast<size_t>(c.run_pages) * sizeof(int32_t), 64);
    l.new_rows = AlignUp(l.ranges + spans * kChecksPerSpan * sizeof(kernels::CheckRange), 64);
    l.bytes = l.new_rows + static_cast<size_t>(c.slots()) * sizeof(kernels::RowWrite);
    return l;
  }
};

struct StepExecutor::LaunchArgs {
  ModelRuntime& model;
  int32_t layer;
  const ModelRuntime::Rope& rope;
  std::span<const StepRequest* const> steps;
  std::span<const size_t> included;  // indices into steps
  std::span<const std::unique_ptr<PreparedStep>> prepared;
};

struct StepExecutor::DeviceWork {
  absl::Time inputs_at;                      // when the input copies were enqueued
  std::vector<kernels::CopyOp> to_device;    // sources page-locked (or any, on the CPU backend)
  std::vector<kernels::CopyOp> to_host;      // destinations page-locked (likewise)
  std::vector<kernels::CopyOp> to_pageable;  // destinations in plain memory (result vectors)
  // Outputs to a GPU region: copies that stay on the device. (Inputs in a GPU region are copied
  // by the checks that read them: CheckRange::copy_to.)
  std::vector<kernels::CopyOp> out_on_device;
  kernels::ExpandQueryParams expand;  // MXFP8 queries into q_ (vectors 0: bf16 queries)
  // Whether the expansion waits for the checks (queries in a GPU region, which the checks copy
  // into q_codes_), rather than running with the input copies.
  bool expand_after_checks = false;
  // Whether any device work comes before the segment build: input copies, or the expansion.
  // Without any, the launch's first event is recorded with the compute (no wait to measure).
  bool copies_first = false;
  bool phases = false;            // the attention's and the output copies' events are recorded
  bool outputs_in_place = false;  // the attention writes the one step's outputs (OutputsInPlace)
  // The launch's bf16 queries where they lie in a GPU region, which the attention reads (they
  // are not checked, so no copy is needed); null where they are copied into q_ (QueriesInPlace).
  const uint8_t* q_in_place = nullptr;
  // The arena's arrays (segments, the checks' arrays), copied up in one copy once built; Attend
  // reads its arrays there too (`mirror`).
  kernels::CopyOp arrays_upload;
  kernels::HostMirror mirror;
  // The checks on the device: the inputs' values checked, the chosen entries translated and the
  // new rows written (RowWrites, their slots' bytes saved in old_rows_ first); the device writes
  // the flags, one per step of the launch, into flags_host in the arena, which the host zeroed.
  kernels::CheckInputsParams check;
  uint32_t* flags_host = nullptr;
  // The rows the checks write, as built on the host (the order of check.rows), for
  // RestoreFlagged.
  std::span<const kernels::RowWrite> new_rows;
  kernels::AttendParams attend;
  std::vector<SpanRef> spans;
  std::vector<size_t> span_step;  // the step (index into the batch) of each span
  // Where each span's inputs lie in backend memory once copied in (ExplainFlagged reads them).
  struct SpanDevice {
    uint8_t* kv = nullptr;
    uint8_t* compressed = nullptr;
    uint8_t* q = nullptr;  // bf16 queries (none where read in place: q_in_place), or MXFP8 codes
    uint8_t* q_scales = nullptr;
    int32_t* ids = nullptr;
    // Each input's address in a GPU region, from which the checks read and copy it to the
    // address above; null where a copy put it there before the checks (the ids': span_ids).
    const uint8_t *kv_from = nullptr, *compressed_from = nullptr, *q_from = nullptr,
                  *q_scales_from = nullptr;
  };
  std::vector<SpanDevice> span_device;
  // Each span's ids in a GPU region, likewise; one array, as the builder reads it
  // (DeviceTargets::span_ids).
  std::vector<const int32_t*> span_ids;
};

absl::Status StepExecutor::Launch(ModelRuntime& model, int32_t layer,
                                  const ModelRuntime::Rope& rope,
                                  std::span<const StepRequest* const> steps,
                                  std::span<const size_t> included,
                                  std::span<const std::unique_ptr<PreparedStep>> prepared,
                                  std::vector<absl::StatusOr<StepResult>>& results) {
  const absl::Time start = absl::Now();
  ranges_memo_ = HostRanges::Memo();
  DeviceWork work;
  work.phases = launches_++ % phase_timings_every_ == 0;
  const LaunchArgs args{model, layer, rope, steps, included, prepared};
  // Enqueues the input copies, then builds the slot lists and segments while they run.
  SMLA_RETURN_IF_ERROR(PrepareLaunch(args, work, results));
  const absl::Time prepared_at = absl::Now();
  SMLA_RETURN_IF_ERROR(EnqueueCompute(work));
  SMLA_RETURN_IF_ERROR(EnqueueOutputs(work));
  const absl::Time enqueued_at = absl::Now();
  SMLA_RETURN_IF_ERROR(backend_.Synchronize(*stream_));
  // Steps the device flagged (a value or a chosen entry their checks refuse) get their slots'
  // bytes back; their outputs were copied like the others' and are not answered.
  if (std::any_of(work.flags_host, work.flags_host + included.size(),
                  [](uint32_t f) { return f != 0; })) {
    SMLA_RETURN_IF_ERROR(RestoreFlagged(work));
  }
  for (size_t g = 0; g < included.size(); ++g) {
    if (work.flags_host[g] == 0) continue;
    absl::StatusOr<absl::Status> why = ExplainFlagged(included[g], model, layer, work);
    if (!why.ok()) return why.status();
    results[included[g]] = *std::move(why);
  }
  // The device's intervals between the launch's events. `wait` runs from the end of the input
  // copies to the host's enqueueing of the rest: the device waiting for the segment build the
  // copies did not cover (the whole build on the CPU backend, whose copies run inside the
  // enqueueing call). Host time, so it goes to prep, not kernel.
  // Without copies before the build there is no wait, and no copy_in: inputs in a GPU region are
  // copied by the checks. The attention's events are recorded on sampled launches only.
  enum { kTotal, kCopyIn, kWait, kAttend, kCopyOut, kIntervals };
  const std::pair<const kernels::Event*, const kernels::Event*> between[kIntervals] = {
      {events_.start.get(), events_.end.get()},
      {events_.start.get(), events_.copied_in.get()},
      {events_.copied_in.get(), events_.built.get()},
      {events_.attend_begin.get(), events_.attend_end.get()},
      {events_.attend_end.get(), events_.end.get()}};
  const bool measured[kIntervals] = {true, work.copies_first, work.copies_first, work.phases,
                                     work.phases};
  absl::Duration interval[kIntervals] = {};
  for (int i = 0; i < kIntervals; ++i) {
    if (!measured[i]) continue;
    absl::StatusOr<double> s = backend_.ElapsedSeconds(*between[i].first, *between[i].second);
    if (!s.ok()) return s.status();
    interval[i] = absl::Seconds(*s);
  }
  const absl::Duration wait = interval[kWait];
  StepTimings t;
  t.kernel = interval[kTotal] - wait;
  t.attend = interval[kAttend];
  t.copy_in = interval[kCopyIn];
  t.copy_out = interval[kCopyOut];
  // Host work before the first device work (the input copies, else the compute), the device's
  // wait for the build, and enqueueing the rest where it outlasted the device work after the
  // copies (on the CPU backend the device work runs inside the enqueueing calls).
  const absl::Time device_from = work.copies_first ? work.inputs_at : prepared_at;
  t.prep = (device_from - start) + wait +
           std::max(absl::ZeroDuration(), (enqueued_at - prepared_at) - (t.kernel - t.copy_in));
  for (size_t i : included) {
    if (!results[i].ok()) continue;  // flagged by the device's checks
    results[i]->timings.kernel = t.kernel;
    results[i]->timings.attend = t.attend;
    results[i]->timings.prep = t.prep;
    results[i]->timings.copy_in = t.copy_in;
    results[i]->timings.copy_out = t.copy_out;
    results[i]->timings.phases = work.phases;
  }
  return absl::OkStatus();
}

// What one launch is made of, known before anything is written: the batch's spans, array
// lengths and per-row byte sizes.
struct StepExecutor::LaunchPlan {
  const LayerSpec* spec = nullptr;
  int32_t heads = 0;
  int qk = 0;
  size_t row_bytes = 0;       // one bf16 KV row
  size_t pool_row_bytes = 0;  // one row as the pool stores it (RowBytes)
  OutputFormat format = OutputFormat::kBf16;
  bool inverse_rope = false;
  bool mx_q = false;  // the scheduler batches one q format
  bool want_lse = false;
  size_t groups = 0;  // the launch's steps (args.included)
  size_t spans = 0;
  SegmentCounts counts;
  size_t rows = 0;  // T
  size_t q_lanes = 0, q_bytes = 0, q_scale_bytes = 0, kv_bytes = 0;
  size_t out_row = 0, scale_row = 0, lse_row = 0;  // output bytes per row
  std::vector<float> sink;
  SegmentShape shape() const { return SegmentShape{*spec, window, row_bytes}; }
  int32_t window = 0;
};

// Where a launch's host arrays lie in the arena.
struct StepExecutor::StagedArena {
  SegmentArrays arrays;
  DeviceTargets targets;
  std::span<kernels::CheckRange> ranges;  // kChecksPerSpan per span
  std::span<kernels::RowWrite> new_rows;  // one per slot, in its order
  std::span<uint32_t> flags;              // in the arena, zeroed by BuildArrays
  float* sink = nullptr;
};

absl::Status StepExecutor::PrepareLaunch(const LaunchArgs& args, DeviceWork& work,
                                         std::vector<absl::StatusOr<StepResult>>& results) {
  const LaunchPlan plan = PlanLaunch(args, work);
  SMLA_RETURN_IF_ERROR(SizeBuffers(plan));
  CopyStats stats;
  absl::StatusOr<StagedArena> staged = StageInputs(plan, work, stats);
  if (!staged.ok()) return staged.status();
  work.outputs_in_place = OutputsInPlace(args, plan);
  SMLA_RETURN_IF_ERROR(SizeOutputs(plan, work));
  // The input copies do not need the segments: they start now, and the segments are built
  // while the device copies (other bytes of the arena than the gathered inputs).
  work.inputs_at = absl::Now();
  work.copies_first =
      !work.to_device.empty() || (work.expand.vectors > 0 && !work.expand_after_checks);
  SMLA_RETURN_IF_ERROR(EnqueueInputs(work));
  BuildArrays(plan, *staged, work);
  FillDeviceParams(args, plan, *staged, work);
  PlanOutputs(args, plan, work, results, stats);
  NoteCopies(stats);
  return absl::OkStatus();
}

StepExecutor::LaunchPlan StepExecutor::PlanLaunch(const LaunchArgs& args, DeviceWork& work) const {
  const ModelProfile& profile = args.model.profile();
  const StepRequest& head = *args.steps[args.included[0]];
  LaunchPlan p;
  p.spec = &profile.layers[args.layer];
  p.window = profile.swa_window;
  p.heads = args.model.config().heads_per_rank;
  p.qk = kernels::QkWidth(profile.geometry);
  p.row_bytes = size_t{2} * p.qk;
  const kernels::MutableCacheView& pool = args.model.store().cache();
  p.pool_row_bytes = static_cast<size_t>(kernels::RowBytes(pool.format, pool.geometry));
  p.format = head.output_format;
  p.inverse_rope = head.inverse_rope;
  p.mx_q = head.q_format == QFormat::kMxfp8;
  for (size_t g = 0; g < args.included.size(); ++g) {
    const size_t i = args.included[g];
    const StepRequest& r = *args.steps[i];
    p.want_lse = p.want_lse || r.want_lse;
    for (size_t si = 0; si < r.spans.size(); ++si) {
      work.spans.push_back(
          SpanRef{&r.spans[si], args.prepared[i].get(), si, static_cast<int32_t>(g)});
      work.span_step.push_back(i);
    }
  }
  p.groups = args.included.size();
  p.spans = work.spans.size();
  p.counts = CountSegments(p.shape(), work.spans);
  p.rows = static_cast<size_t>(p.counts.rows);
  p.q_lanes = p.rows * p.heads * p.qk;
  p.q_bytes = p.q_lanes * (p.mx_q ? 1 : 2);
  p.q_scale_bytes = p.mx_q ? p.q_lanes / kernels::kMxQueryGroup : 0;
  p.kv_bytes = p.rows * p.row_bytes;
  p.out_row = size_t{p.format == OutputFormat::kBf16 ? 2u : 1u} * p.heads * kernels::kValueWidth;
  p.scale_row = static_cast<size_t>(p.heads) * kernels::kMxGroupsPerHead;
  p.lse_row = static_cast<size_t>(p.heads) * sizeof(float);
  if (profile.has_sink) p.sink = args.model.LayerSink(args.layer);
  return p;
}

// Backend buffers: queries (bf16; MXFP8 ones are copied in as codes and scales and expanded into
// q_ on the device); KV rows, then compressed entries (the order of `slots`); outputs.
absl::Status StepExecutor::SizeBuffers(const LaunchPlan& p) {
  SMLA_RETURN_IF_ERROR(Ensure(q_, p.q_lanes * 2));
  if (p.mx_q) {
    SMLA_RETURN_IF_ERROR(Ensure(q_codes_, p.q_bytes));
    SMLA_RETURN_IF_ERROR(Ensure(q_scales_, p.q_scale_bytes));
  }
  SMLA_RETURN_IF_ERROR(Ensure(rows_, static_cast<size_t>(p.counts.slots()) * p.row_bytes));
  SMLA_RETURN_IF_ERROR(Ensure(old_rows_, static_cast<size_t>(p.counts.slots()) * p.pool_row_bytes));
  SMLA_RETURN_IF_ERROR(Ensure(ids_, static_cast<size_t>(p.counts.chosen_ids) * sizeof(int32_t)));
  return absl::OkStatus();
}

bool StepExecutor::OutputsInPlace(const LaunchArgs& args, const LaunchPlan& p) const {
  if (args.included.size() != 1) return false;
  const StepRequest& r = *args.steps[args.included[0]];
  auto writable = [this](std::span<uint8_t> dst, size_t bytes) {
    if (dst.size() != bytes || !IsAligned(dst.data(), 16)) return false;
    return !pinned() || CopiesFrom(dst.data(), dst.size()) == HostRanges::Kind::kDevice;
  };
  return writable(r.destination.out, p.rows * p.out_row) &&
         (p.format != OutputFormat::kMxfp8 ||
          writable(r.destination.mx_scales, p.rows * p.scale_row)) &&
         (!r.want_lse || writable(r.destination.lse, p.rows * p.lse_row));
}

const uint8_t* StepExecutor::QueriesInPlace(const LaunchPlan& p, const DeviceWork& work) {
  if (p.mx_q || work.span_device.empty()) return nullptr;
  const uint8_t* const first = work.span_device[0].q_from;
  if (first == nullptr || !IsAligned(first, 16)) return nullptr;
  const uint8_t* next = first;
  for (size_t k = 0; k < work.spans.size(); ++k) {
    if (work.span_device[k].q_from != next) return nullptr;
    next += work.spans[k].input->q.size();
  }
  return first;
}

absl::Status StepExecutor::SizeOutputs(const LaunchPlan& p, const DeviceWork& work) {
  if (work.outputs_in_place) return absl::OkStatus();
  SMLA_RETURN_IF_ERROR(Ensure(out_, p.rows * p.out_row));
  if (p.format == OutputFormat::kMxfp8) SMLA_RETURN_IF_ERROR(Ensure(scales_, p.rows * p.scale_row));
  if (p.want_lse) SMLA_RETURN_IF_ERROR(Ensure(lse_, p.rows * p.lse_row));
  return absl::OkStatus();
}

HostRanges::Kind StepExecutor::CopiesFrom(const void* data, size_t bytes) const {
  const HostRanges::Kind kind = host_ranges_.Find(data, bytes, ranges_memo_);
  // Without page-locked memory every copy is a memcpy: any host memory will do.
  return kind == HostRanges::Kind::kNone && !pinned() ? HostRanges::Kind::kHost : kind;
}

bool StepExecutor::CopiesDirect(std::span<const uint8_t> bytes) const {
  return CopiesFrom(bytes.data(), bytes.size()) != HostRanges::Kind::kNone;
}

// Inputs are copied from where they lie when the backend can copy from there (page-locked
// memory; any memory where copies are memcpys), else gathered into the arena first. The arena
// also holds the slot lists and segments (built in place), positions and the sink.
absl::StatusOr<StepExecutor::StagedArena> StepExecutor::StageInputs(const LaunchPlan& p,
                                                                    DeviceWork& work,
                                                                    CopyStats& stats) {
  const bool compressed = p.spec->has_compressed();
  enum Kind { kQ = 0, kKv = 1, kCompressed = 2, kQScales = 3, kIds = 4, kKinds = 5 };
  size_t staged[kKinds] = {0, 0, 0, 0, 0};
  auto ids_bytes = [](const SpanInput& s) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.topk.data()),
                                    s.topk.size_bytes());
  };
  for (const SpanRef& ref : work.spans) {
    const SpanInput& s = *ref.input;
    if (!CopiesDirect(ids_bytes(s))) staged[kIds] += s.topk.size_bytes();
    if (!CopiesDirect(s.q)) staged[kQ] += s.q.size();
    if (!CopiesDirect(s.q_scales)) staged[kQScales] += s.q_scales.size();
    if (!CopiesDirect(s.kv_rows)) staged[kKv] += s.kv_rows.size();
    if (compressed && !CopiesDirect(s.compressed_rows)) {
      staged[kCompressed] += s.compressed_rows.size();
    }
  }

  const size_t T = p.rows;
  size_t total = 0;
  auto take = [&total](size_t bytes) {
    const size_t at = total;
    total = AlignUp(total + bytes, 64);
    return at;
  };
  // The arrays that go up in one copy: the checks' arrays first (CheckLayout), then the slot
  // lists and segments, positions and the sink.
  const CheckLayout cl = CheckLayout::Of(p.counts, p.spans);
  take(cl.bytes);
  // The main segment (windows or chosen entries), and the extra one of top-k layers, are written
  // into arrays_ on the device: the arena holds none of them.
  const bool device_extra = p.spec->kind == LayerKind::kSwaTopK;
  const auto extra_n = static_cast<size_t>(device_extra ? 0 : p.counts.extra_indices);
  const size_t o_main_indptr = take((T + 1) * sizeof(int32_t));
  const size_t extra_rows = compressed ? T + 1 : 0;
  const size_t o_extra_indptr = take(extra_rows * sizeof(int32_t));
  const size_t o_extra = take(extra_n * sizeof(int32_t));
  const size_t o_positions = take(p.inverse_rope ? T * sizeof(int32_t) : 0);
  const size_t o_sink = take(p.sink.size() * sizeof(float));
  const size_t uploaded = total;
  // Host only: the slots and their steps (the RowWrites carry them up), the flags the device
  // writes, the gathered inputs.
  const size_t o_slots = take(static_cast<size_t>(p.counts.slots()) * sizeof(int64_t));
  const size_t o_groups = take(static_cast<size_t>(p.counts.slots()) * sizeof(int32_t));
  const size_t o_flags = take(p.groups * sizeof(uint32_t));
  size_t o_stage[kKinds];
  for (int k = 0; k < kKinds; ++k) o_stage[k] = take(staged[k]);
  absl::StatusOr<uint8_t*> arena_or = HostArena(total);
  if (!arena_or.ok()) return arena_or.status();
  uint8_t* const arena = *arena_or;
  // The segments the device writes, after the upload in arrays_.
  const size_t main_at = AlignUp(uploaded, 64);
  const size_t extra_at =
      AlignUp(main_at + static_cast<size_t>(p.counts.main_indices) * sizeof(int32_t), 64);
  const size_t device_extra_n = device_extra ? static_cast<size_t>(p.counts.extra_indices) : 0;
  SMLA_RETURN_IF_ERROR(Ensure(arrays_, extra_at + device_extra_n * sizeof(int32_t)));
  work.arrays_upload = kernels::CopyOp{arrays_.data(), arena, uploaded};
  work.mirror = kernels::HostMirror{arena, arrays_.as<uint8_t>(), uploaded};
  auto i32 = [arena](size_t off, size_t n) {
    return std::span<int32_t>(reinterpret_cast<int32_t*>(arena + off), n);
  };

  StagedArena out;
  SegmentArrays& arrays = out.arrays;
  arrays.slots = std::span<int64_t>(reinterpret_cast<int64_t*>(arena + o_slots),
                                    static_cast<size_t>(p.counts.slots()));
  arrays.main_indptr = i32(o_main_indptr, T + 1);
  arrays.extra_indptr = i32(o_extra_indptr, extra_rows);
  arrays.extra_indices = i32(o_extra, extra_n);
  arrays.positions = i32(o_positions, p.inverse_rope ? T : 0);
  arrays.slot_groups = i32(o_groups, static_cast<size_t>(p.counts.slots()));
  out.sink = reinterpret_cast<float*>(arena + o_sink);
  PlaceChecks(p, cl, arena, main_at, extra_at, reinterpret_cast<uint32_t*>(arena + o_flags), out,
              work);

  // Input copies, one per contiguous range of each kind (a packed request's kind is one range).
  uint8_t* const dev[kKinds] = {p.mx_q ? q_codes_.as<uint8_t>() : q_.as<uint8_t>(),
                                rows_.as<uint8_t>(), rows_.as<uint8_t>() + p.kv_bytes,
                                q_scales_.as<uint8_t>(), ids_.as<uint8_t>()};
  // Per kind, so that a kind's copies merge where the spans' ranges are contiguous.
  std::vector<kernels::CopyOp> copies[kKinds];
  size_t dev_off[kKinds] = {}, stage_off[kKinds] = {};
  // The input's address in a GPU region, which the checks read and copy from; else null, once
  // its copy (from where it lies, or from the arena where gathered) is listed.
  auto input = [&](Kind k, std::span<const uint8_t> src) -> const uint8_t* {
    if (src.empty()) return nullptr;
    const void* from = src.data();
    const HostRanges::Kind where = CopiesFrom(src.data(), src.size());
    const bool in_place = where != HostRanges::Kind::kNone;
    (in_place ? stats.in_direct : stats.in_gathered) += static_cast<int64_t>(src.size());
    const size_t at = dev_off[k];
    dev_off[k] += src.size();
    if (where == HostRanges::Kind::kDevice) return src.data();
    if (!in_place) {
      uint8_t* stage = arena + o_stage[k] + stage_off[k];
      std::memcpy(stage, src.data(), src.size());
      stage_off[k] += src.size();
      from = stage;
    }
    AddCopy(copies[k], dev[k] + at, from, src.size());
    return nullptr;
  };
  for (const SpanRef& ref : work.spans) {
    const SpanInput& s = *ref.input;
    DeviceWork::SpanDevice& d = work.span_device.emplace_back();
    d.q = dev[kQ] + dev_off[kQ];
    d.q_scales = dev[kQScales] + dev_off[kQScales];
    d.kv = dev[kKv] + dev_off[kKv];
    d.compressed = dev[kCompressed] + dev_off[kCompressed];
    d.ids = reinterpret_cast<int32_t*>(dev[kIds] + dev_off[kIds]);
    d.q_from = input(kQ, s.q);
    d.q_scales_from = input(kQScales, s.q_scales);
    d.kv_from = input(kKv, s.kv_rows);
    if (compressed) d.compressed_from = input(kCompressed, s.compressed_rows);
    work.span_ids.push_back(reinterpret_cast<const int32_t*>(input(kIds, ids_bytes(s))));
    work.expand_after_checks =
        work.expand_after_checks || d.q_from != nullptr || d.q_scales_from != nullptr;
  }
  work.q_in_place = QueriesInPlace(p, work);
  if (work.q_in_place != nullptr) stats.q_in_place = static_cast<int64_t>(p.q_bytes);
  SMLA_CHECK(dev_off[kQ] == p.q_bytes && dev_off[kQScales] == p.q_scale_bytes &&
                 dev_off[kKv] == p.kv_bytes &&
                 dev_off[kCompressed] == static_cast<size_t>(p.counts.compressed) * p.row_bytes &&
                 dev_off[kIds] == static_cast<size_t>(p.counts.chosen_ids) * sizeof(int32_t),
             "input sizes");
  for (int k = 0; k < kKinds; ++k) {
    work.to_device.insert(work.to_device.end(), copies[k].begin(), copies[k].end());
  }
  out.targets.span_ids = work.span_ids;
  if (p.mx_q) {
    work.expand.codes = q_codes_.as<uint8_t>();
    work.expand.scales = q_scales_.as<uint8_t>();
    work.expand.out = q_.data();
    work.expand.vectors = static_cast<int64_t>(T) * p.heads;
    work.expand.width = p.qk;
  }
  return out;
}

// The device checks' arrays: at the start of the arena (`host`, laid out as `l`) and of arrays_;
// the segments the device writes at `main_at` and `extra_at` in arrays_.
void StepExecutor::PlaceChecks(const LaunchPlan& p, const CheckLayout& l, uint8_t* host,
                               size_t main_at, size_t extra_at, uint32_t* flags_host,
                               StagedArena& out, DeviceWork& work) {
  SegmentArrays& arrays = out.arrays;
  const auto stale = static_cast<size_t>(p.counts.stale_blocks);
  arrays.table_blocks = std::span<const int32_t*>(reinterpret_cast<const int32_t**>(host),
                                                  static_cast<size_t>(p.counts.table_blocks));
  arrays.stale_blocks =
      std::span<int32_t>(reinterpret_cast<int32_t*>(host + l.stale), stale * kTableBlock);
  arrays.block_writes = std::span<kernels::TableBlockWrite>(
      reinterpret_cast<kernels::TableBlockWrite*>(host + l.writes), stale);
  arrays.chosen =
      std::span<kernels::TranslateRow>(reinterpret_cast<kernels::TranslateRow*>(host + l.rows),
                                       static_cast<size_t>(p.counts.chosen_rows));
  arrays.runs = std::span<kernels::PositionRun>(
      reinterpret_cast<kernels::PositionRun*>(host + l.runs), static_cast<size_t>(p.counts.runs));
  arrays.run_pages = std::span<int32_t>(reinterpret_cast<int32_t*>(host + l.run_pages),
                                        static_cast<size_t>(p.counts.run_pages));
  out.ranges = std::span<kernels::CheckRange>(
      reinterpret_cast<kernels::CheckRange*>(host + l.ranges), p.spans * kChecksPerSpan);
  out.new_rows =
      std::span<kernels::RowWrite>(reinterpret_cast<kernels::RowWrite*>(host + l.new_rows),
                                   static_cast<size_t>(p.counts.slots()));
  uint8_t* const dev = arrays_.as<uint8_t>();
  out.targets.ids = ids_.as<int32_t>();
  out.targets.main = reinterpret_cast<int32_t*>(dev + main_at);
  out.targets.extra = reinterpret_cast<int32_t*>(dev + extra_at);
  out.targets.table_blocks = reinterpret_cast<const int32_t* const*>(dev);
  out.targets.stale_blocks = reinterpret_cast<const int32_t*>(dev + l.stale);
  out.targets.run_pages = reinterpret_cast<const int32_t*>(dev + l.run_pages);
  out.flags = std::span<uint32_t>(flags_host, p.groups);
  work.check.ranges = reinterpret_cast<const kernels::CheckRange*>(dev + l.ranges);
  work.check.num_ranges = static_cast<int32_t>(out.ranges.size());
  work.check.entries.rows = reinterpret_cast<const kernels::TranslateRow*>(dev + l.rows);
  work.check.entries.num_rows = static_cast<int32_t>(p.counts.chosen_rows);
  work.check.entries.block_shift = kTableBlockShift;
  work.check.entries.num_block_writes = static_cast<int32_t>(stale);
  work.check.entries.block_writes =
      reinterpret_cast<const kernels::TableBlockWrite*>(dev + l.writes);
  work.check.entries.runs = reinterpret_cast<const kernels::PositionRun*>(dev + l.runs);
  work.check.entries.num_runs = static_cast<int32_t>(p.counts.runs);
  work.check.rows.rows = reinterpret_cast<const kernels::RowWrite*>(dev + l.new_rows);
  work.check.rows.num_rows = static_cast<int32_t>(out.new_rows.size());
  work.check.flags = flags_host;
  work.flags_host = flags_host;
}

// While the device copies the inputs: the slot lists and segments, each span's input ranges for
// the device's checks (MXFP8 codes and scales not NaN; bf16 queries only feed their own rows and
// are not checked) and the rows to write (KV and compressed rows bounded: RowWrites). Inputs in a
// GPU region are read there by their checks, which copy them (bf16 queries in a range that only
// copies, unless the attention reads them in place: QueriesInPlace).
void StepExecutor::BuildArrays(const LaunchPlan& p, const StagedArena& staged,
                               const DeviceWork& work) {
  BuildSegments(p.shape(), work.spans, p.counts, staged.targets, staged.arrays);
  std::fill(staged.flags.begin(), staged.flags.end(), 0u);
  // The rows in the order of `slots`: every span's KV rows, then every span's compressed rows,
  // each read where its span's lie (a GPU region, else their copy in rows_).
  size_t row = 0;
  auto rows_of = [&](const uint8_t* from, const uint8_t* copied, size_t bytes) {
    const uint8_t* at = from != nullptr ? from : copied;
    for (size_t off = 0; off < bytes; off += p.row_bytes, ++row) {
      SMLA_CHECK(row < staged.new_rows.size(), "rows counted");
      staged.new_rows[row] =
          kernels::RowWrite{reinterpret_cast<const uint16_t*>(at + off), staged.arrays.slots[row],
                            staged.arrays.slot_groups[row], 0};
    }
  };
  for (size_t k = 0; k < work.spans.size(); ++k) {
    const DeviceWork::SpanDevice& d = work.span_device[k];
    rows_of(d.kv_from, d.kv, work.spans[k].input->kv_rows.size());
  }
  for (size_t k = 0; k < work.spans.size(); ++k) {
    const DeviceWork::SpanDevice& d = work.span_device[k];
    rows_of(d.compressed_from, d.compressed, work.spans[k].input->compressed_rows.size());
  }
  SMLA_CHECK(row == staged.new_rows.size(), "rows counted");
  for (size_t k = 0; k < work.spans.size(); ++k) {
    const SpanInput& s = *work.spans[k].input;
    const DeviceWork::SpanDevice& d = work.span_device[k];
    const int32_t group = work.spans[k].group;
    auto range = [group](uint8_t* at, const uint8_t* from, size_t bytes,
                         kernels::InputCheck check) {
      // From the GPU region, copied to `at`; else read at `at`, where the input copies put it.
      return kernels::CheckRange{from != nullptr ? from : at, static_cast<int64_t>(bytes), check,
                                 group, from != nullptr ? at : nullptr};
    };
    const bool copy_q = d.q_from != nullptr && work.q_in_place == nullptr;
    const kernels::CheckRange ranges[kChecksPerSpan] = {
        range(d.q, d.q_from, p.mx_q || copy_q ? s.q.size() : 0,
              p.mx_q ? kernels::InputCheck::kE4m3Codes : kernels::InputCheck::kNone),
        range(d.q_scales, d.q_scales_from, s.q_scales.size(), kernels::InputCheck::kE8m0Scales)};
    std::copy_n(ranges, kChecksPerSpan, staged.ranges.data() + k * kChecksPerSpan);
  }
}

void StepExecutor::FillDeviceParams(const LaunchArgs& args, const LaunchPlan& p,
                                    const StagedArena& staged, DeviceWork& work) {
  const SegmentArrays& arrays = staged.arrays;
  std::span<const float> sink_view;
  if (!p.sink.empty()) {
    std::memcpy(staged.sink, p.sink.data(), p.sink.size() * sizeof(float));
    sink_view = std::span<const float>(staged.sink, p.sink.size());
  }
  ModelRuntime& model = args.model;
  work.check.rows.cache = model.store().cache();
  work.check.rows.copies = rows_.as<uint16_t>();
  work.check.rows.old = old_rows_.as<uint8_t>();
  work.new_rows = staged.new_rows;
  work.check.entries.page_shift =
      std::countr_zero(static_cast<uint32_t>(model.store().cache().rows_per_page));

  kernels::AttendParams& a = work.attend;
  a.num_rows = static_cast<int32_t>(p.rows);
  a.num_heads = p.heads;
  a.geometry = model.profile().geometry;
  a.q = work.q_in_place != nullptr ? work.q_in_place : q_.data();
  a.q_before_launch = work.q_in_place != nullptr;
  a.softmax_scale = model.config().softmax_scale;
  a.main.cache = model.store().cache().view();
  a.main.indptr = arrays.main_indptr;
  a.main.indices =
      std::span<const int32_t>(staged.targets.main, static_cast<size_t>(p.counts.main_indices));
  a.main.indices_on_device = true;
  a.main.sliding_window = p.spec->has_window();
  a.has_extra = p.spec->has_compressed();
  if (a.has_extra) {
    a.extra.cache = a.main.cache;
    a.extra.indptr = arrays.extra_indptr;
    a.extra.indices = arrays.extra_indices;
  }
  if (p.spec->kind == LayerKind::kSwaTopK) {
    a.extra.indices =
        std::span<const int32_t>(staged.targets.extra, static_cast<size_t>(p.counts.extra_indices));
    a.extra.indices_on_device = true;
  }
  a.sink = sink_view;
  // Each span's rows are consecutive rows of one sequence (a decode request's MTP rows share most
  // keys), so the launch's rows come in groups of the spans' greatest common row count; with
  // even groups the backend may pair rows over their shared keys.
  a.rows_per_group = 0;
  for (const SpanRef& sp : work.spans) {
    a.rows_per_group = std::gcd(a.rows_per_group, sp.input->num_rows);
  }
  if (p.inverse_rope) {
    SMLA_CHECK(args.rope.table != nullptr, "inverse RoPE without a table");
    a.epilogue.positions = arrays.positions;
    a.epilogue.cos_sin = args.rope.table->as<const float>();
    a.epilogue.num_positions = args.rope.positions;
  }
  a.out.format = p.format;
  const OutputDestination* in_place =
      work.outputs_in_place ? &args.steps[args.included[0]]->destination : nullptr;
  uint8_t* const out = in_place ? in_place->out.data() : out_.as<uint8_t>();
  if (p.format == OutputFormat::kBf16) {
    a.out.bf16 = out;
  } else {
    a.out.mx_data = out;
    a.out.mx_scales = in_place ? in_place->mx_scales.data() : scales_.as<uint8_t>();
  }
  a.out.lse = !p.want_lse ? nullptr
              : in_place  ? reinterpret_cast<float*>(in_place->lse.data())
                          : lse_.as<float>();
  // Slots come from page tables of this pool; the arrays went up with the arena's.
  a.ids_in_range = true;
  a.arrays = work.mirror;
}

// Each step's rows go back to its own destination when it named one, else to its result (none
// to copy where the attention wrote them in place).
void StepExecutor::PlanOutputs(const LaunchArgs& args, const LaunchPlan& p, DeviceWork& work,
                               std::vector<absl::StatusOr<StepResult>>& results, CopyStats& stats) {
  size_t row0 = 0;
  auto output = [&]<typename V>(std::span<uint8_t> dst, V& fallback, const uint8_t* src,
                                size_t bytes) {
    void* to = dst.data();
    if (dst.empty()) {
      fallback.resize(bytes / sizeof(typename V::value_type));
      to = fallback.data();
    }
    SMLA_CHECK(dst.empty() || dst.size() == bytes, "output destination size");
    // A result vector is plain memory: copied direct only where copies are memcpys.
    const HostRanges::Kind where = CopiesFrom(to, bytes);
    const bool locked = where != HostRanges::Kind::kNone;
    (locked ? stats.out_direct : stats.out_pageable) += static_cast<int64_t>(bytes);
    std::vector<kernels::CopyOp>& list = where == HostRanges::Kind::kDevice ? work.out_on_device
                                         : locked                           ? work.to_host
                                                                            : work.to_pageable;
    list.push_back(kernels::CopyOp{to, src, bytes});
  };
  for (size_t i : args.included) {
    const StepRequest& r = *args.steps[i];
    const size_t n = static_cast<size_t>(StepRows(r));
    results[i] = StepResult();
    StepResult& res = *results[i];
    res.num_rows = static_cast<int32_t>(n);
    res.num_heads = p.heads;
    res.output_format = p.format;
    const OutputDestination& dst = r.destination;
    if (work.outputs_in_place) {
      const size_t scales = p.format == OutputFormat::kMxfp8 ? n * p.scale_row : 0;
      stats.out_in_place +=
          static_cast<int64_t>(n * p.out_row + scales + (r.want_lse ? n * p.lse_row : 0));
      row0 += n;
      continue;
    }
    output(dst.out, res.out, out_.as<uint8_t>() + row0 * p.out_row, n * p.out_row);
    if (p.format == OutputFormat::kMxfp8) {
      output(dst.mx_scales, res.mx_scales, scales_.as<uint8_t>() + row0 * p.scale_row,
             n * p.scale_row);
    }
    if (r.want_lse) output(dst.lse, res.lse, lse_.as<uint8_t>() + row0 * p.lse_row, n * p.lse_row);
    row0 += n;
  }
}

void StepExecutor::NoteCopies(const CopyStats& s) {
  spdlog::debug(
      "launch copies: inputs {} B in place, {} B gathered; outputs {} B to registered "
      "memory, {} B to plain memory",
      s.in_direct, s.in_gathered, s.out_direct, s.out_pageable);
  // Where it matters (a page-locked backend), on the first launch and each time the paths
  // change: gathered inputs cost host copies, outputs to plain memory slow device-to-host copies.
  const int paths = (s.in_gathered > 0 ? 1 : 0) | (s.out_pageable > 0 ? 2 : 0);
  if (pinned() && paths != logged_copy_paths_) {
    logged_copy_paths_ = paths;
    spdlog::info(
        "launch copies now: inputs {} B in place, {} B gathered; outputs {} B to "
        "registered memory, {} B to plain memory",
        s.in_direct, s.in_gathered, s.out_direct, s.out_pageable);
  }
  absl::MutexLock lock(&stats_mu_);
  last_copy_stats_ = s;
}

absl::StatusOr<absl::Status> StepExecutor::ExplainFlagged(size_t step, const ModelRuntime& model,
                                                          int32_t layer, const DeviceWork& w) {
  const LayerSpec& spec = model.profile().layers[layer];
  const int32_t heads = model.config().heads_per_rank;
  const int qk = kernels::QkWidth(model.profile().geometry);
  for (size_t k = 0; k < w.spans.size(); ++k) {
    if (w.span_step[k] != step) continue;
    const SpanRef& ref = w.spans[k];
    const DeviceWork::SpanDevice& d = w.span_device[k];
    // The inputs as the device read them: its copies, which the client cannot touch.
    SpanInput span = *ref.input;
    std::vector<int32_t> ids(span.topk.size());
    std::vector<uint8_t> kv(span.kv_rows.size()), compressed(span.compressed_rows.size());
    std::vector<uint8_t> q, q_scales(span.q_scales.size());
    if (!span.q_scales.empty()) q.resize(span.q.size());  // MXFP8 codes; bf16 is not checked
    const kernels::CopyOp back[] = {{ids.data(), d.ids, ids.size() * sizeof(int32_t)},
                                    {kv.data(), d.kv, kv.size()},
                                    {compressed.data(), d.compressed, compressed.size()},
                                    {q.data(), d.q, q.size()},
                                    {q_scales.data(), d.q_scales, q_scales.size()}};
    for (const kernels::CopyOp& c : back) {
      if (c.bytes > 0) SMLA_RETURN_IF_ERROR(backend_.CopyToHost(c.dst, c.src, c.bytes, *stream_));
    }
    SMLA_RETURN_IF_ERROR(backend_.Synchronize(*stream_));
    span.topk = ids;
    span.kv_rows = kv;
    span.compressed_rows = compressed;
    if (!span.q_scales.empty()) {
      span.q = q;
      span.q_scales = q_scales;
    }
    for (absl::Status why :
         {ExplainChosenEntries(span, ref.index, spec), CheckRowsFinite(span, ref.index, qk),
          CheckQueryCodes(span, ref.index, heads, qk)}) {
      if (!why.ok()) return why;
    }
  }
  return absl::InternalError("the device flagged a step whose inputs all check out");
}

// The checks wrote every row whatever they found (RowWrites): a flagged step's slots get back the
// bytes saved before the writes, so that it changes nothing, also where it rewrote stored
// positions (a step restarting back). Its slots past the stored length would never be read
// before being written again; they are put back too, which costs nothing extra to get right.
absl::Status StepExecutor::RestoreFlagged(const DeviceWork& w) {
  const kernels::RowWrites& r = w.check.rows;
  const kernels::MutableCacheView& c = r.cache;
  const int64_t row_bytes = kernels::RowBytes(c.format, c.geometry);
  auto* base = static_cast<uint8_t*>(c.base);
  std::vector<kernels::CopyOp> back;
  for (size_t i = 0; i < w.new_rows.size(); ++i) {
    const kernels::RowWrite& row = w.new_rows[i];
    if (w.flags_host[row.group] == 0) continue;
    const uint8_t* saved = r.old + static_cast<int64_t>(i) * row_bytes;
    kernels::SlotPart parts[2];
    const int n =
        kernels::SlotParts(c.format, c.geometry, row.slot, c.rows_per_page, c.pitch_bytes, parts);
    for (int part = 0; part < n; ++part) {
      back.push_back(kernels::CopyOp{base + parts[part].offset, saved,
                                     static_cast<size_t>(parts[part].bytes)});
      saved += parts[part].bytes;
    }
  }
  if (back.empty()) return absl::OkStatus();
  SMLA_RETURN_IF_ERROR(backend_.CopyBatch(back, kernels::CopyDirection::kOnDevice, *stream_));
  return backend_.Synchronize(*stream_);
}

absl::Status StepExecutor::EnqueueInputs(const DeviceWork& w) {
  if (!w.copies_first) return absl::OkStatus();
  kernels::Stream& stream = *stream_;
  SMLA_RETURN_IF_ERROR(backend_.RecordEvent(*events_.start, stream));
  SMLA_RETURN_IF_ERROR(backend_.CopyBatch(w.to_device, kernels::CopyDirection::kToDevice, stream));
  // MXFP8 queries are expanded as part of bringing the inputs in (copy_in's time), before the
  // segment build that the device may wait for.
  if (w.expand.vectors > 0 && !w.expand_after_checks) {
    SMLA_RETURN_IF_ERROR(backend_.ExpandMxfp8Query(w.expand, stream));
  }
  return backend_.RecordEvent(*events_.copied_in, stream);
}

absl::Status StepExecutor::EnqueueCompute(const DeviceWork& w) {
  kernels::Stream& stream = *stream_;
  SMLA_RETURN_IF_ERROR(
      backend_.RecordEvent(w.copies_first ? *events_.built : *events_.start, stream));
  // From a page-locked arena the arrays go up in a copy kernel, which reads the arena in place:
  // a copy-engine copy costs as long, and the checking kernel then waits for its hand-over
  // instead of starting as it ends (docs/architecture.md, "Kernels that start early").
  const kernels::CopyOp& c = w.arrays_upload;
  SMLA_RETURN_IF_ERROR(pinned()
                           ? backend_.CopyBatch({&c, 1}, kernels::CopyDirection::kOnDevice, stream)
                           : backend_.CopyToDevice(c.dst, c.src, c.bytes, stream));
  SMLA_RETURN_IF_ERROR(backend_.CheckInputs(w.check, stream));
  if (w.expand.vectors > 0 && w.expand_after_checks) {
    SMLA_RETURN_IF_ERROR(backend_.ExpandMxfp8Query(w.expand, stream));
  }
  if (w.phases) SMLA_RETURN_IF_ERROR(backend_.RecordEvent(*events_.attend_begin, stream));
  SMLA_RETURN_IF_ERROR(backend_.Attend(w.attend, stream));
  if (w.phases) SMLA_RETURN_IF_ERROR(backend_.RecordEvent(*events_.attend_end, stream));
  return absl::OkStatus();
}

absl::Status StepExecutor::EnqueueOutputs(const DeviceWork& w) {
  kernels::Stream& stream = *stream_;
  SMLA_RETURN_IF_ERROR(backend_.CopyBatch(w.to_host, kernels::CopyDirection::kToHost, stream));
  SMLA_RETURN_IF_ERROR(
      backend_.CopyBatch(w.out_on_device, kernels::CopyDirection::kOnDevice, stream));
  for (const kernels::CopyOp& c : w.to_pageable) {
    SMLA_RETURN_IF_ERROR(backend_.CopyToHost(c.dst, c.src, c.bytes, stream));
  }
  return backend_.RecordEvent(*events_.end, stream);
}

}  // namespace smla::server
