#include "smla/server/kv_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "internal.h"
#include "smla/base/align.h"
#include "smla/server/log_field.h"

namespace smla::server {
namespace {

// Another tenant's sequence gets the same answer as a missing one (docs/promises.md).
absl::Status SequenceNotFound(std::string_view id, const std::string& model) {
  return absl::NotFoundError(Cat("sequence '", LogField(id), "' of model ", model, " not found"));
}

// The pages of the table that a layer's chosen entries are translated through.
int64_t TranslatedPages(const LayerSpec& spec, const LayerPages& p) {
  if (spec.kind == LayerKind::kChosen) return static_cast<int64_t>(p.main.size());
  if (spec.kind == LayerKind::kSwaTopK) return static_cast<int64_t>(p.compressed.size());
  return 0;
}

}  // namespace

int64_t PreparedStep::MainSlot(size_t span, int64_t position) const {
  const LayerPages& p = *spans_[span].table;
  const int64_t logical = position / rows_per_page_ - p.main_first_page;
  SMLA_CHECK(position >= 0 && logical >= 0 && logical < static_cast<int64_t>(p.main.size()),
             "main position outside the prepared page table");
  return int64_t{p.main[logical]} * rows_per_page_ + position % rows_per_page_;
}

int64_t PreparedStep::CompressedSlot(size_t span, int64_t entry) const {
  const LayerPages& p = *spans_[span].table;
  const int64_t logical = entry / rows_per_page_;
  SMLA_CHECK(entry >= 0 && logical < static_cast<int64_t>(p.compressed.size()),
             "compressed entry outside the prepared page table");
  return int64_t{p.compressed[logical]} * rows_per_page_ + entry % rows_per_page_;
}

KvStore::KvStore(const ModelConfig& config, const ModelProfile& profile, kernels::Buffer arena,
                 TableHeap tables)
    : config_(config),
      profile_(&profile),
      arena_(std::move(arena)),
      allocator_(static_cast<int32_t>(config.pool_pages)),
      tables_(std::move(tables)) {
  cache_.base = arena_.data();
  cache_.format = config.kv_format;
  cache_.geometry = profile.geometry;
  cache_.num_pages = config.pool_pages;
  cache_.rows_per_page = config.page_rows;
  cache_.pitch_bytes = PageBytes(config, profile);
  cache_.scale = config.kv_format == kernels::KvFormat::kFp8PerTensor ? config.kv_scale : 1.0f;
}

KvStore::~KvStore() = default;

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Create(const ModelConfig& config,
                                                         kernels::Backend& backend,
                                                         int32_t max_sequences) {
  const ModelProfile* profile = FindProfile(config.profile);
  if (profile == nullptr) {
    return absl::InvalidArgumentError(Cat("unknown model profile '", config.profile, "'"));
  }
  const int64_t bytes = config.pool_pages * PageBytes(config, *profile);
  absl::StatusOr<kernels::Buffer> arena = backend.Allocate(static_cast<size_t>(bytes));
  if (!arena.ok()) {
    return absl::ResourceExhaustedError(Cat(config.profile, ": cannot allocate a pool of ", bytes,
                                            " bytes: ", arena.status().message()));
  }
  // Device copies of the translated tables: enough blocks that a table never waits for one
  // (device_tables.h).
  const auto translated =
      static_cast<int64_t>(std::count_if(profile->layers.begin(), profile->layers.end(),
                                         [](const LayerSpec& l) { return l.client_chooses(); }));
  absl::StatusOr<TableHeap> tables = TableHeap::Create(
      backend,
      translated == 0 ? 0 : TableBlocksOf(config.pool_pages) + int64_t{max_sequences} * translated);
  if (!tables.ok()) return tables.status();
  std::unique_ptr<KvStore> store(
      new KvStore(config, *profile, *std::move(arena), *std::move(tables)));
  store->max_sequences_ = max_sequences;
  return store;
}

int64_t KvStore::pages_total() const {
  absl::MutexLock lock(&mu_);
  return allocator_.pages_total();
}

int64_t KvStore::pages_used() const {
  absl::MutexLock lock(&mu_);
  return allocator_.pages_used();
}

int64_t KvStore::num_sequences() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(sequences_.size());
}

