# The private dependencies of cubridge's static libraries, as imported targets named
# cubridge_dep::<name>. Included twice: by src/CMakeLists.txt when building, and by the installed
# cubridge-config.cmake, which so finds them again on the consumer's machine: the exported
# targets name them (as $<LINK_ONLY:cubridge_dep::...>) and never hold a path of the build machine.
#
# Needs find_package(CUDAToolkit) first. Set CUBRIDGE_DEPENDENCIES_GLOBAL to make the targets
# visible in every directory of the build (the library's own tree); a consumer gets them in the
# directory that calls find_package(cubridge), like the cubridge:: targets.

set(_cubridge_dep_scope "")
if(CUBRIDGE_DEPENDENCIES_GLOBAL)
  set(_cubridge_dep_scope GLOBAL)
endif()

# cubridge_dep_library(<name> <library variable> [INCLUDE_DIR <variable>]): an imported target for
# a library already found by find_library (and its header directory by find_path).
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

# NVRTC and nvJitLink from the toolkit: CMake 3.25's CUDA::nvrtc drags in libcuda (which nothing
# of cubridge may link, see driver.hpp) and it has no CUDA::nvJitLink.
find_library(CUBRIDGE_NVRTC_LIBRARY nvrtc HINTS ${CUDAToolkit_LIBRARY_DIR} NO_DEFAULT_PATH REQUIRED)
find_library(CUBRIDGE_NVJITLINK_LIBRARY nvJitLink HINTS ${CUDAToolkit_LIBRARY_DIR} NO_DEFAULT_PATH
             REQUIRED)
_cubridge_dep_library(nvrtc CUBRIDGE_NVRTC_LIBRARY)
_cubridge_dep_library(nvJitLink CUBRIDGE_NVJITLINK_LIBRARY)

# libsodium, liblz4, libzstd: the static archives where there are some, so that the GPU machine,
# which has none of the -dev packages, needs no extra shared library.
find_path(CUBRIDGE_SODIUM_INCLUDE_DIR sodium.h REQUIRED)
find_library(CUBRIDGE_SODIUM_LIBRARY NAMES libsodium.a sodium REQUIRED)
_cubridge_dep_library(sodium CUBRIDGE_SODIUM_LIBRARY INCLUDE_DIR CUBRIDGE_SODIUM_INCLUDE_DIR)
find_path(CUBRIDGE_LZ4_INCLUDE_DIR lz4.h REQUIRED)
find_library(CUBRIDGE_LZ4_LIBRARY NAMES liblz4.a lz4 REQUIRED)
_cubridge_dep_library(lz4 CUBRIDGE_LZ4_LIBRARY INCLUDE_DIR CUBRIDGE_LZ4_INCLUDE_DIR)
find_path(CUBRIDGE_ZSTD_INCLUDE_DIR zstd.h REQUIRED)
find_library(CUBRIDGE_ZSTD_LIBRARY NAMES libzstd.a zstd REQUIRED)
_cubridge_dep_library(zstd CUBRIDGE_ZSTD_LIBRARY INCLUDE_DIR CUBRIDGE_ZSTD_INCLUDE_DIR)

# cpp-httplib (cubridge::update): Debian's is a compiled library with a pkg-config file (no CMake
# config); its -D flags (OpenSSL, zlib, brotli) change class layouts, so they come from pkg-config.
# OpenSSL through CMake's own FindOpenSSL.
if(NOT TARGET cubridge_dep::httplib)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(CUBRIDGE_HTTPLIB REQUIRED IMPORTED_TARGET ${_cubridge_dep_scope} cpp-httplib)
  add_library(cubridge_dep::httplib INTERFACE IMPORTED ${_cubridge_dep_scope})
  set_target_properties(cubridge_dep::httplib PROPERTIES
    INTERFACE_LINK_LIBRARIES PkgConfig::CUBRIDGE_HTTPLIB)
endif()
find_package(OpenSSL REQUIRED)

# libnats (cubridge::fleet, docs/fleet.md): the NATS C client, found by its header and library
# (Debian's libnats-dev ships the shared library only). Optional: without it there is no fleet
# target, and the installed package has no cubridge::fleet.
find_path(CUBRIDGE_NATS_INCLUDE_DIR nats/nats.h)
find_library(CUBRIDGE_NATS_LIBRARY nats)
if(CUBRIDGE_NATS_INCLUDE_DIR AND CUBRIDGE_NATS_LIBRARY)
  _cubridge_dep_library(nats CUBRIDGE_NATS_LIBRARY INCLUDE_DIR CUBRIDGE_NATS_INCLUDE_DIR)
endif()
unset(_cubridge_dep_scope)
