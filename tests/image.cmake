# Tests of cubridge/core/image.hpp (no GPU needed). Included by tests/CMakeLists.txt.
#
# The fixtures are compiled at build time by nvcc from tests/data/image_kernels.cu, whose
# kernels have known parameter lists, and handed to the test as compile definitions
# (CUBRIDGE_IMAGE_<NAME>="path").

set(CUBRIDGE_IMAGE_SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/data/image_kernels.cu)
set(CUBRIDGE_IMAGE_DIR ${CMAKE_CURRENT_BINARY_DIR}/image_fixtures)
set(cubridge_image_outputs)
set(cubridge_image_definitions)

# cubridge_image_fixture(NAME file nvcc-arguments...)
function(cubridge_image_fixture name file)
  set(output ${CUBRIDGE_IMAGE_DIR}/${file})
  add_custom_command(OUTPUT ${output}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CUBRIDGE_IMAGE_DIR}
    COMMAND ${CMAKE_CUDA_COMPILER} ${ARGN} -o ${output} ${CUBRIDGE_IMAGE_SOURCE}
    DEPENDS ${CUBRIDGE_IMAGE_SOURCE}
    COMMENT "Generating image fixture ${file}"
    VERBATIM)
  set(cubridge_image_outputs ${cubridge_image_outputs} ${output} PARENT_SCOPE)
  set(cubridge_image_definitions ${cubridge_image_definitions}
      CUBRIDGE_IMAGE_${name}="${output}" PARENT_SCOPE)
endfunction()

foreach(arch sm_80 sm_90 sm_90a sm_100 sm_100a sm_100f sm_120)
  string(TOUPPER ${arch} upper)
  cubridge_image_fixture(CUBIN_${upper} image_kernels.${arch}.cubin -cubin -arch=${arch})
endforeach()
# Relocatable (-rdc): device functions are global symbols too, but not kernels.
cubridge_image_fixture(CUBIN_RDC image_kernels.rdc.sm_90.cubin -cubin -rdc=true -arch=sm_90)
cubridge_image_fixture(PTX_COMPUTE_90 image_kernels.compute_90.ptx -ptx -arch=sm_90)
cubridge_image_fixture(PTX_COMPUTE_90A image_kernels.compute_90a.ptx -ptx -arch=sm_90a)
# Multi-architecture fatbin, nothing compressed.
cubridge_image_fixture(FATBIN_MULTI image_kernels.multi.fatbin -fatbin --no-compress
  -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a
  -gencode arch=compute_100f,code=sm_100f -gencode arch=compute_90,code=compute_90)
# The four --compress-mode values, each for one sm_90 cubin and its compute_90 PTX. What each
# compresses, read from each fixture's entry flags (cuobjdump was not at hand to cross-check):
#   size: cubin and PTX zstd; speed: PTX LZ4, cubin stored; default: PTX zstd, cubin stored;
#   none: nothing compressed.
foreach(mode size speed default none)
  string(TOUPPER ${mode} upper)
  cubridge_image_fixture(FATBIN_MODE_${upper} image_kernels.mode_${mode}.fatbin -fatbin
    --compress-mode=${mode} -gencode arch=compute_90,code=[sm_90,compute_90])
endforeach()
# nvcc's default: PTX compressed with zstd, cubins not.
cubridge_image_fixture(FATBIN_ZSTD image_kernels.zstd.fatbin -fatbin
  -gencode arch=compute_80,code=[sm_80,compute_80])
# Every entry compressed with LZ4.
cubridge_image_fixture(FATBIN_LZ4 image_kernels.lz4.fatbin -fatbin -Xfatbin -compress-all
  --compress-mode=speed -gencode arch=compute_86,code=[sm_86,compute_86])
# An LTO IR entry next to a cubin.
cubridge_image_fixture(FATBIN_LTO image_kernels.lto.fatbin -fatbin
  -gencode arch=compute_90,code=lto_90 -gencode arch=compute_80,code=sm_80)

# For the GPU tests of module, library and hot_module: the loaders' test kernels and a hot-swap
# version (VERSION 6) as `--compress-mode=size` fatbins, whose cubin entry is zstd-compressed.
# Next to the other GPU test images, not in image_fixtures/ (scripts/gpu-build drops that folder).
set(CUBRIDGE_SIZE_FATBIN ${CMAKE_CURRENT_BINARY_DIR}/test_kernels.size.fatbin)
set(CUBRIDGE_HOT_SIZE_FATBIN ${CMAKE_CURRENT_BINARY_DIR}/hot_v6.size.fatbin)
add_custom_command(OUTPUT ${CUBRIDGE_SIZE_FATBIN}
  COMMAND ${CMAKE_CUDA_COMPILER} -fatbin --compress-mode=size -gencode arch=compute_80,code=sm_80
          -gencode arch=compute_90,code=sm_90 -o ${CUBRIDGE_SIZE_FATBIN}
          ${CMAKE_CURRENT_SOURCE_DIR}/kernels/test_kernels.cu
  DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/kernels/test_kernels.cu VERBATIM)
add_custom_command(OUTPUT ${CUBRIDGE_HOT_SIZE_FATBIN}
  COMMAND ${CMAKE_CUDA_COMPILER} -fatbin --compress-mode=size -gencode arch=compute_90,code=sm_90
          -DVERSION=6 -o ${CUBRIDGE_HOT_SIZE_FATBIN} ${CMAKE_CURRENT_SOURCE_DIR}/kernels/hot_kernels.cu
  DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/kernels/hot_kernels.cu VERBATIM)
list(APPEND cubridge_image_outputs ${CUBRIDGE_SIZE_FATBIN} ${CUBRIDGE_HOT_SIZE_FATBIN})

add_custom_target(cubridge_image_fixtures DEPENDS ${cubridge_image_outputs})

foreach(gpu_test test_module test_library test_hot_module)
  if(TARGET ${gpu_test})
    target_compile_definitions(${gpu_test} PRIVATE CUBRIDGE_SIZE_FATBIN="${CUBRIDGE_SIZE_FATBIN}"
                               CUBRIDGE_HOT_SIZE_FATBIN="${CUBRIDGE_HOT_SIZE_FATBIN}")
    add_dependencies(${gpu_test} cubridge_image_fixtures)
  endif()
endforeach()

cubridge_add_test(test_image SOURCES core/test_image.cpp)
target_compile_definitions(test_image PRIVATE ${cubridge_image_definitions})
add_dependencies(test_image cubridge_image_fixtures)
