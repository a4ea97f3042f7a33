#include <cubridge/isolation/detail/sandbox_protocol.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace cubridge::detail::sandbox_protocol {
namespace {

struct header {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t type;
  std::uint32_t fd_count;
  std::uint32_t reserved;
  std::uint64_t payload_bytes;
};
static_assert(sizeof(header) == header_bytes);

[[noreturn]] void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

/// Waits until `socket` is readable or the deadline passes. Returns false on timeout.
bool wait_readable(int socket, std::optional<std::chrono::steady_clock::time_point> deadline) {
  for (;;) {
    int timeout_ms = -1;
    if (deadline) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          *deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      timeout_ms = static_cast<int>(std::min<long long>(left.count(), 1 << 30));
    }
    pollfd p{socket, POLLIN, 0};
    const int n = ::poll(&p, 1, timeout_ms);
    if (n > 0) return true;  // readable, or hung up / error: the read tells which
    if (n == 0) continue;    // re-check the deadline
    if (errno != EINTR) throw_errno("poll on the sandbox socket");
  }
}

void close_all(std::vector<unique_fd>& fds) noexcept {
  fds.clear();
}

}  // namespace

void send_frame(int socket, message_type type, std::span<const std::byte> payload,
                std::span<const int> fds) {
  if (payload.size() > max_payload_bytes)
    throw protocol_violation("payload of " + std::to_string(payload.size()) +
                             " bytes exceeds the limit of " + std::to_string(max_payload_bytes));
  if (fds.size() > max_fds)
    throw protocol_violation(std::to_string(fds.size()) + " file descriptors exceed the limit of " +
                             std::to_string(max_fds));
  header h{frame_magic,
           protocol_version,
           static_cast<std::uint16_t>(type),
           static_cast<std::uint32_t>(fds.size()),
           0,
           payload.size()};

  iovec parts[2] = {{&h, sizeof h}, {const_cast<std::byte*>(payload.data()), payload.size()}};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds)];
  msghdr message{};
  message.msg_iov = parts;
  message.msg_iovlen = payload.empty() ? 1 : 2;
  if (!fds.empty()) {
    std::memset(control, 0, sizeof control);
    message.msg_control = control;
    message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&message);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t sent;
  do {
    sent = ::sendmsg(socket, &message, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) throw_errno("sending to the sandbox socket");
  // The rest, if the socket took only part: the fds went with the first byte.
  std::size_t done = static_cast<std::size_t>(sent);
  const std::size_t total = sizeof h + payload.size();
  while (done < total) {
    const std::byte* from;
    std::size_t left;
    if (done < sizeof h) {
      from = reinterpret_cast<const std::byte*>(&h) + done;
      left = sizeof h - done;
    } else {
      from = payload.data() + (done - sizeof h);
      left = total - done;
    }
    const ssize_t n = ::send(socket, from, left, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("sending to the sandbox socket");
    }
    done += static_cast<std::size_t>(n);
  }
}

