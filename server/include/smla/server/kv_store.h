// The KV store of one served model: one pool (arena) in backend memory, the page allocator,
// and every sequence's per-layer page tables.
//
// Layout: the arena holds pages_total pages of the model's format, page rows and serving
// pitch. Every cache of the model (each layer's main cache and compressed cache) is a view of
// the whole arena, and its pages come from the one allocator, so pool capacity is one number.
// Per sequence and layer there is a page table for the main cache and one for the compressed
// cache:
// - window layers (SWA) keep a ring: only pages that hold positions from
//   length - swa_rollback - (W - 1) on, at most ceil((W - 1 + swa_rollback) / B) + 1 pages at
//   rest; a step of n rows may hold ceil((W - 1 + n) / B) + 1 more while it runs;
// - full caches (GLM) and compressed caches grow with the context.
// A compressed cache of ratio r holds floor(length / r) entries.
//
// Steps are two-phase so that a failed step changes nothing: Prepare validates positions and
// reserves every page a request needs (all or nothing), the caller writes and attends using the
// prepared slot tables, then Commit finishes the step or Abort undoes it. Prepare/Commit/Abort
// happen between BeginBatch and EndBatch; Truncate and Release wait until no batch is in flight,
// so the pages a running batch reads are never handed to anyone else.
//
// Prepare edits the live tables in place (no table is copied: at 128K context a compressed table
// is thousands of entries, and every request of every batch is prepared): it appends the new
// pages, or moves the pages past the step's end (a rollback) into the step, sets the table's
// length to the step's end and records what Abort needs to put everything back exactly. This is
// safe because the (sequence, layer) is marked busy until Commit/Abort (one step of it per batch)
// and nothing else edits tables while a batch is in flight. Length() and Pages() report the
// committed state throughout: for a busy (sequence, layer) they undo the pending step on the
// saved record rather than read the live table.
//
// The tables that chosen entries are translated through also have a copy on the device
// (device_tables.h), fitted to the host table's length after every change of it; the executor
// brings the copy up to date as it launches a step (PreparedStep::mirror).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "smla/kernels/backend.h"
#include "smla/server/config.h"
#include "smla/server/device_tables.h"
#include "smla/server/model_profile.h"
#include "smla/server/page_allocator.h"

namespace smla::server {

// One span of a step as the store sees it (validated for shape already).
struct SpanWrite {
  std::string_view sequence_id;
  int64_t first_position = 0;
  int32_t num_rows = 0;
};

// Page tables of one (sequence, layer).
struct LayerPages {
  int64_t length = 0;               // positions stored
  int64_t main_first_page = 0;      // logical page index of main[0] (> 0 once a window has slid)
  std::deque<int32_t> main;         // physical pages of logical pages main_first_page, ...
  std::vector<int32_t> compressed;  // physical pages of compressed entries 0, B, 2B, ...
};

class KvStore;

// One request's spans on one layer, validated and with its pages reserved, its changes already
// applied to the live tables (see above). Slot lookups read the tables as they are after the
// step. Commit or Abort it before EndBatch and before destroying it.
class PreparedStep {
 public:
  size_t num_spans() const { return spans_.size(); }
  // Slot of a main-cache position of span i; the position must be stored after the step.
  int64_t MainSlot(size_t span, int64_t position) const;
  // Slot of compressed entry e of span i.
  int64_t CompressedSlot(size_t span, int64_t entry) const;
  int32_t new_pages() const { return static_cast<int32_t>(new_pages_.size()); }
  // Span i's page tables (the live ones) as they are after the step, length included, for
  // building many slots at once (segment_builder.h); MainSlot/CompressedSlot read the same
  // tables one id at a time.
  const LayerPages& pages(size_t span) const { return *spans_[span].table; }
  int32_t rows_per_page() const { return rows_per_page_; }
  // Span i's committed length before the step: rows it writes at or past it fill slots no
  // committed position uses, so an aborted step leaves nothing visible there.
  int64_t committed_length(size_t span) const { return spans_[span].old_length; }
  // The device copy of span i's translated table (null on layers without chosen entries), and
  // the heap its blocks lie in. Whoever launches the step advances its `synced` as it uploads;
  // Abort keeps that advance (a flagged step's launch still wrote its blocks), which holds because
  // a launch that fails stops the core from serving (StepExecutor).
  TableMirror* mirror(size_t span) const { return spans_[span].mirror; }
  const TableHeap& table_heap() const { return *heap_; }

 private:
  friend class KvStore;
  // What the step did to one live table, enough to undo it exactly. Per table a step either
  // appends pages or releases trailing ones, never both.
  struct Span {
    void* sequence = nullptr;       // KvStore::Sequence*, stable while the batch runs
    LayerPages* table = nullptr;    // the sequence's live table of the layer
    TableMirror* mirror = nullptr;  // its translated table's device copy, or null
    int64_t old_length = 0;         // committed length before the step
    int32_t main_added = 0;         // pages appended to table->main (from new_pages_)
    int32_t compressed_added = 0;
    int32_t main_released = 0;  // release[0, main_released): popped off main's back, last first
    // Pages the step no longer needs, freed at Commit: main pages, then compressed pages, each
    // in the order popped off the back; Commit adds the window pages that slid out.
    std::vector<int32_t> release;
  };
  int32_t layer_ = 0;
  int32_t rows_per_page_ = 1;
  const TableHeap* heap_ = nullptr;
  std::vector<Span> spans_;
  std::vector<int32_t> new_pages_;
  std::string tenant_;  // whose quota the pages are charged to
  bool done_ = false;
};

class KvStore {
 public:
  // `config` must be resolved (ResolveModelConfig). Allocates the arena.
  static absl::StatusOr<std::unique_ptr<KvStore>> Create(const ModelConfig& config,
                                                         kernels::Backend& backend,
                                                         int32_t max_sequences);
  ~KvStore();

