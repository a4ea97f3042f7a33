# cubridge_add_reset_guard(<target>): the reset guard, an LD_PRELOAD library in C so that it carries
# no C++ runtime (README.md), named libcubridge_reset_guard.so. It links only libdl and
# libpthread; never libcuda (the driver is found at run time). Used by tools/ and by the Python
# package (python/CMakeLists.txt), which packs it beside the extension.
# Include it at directory scope: enable_language's variables do not outlive a function's scope.
enable_language(C)
function(cubridge_add_reset_guard target)
  add_library(${target} SHARED ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/reset_guard.c)
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME cubridge_reset_guard
    C_STANDARD 11
    C_STANDARD_REQUIRED ON
    C_EXTENSIONS ON
    C_VISIBILITY_PRESET hidden)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
  target_link_libraries(${target} PRIVATE ${CMAKE_DL_LIBS} pthread)
  # Its own wrappers are referred to by address (to hand them out): bind those references locally.
  target_link_options(${target} PRIVATE -Wl,-Bsymbolic)
endfunction()