receive_status receive_frame(int socket, frame& out,
                             std::optional<std::chrono::steady_clock::time_point> deadline) {
  out = frame{};
  header h{};
  auto* head = reinterpret_cast<char*>(&h);
  std::size_t got = 0;
  bool control_truncated = false;
  while (got < sizeof h) {
    if (!wait_readable(socket, deadline)) return receive_status::timed_out;
    iovec part{head + got, sizeof h - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds)];
    msghdr message{};
    message.msg_iov = &part;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ECONNRESET) return receive_status::closed;
      throw_errno("receiving from the sandbox socket");
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); c; c = CMSG_NXTHDR(&message, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        out.fds.emplace_back(fd);
      }
    }
    if (message.msg_flags & MSG_CTRUNC) control_truncated = true;
    if (n == 0) {
      close_all(out.fds);
      return receive_status::closed;
    }
    got += static_cast<std::size_t>(n);
  }
  if (h.magic != frame_magic)
    throw protocol_violation("bad frame magic " + std::to_string(h.magic));
  if (h.version != protocol_version)
    throw protocol_violation("protocol version " + std::to_string(h.version) + ", expected " +
                             std::to_string(protocol_version));
  if (h.type == 0 || h.type > last_message_type)
    throw protocol_violation("unknown message type " + std::to_string(h.type));
  if (h.payload_bytes > max_payload_bytes)
    throw protocol_violation("payload of " + std::to_string(h.payload_bytes) +
                             " bytes exceeds the limit of " + std::to_string(max_payload_bytes));
  if (control_truncated || h.fd_count > max_fds || out.fds.size() != h.fd_count)
    throw protocol_violation("frame announced " + std::to_string(h.fd_count) +
                             " file descriptor(s), " + std::to_string(out.fds.size()) + " arrived" +
                             (control_truncated ? " (truncated)" : ""));
  out.type = static_cast<message_type>(h.type);
  out.payload.resize(h.payload_bytes);
  std::size_t read = 0;
  while (read < out.payload.size()) {
    if (!wait_readable(socket, deadline)) return receive_status::timed_out;
    const ssize_t n = ::recv(socket, out.payload.data() + read, out.payload.size() - read, 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ECONNRESET) return receive_status::closed;
      throw_errno("receiving from the sandbox socket");
    }
    if (n == 0) return receive_status::closed;
    read += static_cast<std::size_t>(n);
  }
  return receive_status::ok;
}

// --- payload fields -----------------------------------------------------------------------------

void writer::append(const void* p, std::size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  data_.insert(data_.end(), b, b + n);
}
writer& writer::u8(std::uint8_t v) {
  return append(&v, sizeof v), *this;
}
writer& writer::u16(std::uint16_t v) {
  return append(&v, sizeof v), *this;
}
writer& writer::u32(std::uint32_t v) {
  return append(&v, sizeof v), *this;
}
writer& writer::u64(std::uint64_t v) {
  return append(&v, sizeof v), *this;
}
writer& writer::i32(std::int32_t v) {
  return append(&v, sizeof v), *this;
}
writer& writer::bytes(std::span<const std::byte> v) {
  u64(v.size());
  append(v.data(), v.size());
  return *this;
}
writer& writer::text(std::string_view v) {
  return bytes(std::as_bytes(std::span<const char>(v.data(), v.size())));
}

void reader::take(void* p, std::size_t n) {
  if (n > data_.size() - at_)
    throw protocol_violation("message ends after " + std::to_string(data_.size()) +
                             " bytes, a field needs " + std::to_string(n) + " more at offset " +
                             std::to_string(at_));
  std::memcpy(p, data_.data() + at_, n);
  at_ += n;
}
template <class T>
T reader::scalar() {
  T v;
  take(&v, sizeof v);
  return v;
}
std::uint8_t reader::u8() {
  return scalar<std::uint8_t>();
}
std::uint16_t reader::u16() {
  return scalar<std::uint16_t>();
}
std::uint32_t reader::u32() {
  return scalar<std::uint32_t>();
}
std::uint64_t reader::u64() {
  return scalar<std::uint64_t>();
}
std::int32_t reader::i32() {
  return scalar<std::int32_t>();
}
std::span<const std::byte> reader::bytes() {
  const std::uint64_t n = u64();
  if (n > data_.size() - at_)
    throw protocol_violation("a field of " + std::to_string(n) + " bytes runs past the end of a " +
                             std::to_string(data_.size()) + "-byte message");
  auto field = data_.subspan(at_, static_cast<std::size_t>(n));
  at_ += static_cast<std::size_t>(n);
  return field;
}
std::string reader::text() {
  const auto b = bytes();
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}
void reader::expect_end() const {
  if (at_ != data_.size())
    throw protocol_violation(std::to_string(data_.size() - at_) +
                             " unexpected byte(s) at the end of a message");
}

// --- messages -----------------------------------------------------------------------------------

