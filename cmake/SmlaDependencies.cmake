find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
if(SMLA_BUILD_SERVICE)
  find_package(spdlog CONFIG REQUIRED)
  # Debian's protobuf ships no CMake config: CMake's FindProtobuf module is used, and gRPC's
  # config (from protobuf-compiler-grpc) then finds it already.
  find_package(Protobuf REQUIRED)
  find_package(gRPC CONFIG REQUIRED)
  find_program(SMLA_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
  find_path(SMLA_HTTPLIB_INCLUDE httplib.h REQUIRED)
  find_path(SMLA_GRPC_PROTO_DIR grpc/health/v1/health.proto
            PATHS /usr/share/grpc-proto REQUIRED)
endif()
if(SMLA_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()
if(SMLA_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)
endif()
