# Warnings and sanitizers for host code, applied per target through smla_host_target().
add_library(smla_warnings INTERFACE)
target_compile_options(smla_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter>)

if(SMLA_SANITIZE)
  string(REPLACE ";" "," _smla_san "${SMLA_SANITIZE}")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_smla_san}>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>)
  add_link_options(-fsanitize=${_smla_san})
endif()

function(smla_host_target target)
  target_link_libraries(${target} PRIVATE smla_warnings)
endfunction()
