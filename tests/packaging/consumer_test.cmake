# ctest packaging_find_package: installs this build tree into a staging prefix with
# `cmake --install`, then configures, builds and runs tests/packaging/consumer against it
# (find_package(smla) through CMAKE_PREFIX_PATH). Fixed paths under the build tree keep the
# consumer's one source a ccache hit from run to run.
# cmake -DBUILD_DIR=... -DWORK_DIR=... -DCONSUMER_DIR=... -DCXX=... [-DLAUNCHER=...]
#       [-DBUILD_TYPE=...] [-DLINK_FLAGS=...] -P consumer_test.cmake
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "packaging: failed (${rc}): ${cmd}")
  endif()
endfunction()

set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/consumer-build")
file(REMOVE_RECURSE "${prefix}" "${build}")
run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")
foreach(f lib/cmake/smla/smlaConfig.cmake lib/cmake/smla/smlaConfigVersion.cmake
          include/smla/client/client.h include/smla/v1/service.grpc.pb.h
          bin/smla-server bin/smla bin/smla-bench share/smla/server.textproto)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "packaging: the install has no ${f}")
  endif()
endforeach()
if(EXISTS "${prefix}/include/smla/client/testing")
  message(FATAL_ERROR "packaging: the testing headers were installed")
endif()

run("${CMAKE_COMMAND}" -S "${CONSUMER_DIR}" -B "${build}" -G Ninja
    "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_CXX_COMPILER=${CXX}"
    "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}"
    "-DCMAKE_EXE_LINKER_FLAGS=${LINK_FLAGS}")
run("${CMAKE_COMMAND}" --build "${build}")
run("${build}/smla_consumer")