KvStore::Sequence* KvStore::Find(std::string_view tenant, std::string_view id) const {
  auto it = sequences_.find(KeyView(tenant, id));
  if (it == sequences_.end()) return nullptr;
  it->second->last_used = absl::Now();
  return it->second.get();
}

void KvStore::SetTenantQuota(int32_t max_sequences, int64_t max_pages) {
  absl::MutexLock lock(&mu_);
  tenant_max_sequences_ = max_sequences;
  tenant_max_pages_ = max_pages;
}

int64_t KvStore::tenant_pages(std::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(std::string(tenant));
  return it == tenants_.end() ? 0 : it->second.pages;
}

int64_t KvStore::tenant_sequences(std::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(std::string(tenant));
  return it == tenants_.end() ? 0 : it->second.sequences;
}

void KvStore::Charge(std::string_view tenant, int64_t pages) {
  if (pages == 0) return;
  auto it = tenants_.find(std::string(tenant));
  SMLA_CHECK(it != tenants_.end(), "pages charged to a tenant without sequences");
  it->second.pages += pages;
  SMLA_CHECK(it->second.pages >= 0, "tenant page count below zero");
}

absl::Status KvStore::CreateSequence(std::string_view tenant, std::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError("sequence_id: must not be empty");
  absl::MutexLock lock(&mu_);
  if (Find(tenant, id) != nullptr) {
    return absl::AlreadyExistsError(
        Cat("sequence '", LogField(id), "' of model ", config_.profile, " already exists"));
  }
  if (static_cast<int64_t>(sequences_.size()) >= max_sequences_) {
    return absl::ResourceExhaustedError(
        Cat("model ", config_.profile, " holds the most sequences allowed (", max_sequences_, ")"));
  }
  TenantUsage& usage = tenants_[std::string(tenant)];
  if (tenant_max_sequences_ > 0 && usage.sequences >= tenant_max_sequences_) {
    return absl::ResourceExhaustedError(Cat("tenant quota of sequences reached: the tenant holds ",
                                            usage.sequences, " of ", tenant_max_sequences_,
                                            " sequences of model ", config_.profile));
  }
  ++usage.sequences;
  auto seq = std::make_unique<Sequence>();
  seq->layers.resize(profile_->num_layers());
  seq->pending.assign(profile_->num_layers(), nullptr);
  seq->mirrors.resize(profile_->num_layers());
  seq->last_used = absl::Now();
  sequences_.emplace(Key(std::string(tenant), std::string(id)), std::move(seq));
  return absl::OkStatus();
}

void KvStore::FreeLayer(std::string_view tenant, Sequence& seq, int32_t layer) {
  LayerPages& pages = seq.layers[layer];
  for (int32_t p : pages.main) allocator_.Free(p);
  allocator_.Free(pages.compressed);
  Charge(tenant, -static_cast<int64_t>(pages.main.size() + pages.compressed.size()));
  pages = LayerPages();
  FitMirror(seq, layer);
}

void KvStore::FitMirror(Sequence& seq, int32_t layer) {
  const LayerSpec& spec = profile_->layers[layer];
  if (spec.client_chooses())
    tables_.Fit(seq.mirrors[layer], TranslatedPages(spec, seq.layers[layer]));
}

std::vector<std::pair<std::string, std::string>> KvStore::ReleaseIdle(absl::Time cutoff) {
  std::vector<std::pair<std::string, std::string>> released;
  mu_.LockWhen(absl::Condition(
      +[](bool* active) { return !*active; }, &batch_active_));
  for (auto it = sequences_.begin(); it != sequences_.end();) {
    if (it->second->last_used >= cutoff) {
      ++it;
      continue;
    }
    const Key key = it->first;
    for (int32_t l = 0; l < profile_->num_layers(); ++l) FreeLayer(key.first, *it->second, l);
    if (--tenants_[key.first].sequences == 0 && tenants_[key.first].pages == 0) {
      tenants_.erase(key.first);
    }
    sequences_.erase(it++);
    released.push_back(key);
  }
  mu_.Unlock();
  return released;
}