std::vector<std::byte> encode(const ready_message& m) {
  return writer().i32(m.pid).text(m.cuda_status).take();
}
std::vector<std::byte> encode(const start_failed_message& m) {
  return writer().text(m.reason).take();
}
std::vector<std::byte> encode(const call_message& m) {
  writer w;
  w.text(m.entry)
      .bytes(m.request)
      .u64(m.reply_capacity)
      .u32(static_cast<std::uint32_t>(m.buffers.size()));
  for (const auto& b : m.buffers)
    w.u64(b.id).u64(b.size_bytes).u64(b.host_address).u8(b.has_fd ? 1 : 0).i32(b.device);
  return w.take();
}
std::vector<std::byte> encode(const result_message& m) {
  return writer().i32(m.status).bytes(m.reply).take();
}
std::vector<std::byte> encode(const call_failed_message& m) {
  return writer().u16(static_cast<std::uint16_t>(m.reason)).text(m.detail).take();
}
std::vector<std::byte> encode(const cuda_fault_message& m) {
  return writer().i32(m.code).text(m.name).text(m.entry).i32(m.entry_status).take();
}
std::vector<std::byte> encode(const unshare_message& m) {
  return writer().u64(m.id).take();
}

ready_message decode_ready(std::span<const std::byte> payload) {
  reader r(payload);
  ready_message m;
  m.pid = r.i32();
  m.cuda_status = r.text();
  r.expect_end();
  return m;
}
start_failed_message decode_start_failed(std::span<const std::byte> payload) {
  reader r(payload);
  start_failed_message m{r.text()};
  r.expect_end();
  return m;
}
call_message decode_call(std::span<const std::byte> payload) {
  reader r(payload);
  call_message m;
  m.entry = r.text();
  const auto request = r.bytes();
  m.request.assign(request.begin(), request.end());
  m.reply_capacity = r.u64();
  const std::uint32_t count = r.u32();
  // Each descriptor takes 29 bytes: refuse counts the payload cannot hold before reserving.
  if (count > payload.size() / 29)
    throw protocol_violation("call announces " + std::to_string(count) +
                             " buffers in a message of " + std::to_string(payload.size()) +
                             " bytes");
  m.buffers.resize(count);
  for (auto& b : m.buffers) {
    b.id = r.u64();
    b.size_bytes = r.u64();
    b.host_address = r.u64();
    const std::uint8_t has_fd = r.u8();
    if (has_fd > 1)
      throw protocol_violation("buffer flag " + std::to_string(has_fd) + " is not 0 or 1");
    b.has_fd = has_fd == 1;
    b.device = r.i32();
  }
  r.expect_end();
  return m;
}
result_message decode_result(std::span<const std::byte> payload) {
  reader r(payload);
  result_message m;
  m.status = r.i32();
  const auto reply = r.bytes();
  m.reply.assign(reply.begin(), reply.end());
  r.expect_end();
  return m;
}
call_failed_message decode_call_failed(std::span<const std::byte> payload) {
  reader r(payload);
  call_failed_message m;
  const std::uint16_t reason = r.u16();
  if (reason < 1 || reason > 3)
    throw protocol_violation("unknown call failure " + std::to_string(reason));
  m.reason = static_cast<call_failure>(reason);
  m.detail = r.text();
  r.expect_end();
  return m;
}
cuda_fault_message decode_cuda_fault(std::span<const std::byte> payload) {
  reader r(payload);
  cuda_fault_message m;
  m.code = r.i32();
  m.name = r.text();
  m.entry = r.text();
  m.entry_status = r.i32();
  r.expect_end();
  return m;
}
unshare_message decode_unshare(std::span<const std::byte> payload) {
  reader r(payload);
  unshare_message m{r.u64()};
  r.expect_end();
  return m;
}

std::size_t fd_count(const call_message& m) noexcept {
  return static_cast<std::size_t>(
      std::count_if(m.buffers.begin(), m.buffers.end(), [](const auto& b) { return b.has_fd; }));
}

}  // namespace cubridge::detail::sandbox_protocol
