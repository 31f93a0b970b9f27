# Warnings and sanitizers for host code; the warnings are applied per target through
# smla_host_target().

if(SMLA_SANITIZE)
  string(REPLACE ";" "," _smla_san "${SMLA_SANITIZE}")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_smla_san}>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>)
  add_link_options(-fsanitize=${_smla_san})
endif()

# Compile options rather than a linked interface target: a static library's private links are
# part of its export (cmake/SmlaInstall.cmake), and these flags are this build's only.
function(smla_host_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter>)
endfunction()

# CUDA sources: nvcc's own warnings (front end, ptxas) and the host compiler's are errors, as
# for host code.
function(smla_cuda_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings
                              -Xcompiler=-Wall,-Wextra,-Werror,-Wno-unused-parameter>)
endfunction()

# HIP defaults, set before the top level enables the HIP language: gfx950 (MI355X) unless the
# caller names other targets, and ROCm's clang as the HIP compiler when ROCm is installed.
if(SMLA_GPU_BACKEND STREQUAL "hip")
  if(NOT DEFINED CMAKE_HIP_ARCHITECTURES AND NOT DEFINED ENV{HIPARCHS})
    set(CMAKE_HIP_ARCHITECTURES gfx950 CACHE STRING "AMD GPU targets of the HIP build")
  endif()
  if(DEFINED ENV{ROCM_PATH})
    set(_smla_rocm "$ENV{ROCM_PATH}")
  else()
    set(_smla_rocm /opt/rocm)
  endif()
  if(NOT DEFINED CMAKE_HIP_COMPILER AND NOT DEFINED ENV{HIPCXX}
     AND EXISTS "${_smla_rocm}/llvm/bin/clang++")
    set(CMAKE_HIP_COMPILER "${_smla_rocm}/llvm/bin/clang++" CACHE FILEPATH "HIP compiler")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${_smla_rocm}")
endif()