absl::Status KvStore::ReleaseSequence(std::string_view tenant, std::string_view id) {
  mu_.LockWhen(absl::Condition(
      +[](bool* active) { return !*active; }, &batch_active_));
  absl::Status status;
  auto it = sequences_.find(KeyView(tenant, id));
  if (it == sequences_.end()) {
    status = SequenceNotFound(id, config_.profile);
  } else {
    for (int32_t l = 0; l < profile_->num_layers(); ++l) FreeLayer(tenant, *it->second, l);
    sequences_.erase(it);
    auto usage = tenants_.find(std::string(tenant));
    if (--usage->second.sequences == 0 && usage->second.pages == 0) tenants_.erase(usage);
  }
  mu_.Unlock();
  return status;
}

absl::Status KvStore::Truncate(std::string_view tenant, std::string_view id, int64_t length) {
  if (length < 0) {
    return absl::InvalidArgumentError(Cat("length: ", length, " is negative"));
  }
  mu_.LockWhen(absl::Condition(
      +[](bool* active) { return !*active; }, &batch_active_));
  absl::Status status;
  Sequence* seq = Find(tenant, id);
  const int32_t B = config_.page_rows;
  if (seq == nullptr) {
    status = SequenceNotFound(id, config_.profile);
  }
  // Check every layer first, so that a refusal changes nothing.
  for (int32_t l = 0; status.ok() && l < profile_->num_layers(); ++l) {
    const LayerPages& p = seq->layers[l];
    if (length == 0 || length >= p.length || !profile_->layers[l].has_window()) continue;
    const int64_t need_from = std::max<int64_t>(0, length - (profile_->swa_window - 1));
    if (need_from < p.main_first_page * B) {
      status = absl::FailedPreconditionError(Cat(
          "truncate to ", length, ": layer ", l, " keeps positions from ", p.main_first_page * B,
          " on, so a step at ", length, " could not see its window (roll back at most ",
          config_.swa_rollback, " positions, or truncate to 0)"));
    }
  }
  for (int32_t l = 0; status.ok() && l < profile_->num_layers(); ++l) {
    LayerPages& p = seq->layers[l];
    if (length >= p.length) continue;
    if (length == 0) {
      FreeLayer(tenant, *seq, l);
      continue;
    }
    p.length = length;
    const int64_t keep_main = (length - 1) / B + 1 - p.main_first_page;
    while (static_cast<int64_t>(p.main.size()) > keep_main) {
      allocator_.Free(p.main.back());
      p.main.pop_back();
      Charge(tenant, -1);
    }
    const LayerSpec& spec = profile_->layers[l];
    if (spec.has_compressed()) {
      const int64_t keep = CeilDiv(length / spec.ratio, B);
      while (static_cast<int64_t>(p.compressed.size()) > keep) {
        allocator_.Free(p.compressed.back());
        p.compressed.pop_back();
        Charge(tenant, -1);
      }
    }
    FitMirror(*seq, l);
  }
  mu_.Unlock();
  return status;
}

absl::StatusOr<const KvStore::Sequence*> KvStore::FindForRead(std::string_view tenant,
                                                              std::string_view id,
                                                              int32_t layer) const {
  if (layer < 0 || layer >= profile_->num_layers()) {
    return absl::NotFoundError(Cat("layer ", layer, " not found (model ", config_.profile, " has ",
                                   profile_->num_layers(), " layers)"));
  }
  const Sequence* seq = Find(tenant, id);
  if (seq == nullptr) {
    return SequenceNotFound(id, config_.profile);
  }
  return seq;
}

absl::StatusOr<int64_t> KvStore::Length(std::string_view tenant, std::string_view id,
                                        int32_t layer) const {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<const Sequence*> seq = FindForRead(tenant, id, layer);
  if (!seq.ok()) return seq.status();
  const PreparedStep::Span* pending = (*seq)->pending[layer];
  return pending != nullptr ? pending->old_length : (*seq)->layers[layer].length;
}

absl::StatusOr<LayerPages> KvStore::Pages(std::string_view tenant, std::string_view id,
                                          int32_t layer) const {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<const Sequence*> seq = FindForRead(tenant, id, layer);
  if (!seq.ok()) return seq.status();
  LayerPages pages = (*seq)->layers[layer];
  if ((*seq)->pending[layer] != nullptr) Undo(*(*seq)->pending[layer], pages);
  return pages;
}

