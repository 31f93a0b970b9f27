// ServiceCore: the models (profiles, KV stores, uploaded tables), the step executor and the
// scheduler behind one thread-safe object.
#include "smla/server/service_core.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "internal.h"
#include "smla/server/kv_store.h"
#include "smla/server/log_field.h"
#include "smla/server/model_profile.h"
#include "smla/server/scheduler.h"
#include "smla/server/step_executor.h"
#include "smla/server/step_validation.h"
#include "spdlog/spdlog.h"

namespace smla::server {
namespace {

class ServiceCoreImpl : public ServiceCore {
 public:
  ServiceCoreImpl(const ServerConfig& config, std::unique_ptr<kernels::Backend> backend)
      : config_(config), backend_(std::move(backend)) {}

  ~ServiceCoreImpl() override {
    stop_sweeper_.Notify();
    if (sweeper_.joinable()) sweeper_.join();
    // The scheduler drains and joins before the executor and the stores go.
    scheduler_.reset();
  }

  absl::Status Init() {
    if (config_.models.empty()) {
      return absl::InvalidArgumentError("models: at least one model must be served");
    }
    for (const ModelConfig& m : config_.models) {
      absl::StatusOr<ModelConfig> resolved = ResolveModelConfig(m);
      if (!resolved.ok()) return resolved.status();
      if (models_.contains(resolved->profile)) {
        return absl::InvalidArgumentError(
            Cat("models: ", resolved->profile, " is configured twice"));
      }
      absl::StatusOr<std::unique_ptr<KvStore>> store =
          KvStore::Create(*resolved, *backend_, config_.limits.max_sequences);
      if (!store.ok()) return store.status();
      (*store)->SetTenantQuota(config_.limits.tenant_max_sequences,
                               config_.limits.tenant_max_pages);
      auto runtime = std::make_unique<ModelRuntime>(static_cast<int32_t>(order_.size()), *resolved,
                                                    *std::move(store));
      order_.push_back(runtime.get());
      models_[resolved->profile] = std::move(runtime);
    }
    absl::StatusOr<std::unique_ptr<kernels::Stream>> upload = backend_->CreateStream();
    if (!upload.ok()) return upload.status();
    upload_stream_ = *std::move(upload);
    absl::StatusOr<std::unique_ptr<StepExecutor>> executor =
        StepExecutor::Create(*backend_, order_, config_.phase_timings_every);
    if (!executor.ok()) return executor.status();
    executor_ = *std::move(executor);
    SMLA_RETURN_IF_ERROR(executor_->WarmUp());
    scheduler_ = std::make_unique<Scheduler>(config_.limits, *executor_);
    const absl::Duration idle = config_.limits.sequence_idle_timeout;
    if (idle <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("sequence_idle_timeout: must be positive");
    }
    if (idle != absl::InfiniteDuration()) sweeper_ = std::thread([this, idle] { Sweep(idle); });
    return absl::OkStatus();
  }

  // Leases: a frontend that dies without releasing its sequences does not hold the pool.
  void Sweep(absl::Duration idle) {
    const absl::Duration period = std::clamp(idle / 4, absl::Milliseconds(10), absl::Seconds(1));
    while (!stop_sweeper_.WaitForNotificationWithTimeout(period)) {
      const absl::Time cutoff = absl::Now() - idle;
      for (ModelRuntime* m : order_) {
        for (const auto& [tenant, id] : m->store().ReleaseIdle(cutoff)) {
          spdlog::info("lease: released sequence '{}' of tenant '{}', model {} ({} idle)",
                       LogField(id), LogField(tenant), m->config().profile,
                       absl::FormatDuration(idle));
        }
      }
    }
  }

  ServerInfo Info() const override {
    ServerInfo info;
    info.device = backend_->device();
    for (const ModelRuntime* m : order_) {
      info.models.push_back(m->config());
      PoolUsage pool;
      pool.model = m->config().profile;
      pool.pages_total = m->store().pages_total();
      pool.pages_used = m->store().pages_used();
      pool.page_bytes = m->store().page_bytes();
      info.pools.push_back(pool);
      info.sequences += m->store().num_sequences();
    }
    return info;
  }

  CoreStats Stats() const override { return scheduler_->Stats(); }

  absl::Status CreateSequence(const std::string& tenant, const std::string& model,
                              const std::string& sequence_id) override {
    absl::StatusOr<ModelRuntime*> m = Find(model);
    if (!m.ok()) return m.status();
    return (*m)->store().CreateSequence(tenant, sequence_id);
  }

  absl::Status ReleaseSequence(const std::string& tenant, const std::string& model,
                               const std::string& sequence_id) override {
    absl::StatusOr<ModelRuntime*> m = Find(model);
    if (!m.ok()) return m.status();
    return (*m)->store().ReleaseSequence(tenant, sequence_id);
  }

  absl::Status TruncateSequence(const std::string& tenant, const std::string& model,
                                const std::string& sequence_id, int64_t length) override {
    absl::StatusOr<ModelRuntime*> m = Find(model);
    if (!m.ok()) return m.status();
    return (*m)->store().Truncate(tenant, sequence_id, length);
  }

