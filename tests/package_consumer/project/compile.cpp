// cubridge::compile alone: NVRTC compiles a kernel to PTX and nvJitLink reports its version;
// neither needs a GPU.
#include <cubridge/compile/compile.hpp>

#include <cstdio>

int main() {
  const auto nvrtc = cubridge::nvrtc_version();
  const auto nvjitlink = cubridge::nvjitlink_version();
  cubridge::compile_options options;
  options.architecture = "compute_90";
  const auto ptx = cubridge::nvrtc_compile_ptx(
      {"fill.cu", "extern \"C\" __global__ void fill(int* p) { p[threadIdx.x] = 7; }"}, options);
  if (ptx.ptx.find(".entry fill") == std::string::npos) {
    std::printf("cubridge consumer compile: no entry 'fill' in the PTX\n");
    return 1;
  }
  std::printf("cubridge consumer compile: nvrtc %d.%d nvJitLink %d.%d, %zu bytes of PTX\n",
              nvrtc.major, nvrtc.minor, nvjitlink.major, nvjitlink.minor, ptx.ptx.size());
  return 0;
}
