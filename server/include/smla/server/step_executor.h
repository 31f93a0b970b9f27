// Runs batches of steps on the backend (the BatchRunner behind the scheduler): per step,
// validation against stored state and page reservation (KvStore::Prepare), in queue order; then
// the launch: inputs outside registered memory gathered into page-locked memory and the input
// copies enqueued (top-k ids among them); while the device copies, the slot lists, segments and
// the arrays of the device's checks are built into the same page-locked memory
// (segment_builder.h); then the rest of the device work back to back (those arrays up in one
// copy, which WriteRows and Attend read too | CheckInputs: every step's KV rows, compressed rows
// and MXFP8 queries checked, every chosen entry turned into a slot and checked against what its
// row may see, every window written | one WriteRows for every new KV row and compressed entry,
// skipping the rows of the steps the checks flagged | one Attend over all rows | the copies back,
// the flags handed to the host by the row writes), with events around it (and between the parts on
// sampled launches); Synchronize; a flagged step is answered with its error (its outputs were
// written like the others' and are not answered) and aborted: it changed nothing. The others are
// committed, their outputs sliced back to each step. Inputs inside a registered range of host
// memory (host_ranges(): a client's shared memory the backend page-locked) are copied to the device
// directly, one copy per contiguous range; inputs in a GPU region are read there by CheckInputs,
// which copies them as it checks them, except bf16 queries that lie one after another in row
// order, which the attention reads in place (QueriesInPlace); a launch of one step whose outputs go
// to a GPU region has the attention write them there (OutputsInPlace), and outputs to one otherwise
// are copied by one copy kernel (CopyDirection::kOnDevice).
//
// Each row's segments are built here: the main segment is the SWA window ending at the row's
// own position (min(p+1, W) keys, so the draft rows of a span see each other causally; written
// on the device from the span's page list) or the client's chosen positions translated to slots
// (-1 stays a sentinel); the extra segment is the chosen compressed entries translated to
// slots, or every entry the row may see (entries 0..floor((p+1)/r)-1) on dense layers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "smla/kernels/backend.h"
#include "smla/server/config.h"
#include "smla/server/host_ranges.h"
#include "smla/server/kv_store.h"
#include "smla/server/model_profile.h"
#include "smla/server/model_runtime.h"
#include "smla/server/scheduler.h"
#include "smla/server/segment_builder.h"

namespace smla::server {

class StepExecutor : public BatchRunner {
 public:
  // `models` (in index order: models[i]->index() == i) outlive the executor; the executor owns
  // its stream and staging buffers. The attention's and the output copies' events are recorded
  // on one launch in `phase_timings_every` (ServerConfig).
  static absl::StatusOr<std::unique_ptr<StepExecutor>> Create(
      kernels::Backend& backend, const std::vector<ModelRuntime*>& models,
      int32_t phase_timings_every = 1);

  // One empty-row Attend per model, so that the first real step pays no start-up cost.
  absl::Status WarmUp();

  std::vector<absl::StatusOr<StepResult>> RunBatch(
      std::span<const StepRequest* const> steps) override;

  // False once an Attend, a write, a copy or a Synchronize failed.
  bool healthy() const { return healthy_.load(); }

  kernels::Stream& stream() { return *stream_; }

  // Host ranges the backend has page-locked (the core adds and removes them with the backend's
  // RegisterHostMemory / UnregisterHostMemory).
  HostRanges& host_ranges() { return host_ranges_; }

  // Where the last launch's copies went through (a copy inside a registered range, or any copy
  // where the backend has no page-locked memory, is direct). Bytes of each kind.
  struct CopyStats {
    int64_t in_direct = 0;     // inputs copied from where they lie
    int64_t in_gathered = 0;   // inputs gathered into the page-locked arena first
    int64_t out_direct = 0;    // outputs copied into registered (or any, see above) memory
    int64_t out_pageable = 0;  // outputs copied into plain memory (the runtime stages them)
    int64_t out_in_place = 0;  // outputs the attention wrote where they go (OutputsInPlace)
    int64_t q_in_place = 0;    // bf16 queries the attention read where they lie (QueriesInPlace)
  };
  CopyStats last_copy_stats() const {
    absl::MutexLock lock(&stats_mu_);
    return last_copy_stats_;
  }

 private:
  struct Events {
    std::unique_ptr<kernels::Event> start, copied_in, built, attend_begin, attend_end, end;
  };
  struct LaunchArgs;  // one launch's inputs (step_executor.cc)
  struct DeviceWork;  // what a launch enqueues (step_executor.cc)

