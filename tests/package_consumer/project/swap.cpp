// cubridge::swap alone: a directory watcher (the hot reloader's eyes) starts on an empty
// directory and stops, and a version chain keeps its first version. No GPU.
#include <cubridge/swap/directory_watcher.hpp>
#include <cubridge/swap/version_chain.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>

int main() {
  const auto directory = std::filesystem::temp_directory_path() / "cubridge-consumer-swap";
  std::filesystem::create_directories(directory);
  {
    cubridge::directory_watcher watcher(directory, std::chrono::milliseconds(10),
                                        [](const std::filesystem::path&) {});
  }
  std::filesystem::remove_all(directory);
  cubridge::version_chain<int, int, int> chain(7, cubridge::version_origin{});
  const auto lease = chain.acquire();
  std::printf("cubridge consumer swap: watcher stopped, version %llu serves %d\n",
              static_cast<unsigned long long>(lease.id()), lease.payload());
  return 0;
}
