# The GPU backend built as HIP for AMD gfx950 (MI355X) with a ROCm 7 toolchain, from the same
# sources as CUDA. Included from kernels/CMakeLists.txt when SMLA_GPU_BACKEND=hip; the targets
# (CMAKE_HIP_ARCHITECTURES, default gfx950) and ROCm's clang are set in cmake/SmlaOptions.cmake.
# Where no ROCm is installed, scripts/hip_compile_check.sh compile-checks the same sources.

find_package(hip REQUIRED CONFIG)  # hip::host: the runtime's headers, platform macro, library

set(_smla_hip_kernels
  ${CMAKE_CURRENT_LIST_DIR}/attend_variants.cu
  ${CMAKE_CURRENT_LIST_DIR}/check_inputs_kernel.cu
  ${CMAKE_CURRENT_LIST_DIR}/copy_kernel.cu
  ${CMAKE_CURRENT_LIST_DIR}/combine_kernel.cu
  ${CMAKE_CURRENT_LIST_DIR}/expand_query_kernel.cu
  ${CMAKE_CURRENT_LIST_DIR}/row_union_kernel.cu
  ${CMAKE_CURRENT_LIST_DIR}/write_rows_kernel.cu
)
set_source_files_properties(${_smla_hip_kernels} PROPERTIES LANGUAGE HIP)
target_sources(smla_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/gpu_backend.cc
  ${CMAKE_CURRENT_LIST_DIR}/ipc_memory.cc
  ${CMAKE_CURRENT_LIST_DIR}/attend_launch.cc
  ${_smla_hip_kernels}
)
target_compile_definitions(smla_kernels PUBLIC SMLA_WITH_HIP)
target_link_libraries(smla_kernels PUBLIC hip::host)
# Device code: warnings are errors as for CUDA device code, and line tables for profilers and
# debuggers.
target_compile_options(smla_kernels PRIVATE
  $<$<COMPILE_LANGUAGE:HIP>:-Wall -Wextra -Werror -Wno-unused-parameter -gline-tables-only>)
