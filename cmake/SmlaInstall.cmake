# Install rules, in three components:
#   runtime      bin/smla-server, bin/smla, bin/smla-bench and share/smla/server.textproto;
#   development  the client library and the wire API (headers, .proto files, static libraries)
#                with lib/cmake/smla, so that a frontend can find_package(smla) and link
#                smla::client (docs/integration.md).
#   runtime_deps what a container's runtime stage needs besides the binaries (scripts/
#                container_build.sh): shared libraries from vendor toolkits copied into lib/,
#                and share/smla/runtime-packages.txt. Only when asked for by name.
# The build tree exports the same targets (smla_DIR=<build dir>).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SMLA_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/smla)

install(TARGETS smla-server smla smla-bench
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/server.textproto
        DESTINATION ${CMAKE_INSTALL_DATADIR}/smla COMPONENT runtime)

set_target_properties(smla_client PROPERTIES EXPORT_NAME client)
set_target_properties(smla_proto PROPERTIES EXPORT_NAME proto)
set_target_properties(smla_codec PROPERTIES EXPORT_NAME codec)
set_target_properties(smla_base PROPERTIES EXPORT_NAME base)
set_target_properties(smla_wire_headers PROPERTIES EXPORT_NAME wire_headers)
# smla::codec and smla::base are private, header-only dependencies of the client; exported
# without headers because a static library's private links are listed in its export.
# smla::wire_headers is proto's: its headers are installed with smla/v1 below.
install(TARGETS smla_client smla_proto smla_codec smla_base smla_wire_headers EXPORT smlaTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The client's headers (not testing/: smla::client_testing links the kernels and is not
# installed), the hand-written wire headers and .proto files, and the generated ones.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/client/include/smla/client
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/smla COMPONENT development
        PATTERN testing EXCLUDE)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/proto/smla/v1
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/smla COMPONENT development
        FILES_MATCHING PATTERN "*.h" PATTERN "*.proto")
install(DIRECTORY ${PROJECT_BINARY_DIR}/proto/smla/v1
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/smla COMPONENT development
        FILES_MATCHING PATTERN "*.pb.h")

install(EXPORT smlaTargets NAMESPACE smla:: DESTINATION ${SMLA_CMAKE_INSTALL_DIR}
        COMPONENT development)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/smlaConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/install/smlaConfig.cmake
                              INSTALL_DESTINATION ${SMLA_CMAKE_INSTALL_DIR})
# The wire API is smla.v1 at every 0.x version; a 1.0 would be a new major.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/smlaConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/install/smlaConfig.cmake
              ${PROJECT_BINARY_DIR}/smlaConfigVersion.cmake
        DESTINATION ${SMLA_CMAKE_INSTALL_DIR} COMPONENT development)

export(EXPORT smlaTargets NAMESPACE smla:: FILE ${PROJECT_BINARY_DIR}/smlaTargets.cmake)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/smlaConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/smlaConfig.cmake
                              INSTALL_DESTINATION ${PROJECT_BINARY_DIR}
                              INSTALL_PREFIX ${PROJECT_BINARY_DIR})

# Resolved from the build tree's binaries at install time (cmake/SmlaRuntimeDeps.cmake).
install(CODE "set(SMLA_RUNTIME_BINARIES \"$<TARGET_FILE:smla-server>;$<TARGET_FILE:smla>;\
$<TARGET_FILE:smla-bench>\")
include(\"${CMAKE_CURRENT_LIST_DIR}/SmlaRuntimeDeps.cmake\")"
        COMPONENT runtime_deps EXCLUDE_FROM_ALL)
