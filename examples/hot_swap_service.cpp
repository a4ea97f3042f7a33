// A service that keeps answering requests with a GPU kernel while new versions of the kernel are
// dropped into a directory: each .cubin written there is staged (validated) and promoted; a bad
// one is refused and the running version keeps serving.
//   hot_swap_service WATCH_DIR FIRST.cubin [--demo NEXT.cubin]
// With --demo it copies NEXT.cubin into WATCH_DIR itself after a moment, and exits 0 once the new
// version has answered (how the examples run as tests).
#include <cubridge/core/context.hpp>
#include <cubridge/core/copy.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>
#include <cubridge/swap/directory_watcher.hpp>
#include <cubridge/swap/hot_module.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

/// The bytes of a file the example was given (a cubin): read whole with std::ifstream.
std::vector<std::byte> read_file(const std::filesystem::path& path) {
  std::vector<std::byte> bytes(std::filesystem::file_size(path));
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size())))
    throw std::runtime_error("cannot read " + path.string());
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 5) {
    std::fprintf(stderr, "usage: %s WATCH_DIR FIRST.cubin [--demo NEXT.cubin]\n", argv[0]);
    return 64;
  }
  if (!cubridge::driver::available()) {
    std::printf("hot_swap_service: no GPU: %s\n", cubridge::driver::unavailable_reason().c_str());
    return 77;
  }
  const std::filesystem::path watch_dir = argv[1];
  const bool demo = argc == 5 && std::strcmp(argv[3], "--demo") == 0;

  auto ctx = cubridge::context::create(cubridge::device::get(0));
  auto service = cubridge::hot_module::load(ctx, "answer", read_file(argv[2]));
  auto answer = service.get_kernel("answer");

  // New versions arrive as files; stage + promote happen on the watcher's thread, off the
  // serving path.
  cubridge::directory_watcher watcher(
      watch_dir, std::chrono::milliseconds(100),
      [&](const std::filesystem::path& file) {
        cubridge::scoped_current current(ctx);
        auto staged = service.stage(read_file(file), {.source_name = file.string()});
        const auto id = service.promote(std::move(staged));
        std::printf("version %llu from %s took over\n", static_cast<unsigned long long>(id),
                    file.filename().c_str());
      },
      {".cubin"},
      [](const std::filesystem::path& file, std::exception_ptr e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& what) {
          std::printf("refused %s: %s\n", file.filename().c_str(), what.what());
        }
      });
  if (demo) {
    std::thread([next = std::filesystem::path(argv[4]), watch_dir] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::filesystem::copy_file(next, watch_dir / ".incoming.tmp",
                                 std::filesystem::copy_options::overwrite_existing);
      std::filesystem::rename(watch_dir / ".incoming.tmp", watch_dir / "next.cubin");
    }).detach();
  }

  cubridge::scoped_current current(ctx);
  auto stream = cubridge::stream::create(ctx);
  auto out = cubridge::driver_buffer<unsigned>::allocate(ctx, 32);
  unsigned served_by = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(demo ? 20 : 3600);
  for (unsigned request = 1; std::chrono::steady_clock::now() < deadline; ++request) {
    const auto version = answer.launch({.block = {32}, .stream = stream}, out.span(), request);
    unsigned reply = 0;
    cubridge::copy_bytes_async(&reply, out.data(), sizeof reply, stream);
    stream.synchronize();
    if (reply / 10 != request) {
      std::printf("request %u answered wrongly: %u\n", request, reply);
      return 1;
    }
    if (version != served_by) {
      std::printf("request %u served by version %llu (answer variant %u)\n", request,
                  static_cast<unsigned long long>(version), reply % 10);
      served_by = static_cast<unsigned>(version);
      if (demo && version >= 2) return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return demo ? 1 : 0;  // the demo's new version never took over
}
