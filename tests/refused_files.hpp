#pragma once
// Test helpers for the readers built on detail/file_io.hpp, which refuse what is not a regular
// file (a FIFO above all) at once instead of waiting on it: a FIFO to read, the error a read
// threw, and a check that it is cubridge's I/O error saying why.

#include <cubridge/core/error.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <initializer_list>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cubridge::testing {

/// A FIFO at `path`.
inline std::filesystem::path make_fifo(const std::filesystem::path& path) {
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  return path;
}

/// Runs `read` on a thread and returns what it threw. A reader stuck opening the FIFO (as the
/// readers did before they opened with O_NONBLOCK) is released by opening the other end, and
/// reported, so that a regression fails instead of hanging the suite.
inline std::exception_ptr thrown_reading_fifo(const std::filesystem::path& fifo,
                                              const std::function<void()>& read) {
  auto result = std::async(std::launch::async, [&]() -> std::exception_ptr {
    try {
      read();
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  });
  if (result.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked on the FIFO " << fifo << " for 30 s";
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  return result.get();
}

/// The exception is a cubridge::error with errc::io whose text holds every one of `words`.
inline void expect_io_error(std::exception_ptr thrown, std::initializer_list<std::string> words) {
  ASSERT_TRUE(thrown) << "no error";
  try {
    std::rethrow_exception(thrown);
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::io)) << e.what();
    for (const auto& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a cubridge::error: " << e.what();
  }
}

}  // namespace cubridge::testing
