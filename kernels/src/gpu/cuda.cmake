# The GPU backend built with the CUDA toolkit for Hopper (sm_90a). Included from
# kernels/CMakeLists.txt when SMLA_GPU_BACKEND=cuda.
find_package(CUDAToolkit REQUIRED)
# CMake 3.25 does not know nvcc 13's C++20 flag; the targets' C++20 dialect maps to it here.
# Set in the top-level scope too, for the GPU benchmark's CUDA sources.
foreach(_scope "" PARENT_SCOPE)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20" ${_scope})
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20" ${_scope})
endforeach()
if(NOT CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "52")
  set(CMAKE_CUDA_ARCHITECTURES 90a)
endif()

target_sources(smla_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/gpu_backend.cc
  ${CMAKE_CURRENT_LIST_DIR}/ipc_memory.cc
  ${CMAKE_CURRENT_LIST_DIR}/attend_launch.cc
  ${CMAKE_CURRENT_LIST_DIR}/query_tensor_map.cc
  ${CMAKE_CURRENT_LIST_DIR}/attend_variants.cu
  ${CMAKE_CURRENT_LIST_DIR}/check_inputs_kernel.cu
  ${CMAKE_CURRENT_LIST_DIR}/copy_kernel.cu
  ${CMAKE_CURRENT_LIST_DIR}/combine_kernel.cu
  ${CMAKE_CURRENT_LIST_DIR}/expand_query_kernel.cu
  ${CMAKE_CURRENT_LIST_DIR}/row_union_kernel.cu
  ${CMAKE_CURRENT_LIST_DIR}/write_rows_kernel.cu
)
target_compile_definitions(smla_kernels PUBLIC SMLA_WITH_CUDA)
target_link_libraries(smla_kernels PUBLIC CUDA::cudart_static)
# -lineinfo for profilers and sanitizers; a register spill is a warning, so (like every device
# code warning, smla_cuda_target) it fails the build: a kernel that starts spilling is seen
# before it is measured.
target_compile_options(smla_kernels PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo -Xptxas=--warn-on-spills --expt-relaxed-constexpr>)
smla_cuda_target(smla_kernels)