  StepExecutor(kernels::Backend& backend, std::unique_ptr<kernels::Stream> stream, Events events,
               const std::vector<ModelRuntime*>& models);
  absl::Status Ensure(kernels::Buffer& buffer, size_t bytes);
  // Host bytes for a launch's arrays and gathered inputs: page-locked where the backend has
  // such memory (pinned() says which), else plain memory; 64-byte aligned.
  absl::StatusOr<uint8_t*> HostArena(size_t bytes);
  bool pinned() const { return host_pinned_ok_; }
  // Runs the launch for the prepared steps (indices into `steps`), filling their results.
  // `rope` is the table the steps were checked against.
  absl::Status Launch(ModelRuntime& model, int32_t layer, const ModelRuntime::Rope& rope,
                      std::span<const StepRequest* const> steps, std::span<const size_t> included,
                      std::span<const std::unique_ptr<PreparedStep>> prepared,
                      std::vector<absl::StatusOr<StepResult>>& results);
  // The host part of a launch: buffers, input gathering, the arrays of the device work, result
  // storage. Enqueues the input copies (EnqueueInputs) before it builds the arrays, so that the
  // build overlaps the copies.
  absl::Status PrepareLaunch(const LaunchArgs& args, DeviceWork& work,
                             std::vector<absl::StatusOr<StepResult>>& results);
  // PrepareLaunch's phases, in order.
  struct LaunchPlan;   // the batch's spans and sizes (step_executor.cc)
  struct StagedArena;  // where the host arrays lie in the arena
  struct CheckLayout;  // where the device checks' arrays lie (step_executor.cc)
  LaunchPlan PlanLaunch(const LaunchArgs& args, DeviceWork& work) const;
  absl::Status SizeBuffers(const LaunchPlan& plan);
  // Whether the attention writes the launch's outputs where they go, with no copy after it: a
  // launch of one step whose every output names a destination the device can write (16-byte
  // aligned, as the kernels' widest stores; in a GPU region, or anywhere on a backend without
  // page-locked memory, whose device memory is host memory). Known once the arena is placed
  // (pinned()).
  bool OutputsInPlace(const LaunchArgs& args, const LaunchPlan& plan) const;
  // The launch's bf16 queries where they lie, when every span's are in a GPU region, one after
  // another in row order and 16-byte aligned (the attention's loads); else null.
  static const uint8_t* QueriesInPlace(const LaunchPlan& plan, const DeviceWork& work);
  // The launch's output buffers, where the outputs are not written in place.
  absl::Status SizeOutputs(const LaunchPlan& plan, const DeviceWork& work);
  absl::StatusOr<StagedArena> StageInputs(const LaunchPlan& plan, DeviceWork& work,
                                          CopyStats& stats);
  void PlaceChecks(const LaunchPlan& plan, const CheckLayout& layout, uint8_t* host, size_t main_at,
                   size_t extra_at, uint32_t* flags_host, StagedArena& out, DeviceWork& work);
  void BuildArrays(const LaunchPlan& plan, const StagedArena& staged, const DeviceWork& work);
  void FillDeviceParams(const LaunchArgs& args, const LaunchPlan& plan, const StagedArena& staged,
                        DeviceWork& work);
  void PlanOutputs(const LaunchArgs& args, const LaunchPlan& plan, DeviceWork& work,
                   std::vector<absl::StatusOr<StepResult>>& results, CopyStats& stats);
  // What the backend copies from or to in place: a registered range's kind (host memory for
  // any memory on a backend without page-locked memory), kNone where the copy must go through
  // the arena or plain memory. Remembers the last range found for the rest of the launch.
  HostRanges::Kind CopiesFrom(const void* data, size_t bytes) const;
  bool CopiesDirect(std::span<const uint8_t> bytes) const;
  // The start event, the input copies (and the MXFP8 expansion) and the event after them, where
  // any copy comes before the build; else nothing.
  absl::Status EnqueueInputs(const DeviceWork& work);
  // Puts back the slots the flagged steps' rows were written to (RowWrites::old), and waits.
  absl::Status RestoreFlagged(const DeviceWork& work);
  // The error of a step the device flagged, from its inputs as the device read them.
  absl::StatusOr<absl::Status> ExplainFlagged(size_t step, const ModelRuntime& model, int32_t layer,
                                              const DeviceWork& work);
  // Keeps the launch's copy paths (last_copy_stats) and logs them.
  void NoteCopies(const CopyStats& stats);
  // Enqueues the upload, the checks (which write the rows) and the attention (between its timing
  // events on sampled launches).
  absl::Status EnqueueCompute(const DeviceWork& work);
  // Enqueues the copies back and the end event.
  absl::Status EnqueueOutputs(const DeviceWork& work);

  kernels::Backend& backend_;
  std::unique_ptr<kernels::Stream> stream_;
  Events events_;
  std::vector<ModelRuntime*> models_;  // by ModelRuntime::index()
  std::atomic<bool> healthy_{true};
  HostRanges host_ranges_;
  // The last registered range CopiesFrom found; cleared as each launch starts.
  mutable HostRanges::Memo ranges_memo_;
  // Buffers in backend memory, grown as needed; only the executor thread uses them.
  kernels::Buffer q_, rows_, out_, scales_, lse_;
  kernels::Buffer q_codes_, q_scales_;  // MXFP8 queries as copied in, before their expansion
  kernels::Buffer ids_;                 // top-k ids as copied in
  kernels::Buffer old_rows_;            // the bytes of the slots the checks write, saved first
  // The arena's arrays as uploaded (segments, the checks' arrays), then the chosen slots the
  // checks write.
  kernels::Buffer arrays_;
  kernels::Buffer host_pinned_;
  std::vector<uint64_t> host_plain_;  // where the backend has no page-locked memory
  bool host_pinned_ok_ = true;        // false once the backend said it has none
  mutable absl::Mutex stats_mu_;
  CopyStats last_copy_stats_ ABSL_GUARDED_BY(stats_mu_);
  int logged_copy_paths_ = -1;  // the copy paths last logged (NoteCopies); -1: none yet
  int32_t phase_timings_every_ = 1;
  int64_t launches_ = 0;  // launches so far: which ones record the phase events
};

}  // namespace smla::server
