# The private dependencies of cubridge's static libraries, as imported targets named
# cubridge_dep::<name>, and which layer needs which. Included twice: by src/CMakeLists.txt when
# building (every dependency), and by the installed cubridge-config.cmake, which finds again on
# the consumer's machine only what the asked-for components need: the exported targets name them
# (as $<LINK_ONLY:cubridge_dep::...>) and never hold a path of the build machine.
#
# Needs find_package(CUDAToolkit) first. Set CUBRIDGE_DEPENDENCIES_GLOBAL to make the targets
# visible in every directory of the build (the library's own tree); a consumer gets them in the
# directory that calls find_package(cubridge), like the cubridge:: targets.

# The layers (components) in dependency order, what each uses of the others, and its own
# dependencies.
set(CUBRIDGE_LAYERS core compile isolation swap bundle update hot_module_sink fleet)
set(CUBRIDGE_LAYER_USES_core "")
set(CUBRIDGE_LAYER_USES_compile core)
set(CUBRIDGE_LAYER_USES_isolation core)
set(CUBRIDGE_LAYER_USES_swap compile isolation)  # probation runs in a sandbox worker
set(CUBRIDGE_LAYER_USES_bundle core)
set(CUBRIDGE_LAYER_USES_update bundle)
set(CUBRIDGE_LAYER_USES_hot_module_sink update swap)
set(CUBRIDGE_LAYER_USES_fleet update)
set(CUBRIDGE_LAYER_NEEDS_core lz4 zstd)
set(CUBRIDGE_LAYER_NEEDS_compile nvrtc nvJitLink sodium)
set(CUBRIDGE_LAYER_NEEDS_isolation "")
set(CUBRIDGE_LAYER_NEEDS_swap "")
set(CUBRIDGE_LAYER_NEEDS_bundle sodium openssl)
set(CUBRIDGE_LAYER_NEEDS_update httplib openssl)
set(CUBRIDGE_LAYER_NEEDS_hot_module_sink "")
set(CUBRIDGE_LAYER_NEEDS_fleet nats)

set(_cubridge_dep_scope "")
if(CUBRIDGE_DEPENDENCIES_GLOBAL)
  set(_cubridge_dep_scope GLOBAL)
endif()

# _cubridge_dep_library(<name> <library variable> [INCLUDE_DIR <variable>]): an imported target
# for a library already found by find_library (and its header directory by find_path).
function(_cubridge_dep_library name library_var)
  cmake_parse_arguments(ARG "" "INCLUDE_DIR" "" ${ARGN})
  if(TARGET cubridge_dep::${name})
    return()
  endif()
  add_library(cubridge_dep::${name} UNKNOWN IMPORTED ${_cubridge_dep_scope})
  set_target_properties(cubridge_dep::${name} PROPERTIES IMPORTED_LOCATION "${${library_var}}")
  if(ARG_INCLUDE_DIR)
    set_target_properties(cubridge_dep::${name} PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${${ARG_INCLUDE_DIR}}")
  endif()
endfunction()

# cubridge_find_dependency(<name>): finds one dependency and makes its target. REQUIRED except
# nats, whose absence means "no fleet layer" when building.
macro(cubridge_find_dependency name)
  if("${name}" STREQUAL "nvrtc" OR "${name}" STREQUAL "nvJitLink")
    # From the toolkit: CMake 3.25's CUDA::nvrtc drags in libcuda (which nothing of cubridge
    # may link, see driver.hpp) and it has no CUDA::nvJitLink.
    string(TOUPPER ${name} _cubridge_upper)
    find_library(CUBRIDGE_${_cubridge_upper}_LIBRARY ${name} HINTS ${CUDAToolkit_LIBRARY_DIR}
                 NO_DEFAULT_PATH REQUIRED)
    _cubridge_dep_library(${name} CUBRIDGE_${_cubridge_upper}_LIBRARY)
  elseif("${name}" STREQUAL "sodium" OR "${name}" STREQUAL "lz4" OR "${name}" STREQUAL "zstd")
    # The static archives where there are some, so that the GPU machine, which has none of the
    # -dev packages, needs no extra shared library.
    string(TOUPPER ${name} _cubridge_upper)
    find_path(CUBRIDGE_${_cubridge_upper}_INCLUDE_DIR ${name}.h REQUIRED)
    find_library(CUBRIDGE_${_cubridge_upper}_LIBRARY NAMES lib${name}.a ${name} REQUIRED)
    _cubridge_dep_library(${name} CUBRIDGE_${_cubridge_upper}_LIBRARY
                          INCLUDE_DIR CUBRIDGE_${_cubridge_upper}_INCLUDE_DIR)
  elseif("${name}" STREQUAL "httplib")
    # Debian's cpp-httplib is a compiled library with a pkg-config file (no CMake config); its -D
    # flags (OpenSSL, zlib, brotli) change class layouts, so they come from pkg-config.
    if(NOT TARGET cubridge_dep::httplib)
      find_package(PkgConfig REQUIRED)
      pkg_check_modules(CUBRIDGE_HTTPLIB REQUIRED IMPORTED_TARGET ${_cubridge_dep_scope}
                        cpp-httplib)
      add_library(cubridge_dep::httplib INTERFACE IMPORTED ${_cubridge_dep_scope})
      set_target_properties(cubridge_dep::httplib PROPERTIES
        INTERFACE_LINK_LIBRARIES PkgConfig::CUBRIDGE_HTTPLIB)
    endif()
  elseif("${name}" STREQUAL "openssl")
    find_package(OpenSSL REQUIRED)
  elseif("${name}" STREQUAL "nats")
    # The NATS C client (docs/fleet.md), by its header and library (Debian's libnats-dev ships
    # the shared library only).
    find_path(CUBRIDGE_NATS_INCLUDE_DIR nats/nats.h)
    find_library(CUBRIDGE_NATS_LIBRARY nats)
    if(CUBRIDGE_NATS_INCLUDE_DIR AND CUBRIDGE_NATS_LIBRARY)
      _cubridge_dep_library(nats CUBRIDGE_NATS_LIBRARY INCLUDE_DIR CUBRIDGE_NATS_INCLUDE_DIR)
    endif()
  else()
    message(FATAL_ERROR "cubridge: no dependency named '${name}'")
  endif()
endmacro()

# cubridge_layers_with_uses(<out> layers...): the layers and every layer they use, in
# dependency order.
function(cubridge_layers_with_uses out)
  set(wanted ${ARGN})
  set(grew TRUE)
  while(grew)
    set(grew FALSE)
    foreach(layer IN LISTS wanted)
      foreach(used IN LISTS CUBRIDGE_LAYER_USES_${layer})
        if(NOT used IN_LIST wanted)
          list(APPEND wanted ${used})
          set(grew TRUE)
        endif()
      endforeach()
    endforeach()
  endwhile()
  set(ordered "")
  foreach(layer IN LISTS CUBRIDGE_LAYERS)
    if(layer IN_LIST wanted)
      list(APPEND ordered ${layer})
    endif()
  endforeach()
  set(${out} ${ordered} PARENT_SCOPE)
endfunction()

# cubridge_find_layer_dependencies(layers...): what those layers need, each found once.
function(cubridge_find_layer_dependencies)
  set(found "")
  foreach(layer IN LISTS ARGN)
    foreach(dependency IN LISTS CUBRIDGE_LAYER_NEEDS_${layer})
      if(NOT dependency IN_LIST found)
        cubridge_find_dependency(${dependency})
        list(APPEND found ${dependency})
      endif()
    endforeach()
  endforeach()
endfunction()
