// One served model at run time: its resolved configuration, its KV store, and the tables a
// frontend uploads for it (attention sinks, the inverse-RoPE cos/sin table).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "smla/kernels/backend.h"
#include "smla/server/config.h"
#include "smla/server/kv_store.h"
#include "smla/server/model_profile.h"

namespace smla::server {

class ModelRuntime {
 public:
  // `index`: the model's place in the server's configuration order (StepRequest::model_index).
  ModelRuntime(int32_t index, const ModelConfig& config, std::unique_ptr<KvStore> store)
      : index_(index), config_(config), store_(std::move(store)) {}

  int32_t index() const { return index_; }

  const ModelConfig& config() const { return config_; }
  const ModelProfile& profile() const { return store_->profile(); }
  KvStore& store() const { return *store_; }

  // [layers, heads_per_rank] f32, finite.
  absl::Status SetSinks(std::span<const float> sinks);
  // [P, 64] f32, finite; uploaded to backend memory. Batches already launched keep the table
  // they started with.
  absl::Status SetRopeTable(kernels::Backend& backend, kernels::Stream& stream,
                            std::span<const float> cos_sin, int32_t num_positions);

  bool sinks_uploaded() const;
  // The sink of one layer ([heads_per_rank]), empty when none was uploaded.
  std::vector<float> LayerSink(int32_t layer) const;
  struct Rope {
    std::shared_ptr<const kernels::Buffer> table;
    int32_t positions = 0;
  };
  Rope rope() const;

 private:
  const int32_t index_;
  const ModelConfig config_;
  std::unique_ptr<KvStore> store_;
  mutable absl::Mutex mu_;
  std::vector<float> sinks_ ABSL_GUARDED_BY(mu_);
  Rope rope_ ABSL_GUARDED_BY(mu_);
};

}  // namespace smla::server
