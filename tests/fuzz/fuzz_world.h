// The service the step fuzzer drives: a service core on the CPU backend with small pools and
// two small models (one with sinks and RoPE, one without), the tables uploaded, and the one
// input path: the server's request reader on the bytes cut into slices (checked against
// protobuf's own parse of them: both accept or both refuse, and accept the same message; the
// step ring's packed-step decoder accepts only what protobuf reads, as it reads it), the
// edge's wire checks (with registered shared-memory regions), then the core's validation and
// execution. Shared by the libFuzzer target, the seed generator and the replay test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "edge/host_staging.h"
#include "edge/shm_region.h"
#include "edge/smla_service.h"
#include "edge/wire.h"
#include "smla/server/service_core.h"
#include "smla/v1/info.pb.h"

namespace smla::fuzz {

class FuzzWorld {
 public:
  // Built once per process; aborts if the core cannot start.
  static FuzzWorld& Get();

  // Runs one input; returns the status of the step (parse failures are INVALID_ARGUMENT).
  // Every sequence the request names (up to 4) is created fresh before and released after, so
  // inputs do not depend on each other.
  absl::Status RunOne(const uint8_t* data, size_t size);

  const v1::ServerInfo& info() const { return info_; }

  // A registered shared-memory region of the fuzz tenant (and one of another tenant), so
  // inputs can name regions, per-span or packed (StepRequest.packed). Before every input its
  // first kIdsAt bytes are zero (finite bf16 inputs), [kIdsAt, kOutputsAt) all ones (top-k
  // ids -1); outputs may go from kOutputsAt on.
  static constexpr uint64_t kRegionBytes = 4 << 20;
  static constexpr uint64_t kIdsAt = 2 << 20;
  static constexpr uint64_t kOutputsAt = 3 << 20;
  const std::string& region_name() const { return region_name_; }
  const std::string& foreign_region_name() const { return foreign_region_name_; }

 private:
  FuzzWorld() = default;
  std::unique_ptr<server::edge::RegionRegistry> regions_;
  std::unique_ptr<server::edge::StagingPool> staging_;
  std::string region_name_, foreign_region_name_;
  uint8_t* region_data_ = nullptr;  // this process's own mapping of region_name_
  std::unique_ptr<server::ServiceCore> core_;
  std::map<std::string, server::edge::WireModel> models_;
  server::Limits limits_;
  v1::ServerInfo info_;
};

}  // namespace smla::fuzz
