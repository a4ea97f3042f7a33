#include <cubridge/core/error.hpp>
#include <cubridge/swap/directory_watcher.hpp>

#include <gtest/gtest.h>

#include "temp_dir.hpp"

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace {

using cubridge::testing::temp_dir;

using namespace std::chrono_literals;
namespace fs = std::filesystem;

/// Collects reported paths; waits for them with a deadline.
struct reports {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<fs::path> paths;
  void add(const fs::path& p) {
    std::lock_guard lock(mutex);
    paths.push_back(p);
    changed.notify_all();
  }
  bool wait_for_count(std::size_t n, std::chrono::milliseconds timeout = 5000ms) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, timeout, [&] { return paths.size() >= n; });
  }
  std::vector<fs::path> snapshot() {
    std::lock_guard lock(mutex);
    return paths;
  }
};

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

TEST(DirectoryWatcher, ReportsAWrittenFileOnceAfterTheDebounce) {
  temp_dir dir;
  reports r;
  cubridge::directory_watcher watcher(dir.path, 100ms, [&](const fs::path& p) { r.add(p); });
  const auto start = std::chrono::steady_clock::now();
  write_file(dir.path / "filters.cubin", "v1");
  ASSERT_TRUE(r.wait_for_count(1));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms) << "reported before the debounce";
  EXPECT_EQ(r.snapshot().front(), dir.path / "filters.cubin");
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(r.snapshot().size(), 1u);
}

TEST(DirectoryWatcher, ABurstOfWritesIsOneReport) {
  temp_dir dir;
  reports r;
  cubridge::directory_watcher watcher(dir.path, 200ms, [&](const fs::path& p) { r.add(p); });
  for (int i = 0; i < 5; ++i) {
    write_file(dir.path / "filters.cubin", "version " + std::to_string(i));
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(r.wait_for_count(1));
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(r.snapshot().size(), 1u);
}

TEST(DirectoryWatcher, FiltersByExtensionAndIgnoresHiddenTemporaries) {
  temp_dir dir;
  reports r;
  cubridge::directory_watcher watcher(dir.path, 50ms, [&](const fs::path& p) { r.add(p); },
                                      {".cubin", ".cu"});
  write_file(dir.path / "notes.txt", "ignored");
  write_file(dir.path / ".filters.cubin.tmp", "a temporary");
  fs::rename(dir.path / ".filters.cubin.tmp", dir.path / "filters.cubin");  // atomic publish
  write_file(dir.path / "scale.cu", "__global__ void k() {}");
  ASSERT_TRUE(r.wait_for_count(2));
  std::this_thread::sleep_for(200ms);
  auto got = r.snapshot();
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<fs::path>{dir.path / "filters.cubin", dir.path / "scale.cu"}));
}

TEST(DirectoryWatcher, ACallbackThatThrowsIsReportedAndWatchingGoesOn) {
  temp_dir dir;
  reports ok, failed;
  cubridge::directory_watcher watcher(
      dir.path, 50ms,
      [&](const fs::path& p) {
        if (p.filename() == "bad.cubin") throw std::runtime_error("stage refused it");
        ok.add(p);
      },
      {}, [&](const fs::path& p, std::exception_ptr) { failed.add(p); });
  write_file(dir.path / "bad.cubin", "x");
  ASSERT_TRUE(failed.wait_for_count(1));
  write_file(dir.path / "good.cubin", "y");
  ASSERT_TRUE(ok.wait_for_count(1));
  EXPECT_EQ(ok.snapshot().front().filename(), "good.cubin");
}

TEST(DirectoryWatcher, AMissingDirectoryIsAnErrorNamingIt) {
  try {
    cubridge::directory_watcher watcher("/nonexistent/modules", 50ms, [](const fs::path&) {});
    FAIL() << "no throw";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::io));
    EXPECT_NE(std::string(e.what()).find("/nonexistent/modules"), std::string::npos) << e.what();
  }
}

TEST(DirectoryWatcher, StopsPromptly) {
  temp_dir dir;
  const auto start = std::chrono::steady_clock::now();
  {
    cubridge::directory_watcher watcher(dir.path, 10s, [](const fs::path&) {});
    write_file(dir.path / "pending.cubin", "never reported: the watcher stops first");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

}  // namespace
