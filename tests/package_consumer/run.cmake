# The installed package is complete and relocatable: installs cubridge from the build tree into
# one prefix, checks the exported targets hold no path of the build machine, MOVES the install
# tree elsewhere (the first prefix gone), then configures and builds a consumer project against
# the moved copy with find_package(cubridge): one program per layer, each linking only that
# layer's target, and a .cu file compiled by nvcc as C++20. Runs every program (none needs a
# GPU; where there is one, the CUDA program launches a kernel).
#   -DBUILD_DIR=<cubridge build tree> -DSOURCE_DIR=<cubridge source tree> -DWORK_DIR=<scratch>
foreach(variable BUILD_DIR SOURCE_DIR WORK_DIR)
  if(NOT ${variable})
    message(FATAL_ERROR "run.cmake needs -D${variable}=...")
  endif()
endforeach()
# The consumer is built with the compilers and generator of the library's build.
load_cache(${BUILD_DIR} READ_WITH_PREFIX cubridge_ CMAKE_GENERATOR CMAKE_MAKE_PROGRAM
           CMAKE_CXX_COMPILER CMAKE_CUDA_COMPILER CMAKE_BUILD_TYPE)

file(REMOVE_RECURSE ${WORK_DIR})
set(staged ${WORK_DIR}/staged/prefix)
set(moved ${WORK_DIR}/elsewhere/cubridge)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${staged}
                RESULT_VARIABLE r)
if(r)
  message(FATAL_ERROR "install failed: ${r}")
endif()
file(MAKE_DIRECTORY ${WORK_DIR}/elsewhere)
file(RENAME ${staged} ${moved})
file(REMOVE_RECURSE ${WORK_DIR}/staged)

# Every layer installed, with its exported target.
set(package_dir ${moved}/lib/cmake/cubridge)
foreach(library cubridge_core cubridge_compile cubridge_swap cubridge_isolation cubridge_bundle
                cubridge_update cubridge_hot_module_sink)
  if(NOT EXISTS ${moved}/lib/lib${library}.a)
    message(FATAL_ERROR "lib/lib${library}.a is not installed")
  endif()
endforeach()
file(GLOB target_files ${package_dir}/cubridge-*targets*.cmake)
if(NOT target_files)
  message(FATAL_ERROR "no cubridge-*targets*.cmake installed in ${package_dir}")
endif()
set(exported "")
foreach(file ${target_files})
  file(READ ${file} text)
  string(APPEND exported "${text}")
endforeach()
foreach(target cubridge::core cubridge::compile cubridge::swap cubridge::isolation cubridge::bundle
               cubridge::update cubridge::hot_module_sink)
  if(NOT exported MATCHES "add_library\\(${target} STATIC IMPORTED\\)")
    message(FATAL_ERROR "the package does not export ${target}")
  endif()
endforeach()
if(NOT exported MATCHES "add_library\\(cubridge::cubridge INTERFACE IMPORTED\\)")
  message(FATAL_ERROR "the package does not export cubridge::cubridge (every layer)")
endif()

# No path of the build machine in the exported targets: only ${_IMPORT_PREFIX}/... and target
# names (the private dependencies are found again by cubridge-config.cmake).
foreach(forbidden "/usr/lib" "/usr/local/cuda" "${BUILD_DIR}" "${SOURCE_DIR}" "${staged}")
  string(FIND "${exported}" "${forbidden}" at)
  if(NOT at EQUAL -1)
    string(SUBSTRING "${exported}" ${at} 120 excerpt)
    message(FATAL_ERROR "the exported targets name '${forbidden}': ...${excerpt}...")
  endif()
endforeach()
# Any absolute path at all inside a property value (a quoted string or list item starting '/').
if(exported MATCHES "[\";]/[A-Za-z0-9_.-][^\";]*")
  message(FATAL_ERROR "the exported targets hold an absolute path: ${CMAKE_MATCH_0}")
endif()

execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package_consumer/project
                -B ${WORK_DIR}/build -G "${cubridge_CMAKE_GENERATOR}"
                "-DCMAKE_MAKE_PROGRAM=${cubridge_CMAKE_MAKE_PROGRAM}"
                "-DCMAKE_CXX_COMPILER=${cubridge_CMAKE_CXX_COMPILER}"
                "-DCMAKE_CUDA_COMPILER=${cubridge_CMAKE_CUDA_COMPILER}"
                "-DCMAKE_BUILD_TYPE=${cubridge_CMAKE_BUILD_TYPE}"
                -DCMAKE_PREFIX_PATH=${moved} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
                RESULT_VARIABLE r)
if(r)
  message(FATAL_ERROR "configuring the consumer failed: ${r}")
