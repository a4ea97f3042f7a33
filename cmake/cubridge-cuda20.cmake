# CMake 3.25 does not know that nvcc 13 speaks C++20 (newer CMake does): teach it, so that
# cuda_std_20 (a compile feature of cubridge::core) works. Included by cubridge's own
# CMakeLists.txt and by the installed package, so a consumer's .cu files compile as C++20 with no
# lines of their own. Does nothing where CMake knows already or CUDA is not enabled (yet: enable
# CUDA before find_package(cubridge)).
if(CMAKE_CUDA_COMPILER_LOADED AND NOT "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
endif()
