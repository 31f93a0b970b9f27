// The server configuration file: protobuf text format of smla.v1.ServerConfig.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "smla/server/config.h"
#include "smla/v1/config.pb.h"

namespace smla::server::edge {

// Reads and parses a text-format ServerConfig; errors name the file and line.
absl::StatusOr<v1::ServerConfig> ReadConfigFile(const std::string& path);

// Applies the file's non-empty fields on top of `config` (models replace, limits override
// field by field); models are resolved against their profiles. A bad value (an unknown profile,
// a negative limit) is InvalidArgument naming the field.
absl::Status ApplyConfig(const v1::ServerConfig& file, ServerConfig* config,
                         int32_t* stream_max_inflight, int32_t* shutdown_grace_s);

}  // namespace smla::server::edge
