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
if(SMLA_BUILD_SERVICE OR SMLA_BUILD_BENCH)
  find_package(nlohmann_json CONFIG REQUIRED)  # the JSON reports of smla-bench and smla-kbench
endif()

# The Python client (client/python): Debian's pybind11, numpy and pytest install for the system
# interpreter, so it is preferred over whatever `python3` comes first on PATH (pyenv, a venv);
# -DPython3_EXECUTABLE=... picks another. Without pybind11 the package is skipped, not an error.
# Sanitized builds skip it: an ASan-instrumented module cannot load into a plain interpreter.
if(SMLA_BUILD_SERVICE AND SMLA_BUILD_PYTHON)
  if(SMLA_SANITIZE)
    message(STATUS "smla: sanitized build, the Python package is not built")
    set(SMLA_BUILD_PYTHON OFF)
  else()
    if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
      set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Python of the smla package")
    endif()
    find_package(Python3 COMPONENTS Interpreter Development.Module)
    if(Python3_FOUND)
      find_package(pybind11 CONFIG)
    endif()
    if(NOT Python3_FOUND OR NOT pybind11_FOUND)
      message(WARNING "smla: pybind11 or Python 3 headers not found (scripts/install_deps.sh "
                      "installs them); the Python package is not built")
      set(SMLA_BUILD_PYTHON OFF)
    endif()
  endif()
endif()
