// A served model's configuration against its profile (smla/models/profile.h: geometry, formats
// and per-layer segment plan): parsing "dsv4.1-flash:tp=4:kv=fp8_dsv4:..." and resolving TP,
// pool and page sizes.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "smla/kernels/formats.h"
#include "smla/models/profile.h"
#include "smla/server/config.h"

namespace smla::server {

// The profiles live in smla::models; the server names them in its own namespace.
using models::AllProfiles;
using models::FindProfile;
using models::LayerKind;
using models::LayerKindName;
using models::LayerSpec;
using models::ModelProfile;

// Checks a configuration against its profile and fills derived fields (heads_per_rank,
// softmax_scale when 0). Rejects unknown profiles, TP not in {1,2,4,8}, formats the geometry
// cannot store, page rows that are not a power of two in [1, 1024], a non-positive or
// non-finite kv_scale, and pools smaller than one page or with more slots than int32 ids reach.
absl::StatusOr<ModelConfig> ResolveModelConfig(const ModelConfig& config);

// Parses "profile[:key=value]..." as given on the command line, e.g.
// "dsv4.1-flash:tp=4:kv=fp8_dsv4:page_rows=64:pool=4GiB". Keys: tp, kv, page_rows, pool (bytes,
// with optional KiB/MiB/GiB/TiB suffix), pool_pages, kv_scale, softmax_scale, swa_rollback.
// The result is resolved (ResolveModelConfig); kv defaults to the profile's format.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view spec);

// "4GiB" -> 4294967296; plain numbers are bytes.
absl::StatusOr<int64_t> ParseByteSize(std::string_view text);

// Bytes of one page of this model's pool (the serving pitch of its format and page rows).
int64_t PageBytes(const ModelConfig& config, const ModelProfile& profile);

}  // namespace smla::server