endif()
load_cache(${WORK_DIR}/build READ_WITH_PREFIX consumer_ cubridge_DIR)
file(REAL_PATH "${consumer_cubridge_DIR}" found_dir)
file(REAL_PATH "${package_dir}" expected_dir)
if(NOT found_dir STREQUAL expected_dir)
  message(FATAL_ERROR "the consumer found cubridge in '${consumer_cubridge_DIR}', not in the moved "
                      "copy '${package_dir}'")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE r)
if(r)
  message(FATAL_ERROR "building the consumer failed: ${r}")
endif()

function(run_consumer program expected)
  execute_process(COMMAND ${WORK_DIR}/build/${program} RESULT_VARIABLE r OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  message(STATUS "${program} said: ${out}${err}")
  if(r)
    message(FATAL_ERROR "${program} failed: ${r}")
  endif()
  if(NOT out MATCHES "${expected}")
    message(FATAL_ERROR "unexpected output of ${program}: ${out}")
  endif()
endfunction()
# Each layer links only what it needs: the link line of its program (Ninja's or Makefiles') names
# none of the libraries of the layers it does not use.
function(link_line program out)
  if(EXISTS ${WORK_DIR}/build/CMakeFiles/${program}.dir/link.txt)
    file(READ ${WORK_DIR}/build/CMakeFiles/${program}.dir/link.txt text)
  else()
    execute_process(COMMAND ${cubridge_CMAKE_MAKE_PROGRAM} -C ${WORK_DIR}/build -t commands ${program}
                    OUTPUT_VARIABLE text RESULT_VARIABLE r)
    if(r)
      message(FATAL_ERROR "cannot read the link line of ${program}: ${r}")
    endif()
    string(REGEX MATCH "[^\n]*-o ${program}[^\n]*" text "${text}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()
function(expect_not_linked program)
  link_line(${program} line)
  if(line STREQUAL "")
    message(FATAL_ERROR "found no link line for ${program}")
  endif()
  foreach(library ${ARGN})
    if(line MATCHES "${library}")
      message(FATAL_ERROR "${program} links ${library}, which its layer does not need: ${line}")
    endif()
  endforeach()
endfunction()
expect_not_linked(consumer_core sodium nvrtc nvJitLink httplib ssl cubridge_compile cubridge_swap
                  cubridge_isolation cubridge_bundle cubridge_update)
expect_not_linked(consumer_update nvrtc nvJitLink cubridge_compile cubridge_swap cubridge_isolation
                  cubridge_hot_module_sink)
expect_not_linked(consumer_isolation sodium nvrtc nvJitLink httplib cubridge_compile cubridge_swap
                  cubridge_update)
expect_not_linked(consumer_compile httplib ssl cubridge_swap cubridge_isolation cubridge_update)

run_consumer(consumer_core "cubridge consumer core: (driver [0-9]+|no GPU: .+)")
run_consumer(consumer_compile "cubridge consumer compile: nvrtc [0-9]+\\.[0-9]+ nvJitLink [0-9]+")
run_consumer(consumer_bundle "cubridge consumer bundle: signed and verified [0-9]+ bytes")
run_consumer(consumer_update "cubridge consumer update: endpoint listened at http://127\\.0\\.0\\.1:[0-9]+")
run_consumer(consumer_swap "cubridge consumer swap: watcher stopped, version 1 serves 7")
run_consumer(consumer_isolation "cubridge consumer isolation: refused \\((start_failed|CUBRIDGE_[A-Z_]+)\\)")
# cubridge::fleet, where cubridge was built with libnats: exported, links no NVRTC or swap, runs.
if(EXISTS ${moved}/lib/libcubridge_fleet.a)
  if(NOT exported MATCHES "add_library\\(cubridge::fleet STATIC IMPORTED\\)")
    message(FATAL_ERROR "the package does not export cubridge::fleet")
  endif()
  expect_not_linked(consumer_fleet nvrtc nvJitLink cubridge_compile cubridge_swap
                    cubridge_isolation cubridge_hot_module_sink)
  run_consumer(consumer_fleet "cubridge consumer fleet: unreachable \\(CUBRIDGE_FLEET_UNREACHABLE\\)")
endif()
run_consumer(consumer_all "cubridge consumer core: (driver [0-9]+|no GPU: .+)")
run_consumer(consumer_aggregates "cubridge consumer aggregates: grid \\(4,1,1\\) block \\(256,1,1\\)")
# The aggregates' program was built with -Wmissing-field-initializers in force: its canary, an
# aggregate without default member initializers left half initialised, fails to build.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build --target consumer_aggregates_canary
                RESULT_VARIABLE r OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT r OR NOT "${out}${err}" MATCHES "missing-field-initializers")
  message(FATAL_ERROR "consumer_aggregates_canary built, or failed for another reason than "
                      "-Wmissing-field-initializers: the consumer's warnings are not in force "
                      "(${r}): ${out}${err}")
endif()
run_consumer(consumer_cuda "cubridge consumer cuda: (kernel wrote 7|no GPU: .+)")

# The safety nets from the moved tree, found by themselves: a program installed into the same
# (moved) prefix starts a sandbox whose worker is the moved tree's; `cubridge guard` preloads the
# moved tree's reset guard by its full path, and doctor, run under it, says it is guarded.
execute_process(COMMAND ${CMAKE_COMMAND} --install ${WORK_DIR}/build --prefix ${moved}
                RESULT_VARIABLE r)
if(r)
  message(FATAL_ERROR "installing the consumer into the moved prefix failed: ${r}")
endif()
file(REAL_PATH "${moved}" moved_real)
set(clean_env ${CMAKE_COMMAND} -E env --unset=CUBRIDGE_SANDBOX_WORKER --unset=CUBRIDGE_RESET_GUARD
              --unset=LD_PRELOAD --unset=CUBRIDGE_RESET_POLICY)
function(run_installed expected)
  execute_process(COMMAND ${clean_env} ${ARGN} RESULT_VARIABLE r OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  message(STATUS "${ARGN} said: ${out}${err}")
  if(NOT r MATCHES "^(0|69)$")
    message(FATAL_ERROR "${ARGN} failed: ${r}: ${out}${err}")
  endif()
  if(NOT "${out}" MATCHES "${expected}")
    message(FATAL_ERROR "unexpected output of ${ARGN}: ${out}${err}")
  endif()
endfunction()
run_installed("worker ${moved_real}/libexec/cubridge-sandbox-worker \\(the install tree of ${moved_real}/bin/consumer_sandbox\\) answered 42"
              ${moved}/bin/consumer_sandbox ${moved}/lib/libconsumer_box_library.so)
if(EXISTS ${moved}/bin/cubridge)
  run_installed("sandbox worker +${moved_real}/libexec/cubridge-sandbox-worker.*reset guard +${moved_real}/lib/libcubridge_reset_guard.so.*this process +not guarded"
                ${moved}/bin/cubridge doctor)
  run_installed("this process +GUARDED, policy log \\(${moved_real}/lib/libcubridge_reset_guard.so\\)"
                ${moved}/bin/cubridge guard --policy log -- ${moved}/bin/cubridge doctor)
endif()

# A core-only consumer with the upper layers' packages out of sight (no pkg-config files, no
# OpenSSL): it configures, builds and runs, and its cache shows nothing of theirs was looked for.
file(MAKE_DIRECTORY ${WORK_DIR}/no-pkgconfig)
execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_LIBDIR=${WORK_DIR}/no-pkgconfig
                PKG_CONFIG_PATH=
                ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package_consumer/core_only
                -B ${WORK_DIR}/core-only -G "${cubridge_CMAKE_GENERATOR}"
                "-DCMAKE_MAKE_PROGRAM=${cubridge_CMAKE_MAKE_PROGRAM}"
                "-DCMAKE_CXX_COMPILER=${cubridge_CMAKE_CXX_COMPILER}"
                "-DCMAKE_CUDA_COMPILER=${cubridge_CMAKE_CUDA_COMPILER}"
                "-DCMAKE_BUILD_TYPE=${cubridge_CMAKE_BUILD_TYPE}"
                -DCMAKE_PREFIX_PATH=${moved} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
                -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON
                RESULT_VARIABLE r)
if(r)
  message(FATAL_ERROR "configuring the core-only consumer failed: ${r}")
endif()
file(STRINGS ${WORK_DIR}/core-only/CMakeCache.txt cache)
foreach(entry IN LISTS cache)
  if(entry MATCHES "^(CUBRIDGE_(NVRTC|NVJITLINK|SODIUM|NATS|HTTPLIB)[A-Z_]*|OPENSSL_[A-Z_]+|PKG_CONFIG_EXECUTABLE)[:=]")
    message(FATAL_ERROR "the core-only consumer looked for an upper layer's dependency: ${entry}")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/core-only RESULT_VARIABLE r)
if(r)
  message(FATAL_ERROR "building the core-only consumer failed: ${r}")
endif()
foreach(program consumer_core consumer_cuda)
  execute_process(COMMAND ${WORK_DIR}/core-only/${program} RESULT_VARIABLE r OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  message(STATUS "core-only ${program} said: ${out}${err}")
  if(r OR NOT out MATCHES "cubridge consumer (core|cuda): ")
    message(FATAL_ERROR "core-only ${program} failed: ${r}: ${out}${err}")
  endif()
endforeach()
