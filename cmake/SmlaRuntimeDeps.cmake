# Install-time script of the runtime_deps component (cmake/SmlaInstall.cmake), for the container
# images: every shared library SMLA_RUNTIME_BINARIES load, found by CMake's ELF resolver,
# becomes either a distribution package name in share/smla/runtime-packages.txt (the runtime
# stage installs exactly these) or, for vendor toolkits under /opt or /usr/local (ROCm, CUDA),
# whose packages come from a repository the runtime image does not have, a copy in lib/.
set(_prefix "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}")
file(GET_RUNTIME_DEPENDENCIES
  EXECUTABLES ${SMLA_RUNTIME_BINARIES}
  RESOLVED_DEPENDENCIES_VAR _resolved
  UNRESOLVED_DEPENDENCIES_VAR _unresolved)
if(_unresolved)
  message(FATAL_ERROR "runtime_deps: shared libraries not found: ${_unresolved}")
endif()

set(_packages)
foreach(_lib IN LISTS _resolved)
  file(REAL_PATH "${_lib}" _real)
  set(_pkg "")
  if(NOT _real MATCHES "^/(opt|usr/local)/")
    # dpkg records a library under one spelling of its path: with or without /usr (merged
    # /usr), through a link or not.
    string(REGEX REPLACE "^/usr" "" _without_usr "${_lib}")
    foreach(_candidate "${_lib}" "${_real}" "/usr${_lib}" "${_without_usr}")
      execute_process(COMMAND dpkg-query -S "${_candidate}" RESULT_VARIABLE _rc
                      OUTPUT_VARIABLE _owner ERROR_QUIET)
      if(_rc EQUAL 0)
        string(REGEX MATCH "^[^:,]+" _pkg "${_owner}")
        break()
      endif()
    endforeach()
  endif()
  if(_pkg)
    list(APPEND _packages "${_pkg}")
  else()
    file(INSTALL "${_lib}" DESTINATION "${_prefix}/lib" FOLLOW_SYMLINK_CHAIN)
    message(STATUS "runtime_deps: bundled ${_lib}")
  endif()
endforeach()

list(REMOVE_DUPLICATES _packages)
list(SORT _packages)
list(LENGTH _packages _count)
list(JOIN _packages "\n" _text)
file(WRITE "${_prefix}/share/smla/runtime-packages.txt" "${_text}\n")
list(JOIN _packages " " _line)
message(STATUS "runtime_deps: ${_count} runtime packages: ${_line}")
