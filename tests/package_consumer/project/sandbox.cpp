// Installed into the same prefix as cubridge and run from a copy of that prefix moved elsewhere:
// the sandbox finds its worker in the moved tree's libexec by itself (no option, no variable),
// and the worker runs the library. No GPU.
#include <cubridge/core/installation.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer_sandbox LIBRARY\n");
    return 64;
  }
  try {
    cubridge::sandbox_options options;
    options.library = argv[1];
    options.initialize_cuda = false;
    auto box = cubridge::sandbox::start(options);
    const auto reply = box.call("answer");
    const auto worker = cubridge::locate(cubridge::helper_file::sandbox_worker);
    std::printf("cubridge consumer sandbox: worker %s (%s) answered %d\n",
                worker.path.string().c_str(), worker.found_by.c_str(), reply.status);
    return reply.status == 42 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cubridge consumer sandbox: %s\n", e.what());
    return 1;
  }
}