void KvStore::BeginBatch() {
  absl::MutexLock lock(&mu_);
  SMLA_CHECK(!batch_active_, "batches of one store must not overlap");
  batch_active_ = true;
}

void KvStore::EndBatch() {
  absl::MutexLock lock(&mu_);
  SMLA_CHECK(steps_pending_ == 0, "batch ended with a prepared step neither committed nor aborted");
  batch_active_ = false;
}

void KvStore::TrimWindow(LayerPages& pages, std::vector<int32_t>& release) const {
  const int64_t keep_from =
      std::max<int64_t>(0, pages.length - config_.swa_rollback - (profile_->swa_window - 1));
  const int64_t first_page = keep_from / config_.page_rows;
  while (pages.main_first_page < first_page && !pages.main.empty()) {
    release.push_back(pages.main.front());
    pages.main.pop_front();
    ++pages.main_first_page;
  }
}

absl::StatusOr<std::unique_ptr<PreparedStep>> KvStore::Prepare(std::string_view tenant,
                                                               int32_t layer,
                                                               std::span<const SpanWrite> spans) {
  if (layer < 0 || layer >= profile_->num_layers()) {
    return absl::NotFoundError(Cat("layer ", layer, " not found (model ", config_.profile, " has ",
                                   profile_->num_layers(), " layers)"));
  }
  const LayerSpec& spec = profile_->layers[layer];
  const int32_t B = config_.page_rows;
  auto step = std::make_unique<PreparedStep>();
  step->layer_ = layer;
  step->rows_per_page_ = B;
  step->heap_ = &tables_;
  step->spans_.resize(spans.size());

  absl::MutexLock lock(&mu_);
  SMLA_CHECK(batch_active_, "Prepare outside a batch");
  // Pass 1: validate against what is stored and count the pages to add.
  int64_t pages_needed = 0;
  std::vector<int64_t> main_add(spans.size()), comp_add(spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    const SpanWrite& s = spans[i];
    Sequence* seq = Find(tenant, s.sequence_id);
    if (seq == nullptr) {
      return absl::NotFoundError(Cat("spans[", i, "].sequence_id: sequence '",
                                     LogField(s.sequence_id), "' of model ", config_.profile,
                                     " not found"));
    }
    SMLA_CHECK(seq->pending[layer] == nullptr, "two steps of one (sequence, layer) in one batch");
    const LayerPages& cur = seq->layers[layer];
    if (s.first_position > cur.length) {
      return absl::InvalidArgumentError(Cat("spans[", i, "].first_position ", s.first_position,
                                            " leaves a gap after stored length ", cur.length,
                                            " (layer ", layer, ")"));
    }
    if (spec.has_window()) {
      const int64_t need_from = std::max<int64_t>(0, s.first_position - (profile_->swa_window - 1));
      if (need_from < cur.main_first_page * B) {
        return absl::InvalidArgumentError(Cat(
            "spans[", i, "].first_position ", s.first_position, " needs window rows from position ",
            need_from, " but layer ", layer, " keeps positions from ", cur.main_first_page * B,
            " on (stored length ", cur.length, "; steps may restart at most ", config_.swa_rollback,
            " positions back)"));
      }
    }
    const int64_t end = s.first_position + s.num_rows;
    const int64_t main_end_page = cur.main_first_page + static_cast<int64_t>(cur.main.size());
    main_add[i] = std::max<int64_t>(0, (end - 1) / B + 1 - main_end_page);
    if (spec.has_compressed()) {
      const int64_t have = static_cast<int64_t>(cur.compressed.size());
      comp_add[i] = std::max<int64_t>(0, CeilDiv(end / spec.ratio, B) - have);
    }
    pages_needed += main_add[i] + comp_add[i];
    step->spans_[i].sequence = seq;
  }
  if (pages_needed > allocator_.pages_free()) {
    return absl::ResourceExhaustedError(Cat(
        "KV pool of model ", config_.profile, " is full: the step needs ", pages_needed,
        " new pages, ", allocator_.pages_free(), " of ", allocator_.pages_total(), " are free"));
  }
  if (tenant_max_pages_ > 0) {
    const int64_t held = tenants_[std::string(tenant)].pages;
    if (held + pages_needed > tenant_max_pages_) {
      return absl::ResourceExhaustedError(Cat(
          "tenant quota of pages reached: the step needs ", pages_needed, " new pages of model ",
          config_.profile, ", the tenant holds ", held, " of ", tenant_max_pages_));
    }
  }
  SMLA_CHECK(allocator_.Allocate(static_cast<int32_t>(pages_needed), step->new_pages_),
             "allocator refused pages it reported free");
  step->tenant_ = std::string(tenant);
  Charge(tenant, pages_needed);
  // Pass 2: apply the step to the live tables, recording how to undo it. No error from here on.
  ++steps_pending_;
  size_t next_page = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const SpanWrite& s = spans[i];
    PreparedStep::Span& out = step->spans_[i];
    Sequence* seq = static_cast<Sequence*>(out.sequence);
    // Also catches one sequence named by two spans, which pass 1 counted against the same table.
    SMLA_CHECK(seq->pending[layer] == nullptr, "two steps of one (sequence, layer) in one batch");
    seq->pending[layer] = &out;
    LayerPages& p = seq->layers[layer];
    out.table = &p;
    out.old_length = p.length;
    const int64_t end = s.first_position + s.num_rows;
    p.length = end;
    for (int64_t k = 0; k < main_add[i]; ++k) p.main.push_back(step->new_pages_[next_page++]);
    out.main_added = static_cast<int32_t>(main_add[i]);
    const int64_t keep_main = (end - 1) / B + 1 - p.main_first_page;
    while (static_cast<int64_t>(p.main.size()) > keep_main) {
      out.release.push_back(p.main.back());
      p.main.pop_back();
    }
    out.main_released = static_cast<int32_t>(out.release.size());
    if (spec.has_compressed()) {
      for (int64_t k = 0; k < comp_add[i]; ++k) {
        p.compressed.push_back(step->new_pages_[next_page++]);
      }
      out.compressed_added = static_cast<int32_t>(comp_add[i]);
      const int64_t keep = CeilDiv(end / spec.ratio, B);
      while (static_cast<int64_t>(p.compressed.size()) > keep) {
        out.release.push_back(p.compressed.back());
        p.compressed.pop_back();
      }
    }
    if (spec.client_chooses()) {
      FitMirror(*seq, layer);
      out.mirror = &seq->mirrors[layer];
    }
  }
  return step;
}