  const ModelConfig& config() const { return config_; }
  const ModelProfile& profile() const { return *profile_; }
  // The whole arena, for writers and as the cache of both segments.
  kernels::MutableCacheView cache() const { return cache_; }

  int64_t pages_total() const;
  int64_t pages_used() const;
  int64_t page_bytes() const { return cache_.pitch_bytes; }
  int64_t num_sequences() const;

  // Per-tenant quotas of this model (0 = none): live sequences and pool pages (pages held in
  // page tables plus pages reserved by a running step). Exceeding one is RESOURCE_EXHAUSTED
  // naming the quota. Set before serving.
  void SetTenantQuota(int32_t max_sequences, int64_t max_pages);
  int64_t tenant_pages(std::string_view tenant) const;
  int64_t tenant_sequences(std::string_view tenant) const;

  // Leases: releases (on every layer) the sequences last used before `cutoff`; waits for a
  // running batch. Creating, stepping, truncating or reading a sequence uses it. Returns the
  // (tenant, id) of each released sequence.
  std::vector<std::pair<std::string, std::string>> ReleaseIdle(absl::Time cutoff);

  // Sequences belong to a tenant: (tenant, id) is the key, and naming a sequence of another
  // tenant is the same as naming one that does not exist (NOT_FOUND), so existence never leaks.
  absl::Status CreateSequence(std::string_view tenant, std::string_view id);
  absl::Status ReleaseSequence(std::string_view tenant, std::string_view id);
  // Drops positions >= length on every layer. All or nothing: FAILED_PRECONDITION when a
  // window layer no longer holds the W - 1 positions before `length` (0 is always allowed).
  absl::Status Truncate(std::string_view tenant, std::string_view id, int64_t length);
  // Committed length of one layer (a step prepared but not yet committed is not counted).
  absl::StatusOr<int64_t> Length(std::string_view tenant, std::string_view id, int32_t layer) const;
  // A copy of one layer's committed page tables (for tests and diagnostics).
  absl::StatusOr<LayerPages> Pages(std::string_view tenant, std::string_view id,
                                   int32_t layer) const;

  void BeginBatch();
  void EndBatch();

  // Validates every span against what is stored (NOT_FOUND for unknown sequences,
  // INVALID_ARGUMENT for a gap or a restart before the kept window, naming spans[i]) and
  // reserves all pages the request needs, or RESOURCE_EXHAUSTED with nothing reserved.
  // Call between BeginBatch and EndBatch; spans name distinct sequences, and no two prepared
  // steps of one batch may name the same (sequence, layer).
  absl::StatusOr<std::unique_ptr<PreparedStep>> Prepare(std::string_view tenant, int32_t layer,
                                                        std::span<const SpanWrite> spans);
  void Commit(PreparedStep& step);
  void Abort(PreparedStep& step);

 private:
  struct Sequence {
    std::vector<LayerPages> layers;
    std::vector<TableMirror> mirrors;  // per layer; empty on layers without chosen entries
    // Per layer, the running batch's step of it (its undo record), or null: non-null marks the
    // (sequence, layer) busy.
    std::vector<const PreparedStep::Span*> pending;
    mutable absl::Time last_used;
  };
  struct TenantUsage {
    int64_t sequences = 0;
    int64_t pages = 0;
  };
  using Key = std::pair<std::string, std::string>;
  // Sequences are found by views of (tenant, id): every span of every step looks one up, and a
  // key of owned strings would cost two allocations per lookup.
  using KeyView = std::pair<std::string_view, std::string_view>;
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(const KeyView& k) const { return absl::HashOf(k.first, k.second); }
  };
  struct KeyEq {
    using is_transparent = void;
    bool operator()(const KeyView& a, const KeyView& b) const { return a == b; }
  };

  KvStore(const ModelConfig& config, const ModelProfile& profile, kernels::Buffer arena,
          TableHeap tables);

  Sequence* Find(std::string_view tenant, std::string_view id) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The sequence whose layer Length/Pages read: NOT_FOUND naming the layer or the sequence.
  absl::StatusOr<const Sequence*> FindForRead(std::string_view tenant, std::string_view id,
                                              int32_t layer) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void FreeLayer(std::string_view tenant, Sequence& seq, int32_t layer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fits the device copy of the layer's translated table to its length (TableHeap::Fit).
  void FitMirror(Sequence& seq, int32_t layer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Charge(std::string_view tenant, int64_t pages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TrimWindow(LayerPages& pages, std::vector<int32_t>& release) const;
  // Puts a table that `step` was applied to back as it was before Prepare.
  static void Undo(const PreparedStep::Span& step, LayerPages& pages);

  const ModelConfig config_;
  const ModelProfile* profile_;
  kernels::Buffer arena_;
  kernels::MutableCacheView cache_;
  int32_t max_sequences_ = 0;

  mutable absl::Mutex mu_;
  PageAllocator allocator_ ABSL_GUARDED_BY(mu_);
  TableHeap tables_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Key, std::unique_ptr<Sequence>, KeyHash, KeyEq> sequences_
      ABSL_GUARDED_BY(mu_);
  bool batch_active_ ABSL_GUARDED_BY(mu_) = false;
  int64_t steps_pending_ ABSL_GUARDED_BY(mu_) = 0;  // prepared, not yet committed or aborted
  int32_t tenant_max_sequences_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t tenant_max_pages_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, TenantUsage> tenants_ ABSL_GUARDED_BY(mu_);
};

}  // namespace smla::server
