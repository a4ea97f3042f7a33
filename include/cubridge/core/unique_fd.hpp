#pragma once
// An owned POSIX file descriptor: closed exactly once, by its destructor or reset().

#include <unistd.h>

#include <utility>

namespace cubridge {

/// Owning, move-only file descriptor. -1 means "none"; a moved-from object holds -1.
class unique_fd {
 public:
  unique_fd() noexcept = default;
  /// Takes ownership of `fd` (-1 allowed).
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Gives the descriptor up without closing it.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the held descriptor (if any) and takes `fd`.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0 && fd_ != fd) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace cubridge