void KvStore::Undo(const PreparedStep::Span& step, LayerPages& pages) {
  // Reverse order of Prepare: put the released pages back, then drop the appended ones (a table
  // never has both, see PreparedStep::Span).
  const auto main_released = step.release.begin() + step.main_released;
  for (auto it = step.release.rbegin(); it.base() != main_released; ++it) {
    pages.compressed.push_back(*it);
  }
  pages.compressed.resize(pages.compressed.size() - step.compressed_added);
  for (auto it = std::make_reverse_iterator(main_released); it != step.release.rend(); ++it) {
    pages.main.push_back(*it);
  }
  pages.main.resize(pages.main.size() - step.main_added);
  pages.length = step.old_length;
}

void KvStore::Commit(PreparedStep& step) {
  absl::MutexLock lock(&mu_);
  SMLA_CHECK(!step.done_, "prepared step finished twice");
  step.done_ = true;
  --steps_pending_;
  const bool window = profile_->layers[step.layer_].has_window();
  for (PreparedStep::Span& s : step.spans_) {
    Sequence* seq = static_cast<Sequence*>(s.sequence);
    if (window) TrimWindow(*s.table, s.release);
    seq->pending[step.layer_] = nullptr;
    allocator_.Free(s.release);
    Charge(step.tenant_, -static_cast<int64_t>(s.release.size()));
  }
}

void KvStore::Abort(PreparedStep& step) {
  absl::MutexLock lock(&mu_);
  SMLA_CHECK(!step.done_, "prepared step finished twice");
  step.done_ = true;
  --steps_pending_;
  for (PreparedStep::Span& s : step.spans_) {
    Undo(s, *s.table);
    auto* seq = static_cast<Sequence*>(s.sequence);
    seq->pending[step.layer_] = nullptr;
    FitMirror(*seq, step.layer_);
  }
  allocator_.Free(step.new_pages_);
  Charge(step.tenant_, -static_cast<int64_t>(step.new_pages_.size()));
}

}  // namespace smla::server