  absl::StatusOr<int64_t> SequenceLength(const std::string& tenant, const std::string& model,
                                         const std::string& sequence_id,
                                         int32_t layer) const override {
    absl::StatusOr<ModelRuntime*> m = Find(model);
    if (!m.ok()) return m.status();
    return (*m)->store().Length(tenant, sequence_id, layer);
  }

  absl::Status SetRopeTable(const std::string& model, std::span<const float> cos_sin,
                            int32_t num_positions) override {
    absl::StatusOr<ModelRuntime*> m = Find(model);
    if (!m.ok()) return m.status();
    absl::MutexLock lock(&upload_mu_);
    return (*m)->SetRopeTable(*backend_, *upload_stream_, cos_sin, num_positions);
  }

  absl::Status SetSinks(const std::string& model, std::span<const float> sinks) override {
    absl::StatusOr<ModelRuntime*> m = Find(model);
    if (!m.ok()) return m.status();
    return (*m)->SetSinks(sinks);
  }

  void Submit(StepRequest request, StepCallback done) override {
    absl::StatusOr<ModelRuntime*> m = Find(request.model);
    if (!m.ok()) return done(m.status());
    if (!executor_->healthy()) {
      return done(absl::UnavailableError("not serving: an earlier backend failure"));
    }
    const ModelRuntime& model = **m;
    request.model_index = model.index();
    StepContext ctx;
    ctx.config = &model.config();
    ctx.profile = &model.profile();
    ctx.limits = &config_.limits;
    ctx.sinks_uploaded = model.sinks_uploaded();
    ctx.rope_positions = model.rope().positions;
    absl::Status valid = ValidateStep(request, ctx);
    if (!valid.ok()) return done(std::move(valid));
    const int64_t rows = StepRows(request);
    const int64_t bytes = StepBytes(request, model.profile(), model.config().heads_per_rank);
    absl::Status admitted = scheduler_->Submit(std::move(request), std::move(done), rows, bytes);
    // Submit takes `done` by rvalue reference and moves from it only when it admits the step.
    if (!admitted.ok()) done(std::move(admitted));  // NOLINT(bugprone-use-after-move)
  }

  void Drain() override { scheduler_->Drain(); }

  bool Healthy() const override { return executor_->healthy(); }
  // The executor copies inputs inside a registered range straight to the device, so it learns
  // of a range once the backend has page-locked it and forgets it before it is unlocked.
  absl::Status RegisterHostMemory(void* data, size_t bytes) override {
    SMLA_RETURN_IF_ERROR(backend_->RegisterHostMemory(data, bytes));
    executor_->host_ranges().Add(data, bytes);
    return absl::OkStatus();
  }
  void UnregisterHostMemory(void* data) override {
    executor_->host_ranges().Remove(data);
    backend_->UnregisterHostMemory(data);
  }

  // The memory joins the ranges the executor copies straight from and to, so a step's bf16
  // queries and outputs in it move device to device; it leaves them before it is closed.
  absl::StatusOr<std::shared_ptr<const GpuMemory>> OpenGpuMemory(std::span<const uint8_t> handle,
                                                                 size_t bytes) override {
    absl::StatusOr<kernels::Buffer> opened = backend_->OpenIpcMemory(handle, bytes);
    if (!opened.ok()) return opened.status();
    auto buffer = std::make_shared<kernels::Buffer>(*std::move(opened));
    auto* memory = new GpuMemory{buffer->as<uint8_t>(), bytes};
    executor_->host_ranges().Add(memory->data, bytes, HostRanges::Kind::kDevice);
    return std::shared_ptr<const GpuMemory>(memory,
                                            [this, buffer = std::move(buffer)](const GpuMemory* m) {
                                              executor_->host_ranges().Remove(m->data);
                                              delete m;
                                            });
  }

 private:
  absl::StatusOr<ModelRuntime*> Find(const std::string& model) const {
    auto it = models_.find(model);
    if (it == models_.end()) {
      std::string served;
      for (const ModelRuntime* m : order_) {
        absl::StrAppend(&served, served.empty() ? "" : ", ", m->config().profile);
      }
      return absl::NotFoundError(
          Cat("model '", LogField(model), "' not found (served: ", served, ")"));
    }
    return it->second.get();
  }

  const ServerConfig config_;
  std::unique_ptr<kernels::Backend> backend_;
  absl::flat_hash_map<std::string, std::unique_ptr<ModelRuntime>> models_;
  std::vector<ModelRuntime*> order_;  // configuration order
  absl::Mutex upload_mu_;
  std::unique_ptr<kernels::Stream> upload_stream_ ABSL_PT_GUARDED_BY(upload_mu_);
  std::unique_ptr<StepExecutor> executor_;
  std::unique_ptr<Scheduler> scheduler_;
  absl::Notification stop_sweeper_;
  std::thread sweeper_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ServiceCore>> ServiceCore::Create(
    const ServerConfig& config, std::unique_ptr<kernels::Backend> backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("backend: null");
  auto core = std::make_unique<ServiceCoreImpl>(config, std::move(backend));
  SMLA_RETURN_IF_ERROR(core->Init());
  return std::unique_ptr<ServiceCore>(std::move(core));
}

}  // namespace smla::server
