#include <cubridge/core/detail/binary_io.hpp>
#include <cubridge/isolation/detail/sandbox_protocol.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace cubridge::detail::sandbox_protocol {
namespace {

using header_bytes_type = std::array<std::byte, header_bytes>;

struct header {
  std::uint32_t magic = 0;
  std::uint16_t version = 0;
  std::uint16_t type = 0;
  std::uint32_t fd_count = 0;
  std::uint64_t payload_bytes = 0;
};

header_bytes_type encode_header(const header& h) {
  const auto bytes = binary_writer()
                         .u32(h.magic)
                         .u16(h.version)
                         .u16(h.type)
                         .u32(h.fd_count)
                         .u32(0)  // reserved
                         .u64(h.payload_bytes)
                         .take();
  header_bytes_type out;
  std::copy(bytes.begin(), bytes.end(), out.begin());
  return out;
}

header decode_header(const header_bytes_type& bytes) {
  binary_reader r(bytes, "frame header");
  header h;
  h.magic = r.u32("magic");
  h.version = r.u16("version");
  h.type = r.u16("message type");
  h.fd_count = r.u32("descriptor count");
  (void)r.u32("reserved");
  h.payload_bytes = r.u64("payload length");
  return h;
}

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
  auto head = encode_header({frame_magic, protocol_version, static_cast<std::uint16_t>(type),
                             static_cast<std::uint32_t>(fds.size()), payload.size()});

  iovec parts[2] = {{head.data(), head.size()},
                    {const_cast<std::byte*>(payload.data()), payload.size()}};
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
  const std::size_t total = head.size() + payload.size();
  while (done < total) {
    const std::byte* from;
    std::size_t left;
    if (done < head.size()) {
      from = head.data() + done;
      left = head.size() - done;
    } else {
      from = payload.data() + (done - head.size());
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
                             std::optional<std::chrono::steady_clock::time_point> deadline,
                             std::size_t max_payload) {
  max_payload = std::min(max_payload, max_payload_bytes);
  out = frame{};
  header_bytes_type head{};
  std::size_t got = 0;
  bool control_truncated = false;
  while (got < head.size()) {
    if (!wait_readable(socket, deadline)) return receive_status::timed_out;
    iovec part{head.data() + got, head.size() - got};
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
  const header h = decode_header(head);
  if (h.magic != frame_magic)
    throw protocol_violation("bad frame magic " + std::to_string(h.magic));
  if (h.version != protocol_version)
    throw protocol_violation("protocol version " + std::to_string(h.version) + ", expected " +
                             std::to_string(protocol_version));
  if (h.type == 0 || h.type > last_message_type)
    throw protocol_violation("unknown message type " + std::to_string(h.type));
  if (h.payload_bytes > max_payload)
    throw protocol_violation(
        "payload of " + std::to_string(h.payload_bytes) + " bytes exceeds the limit of " +
        std::to_string(max_payload) +
        (max_payload < max_payload_bytes ? " (the room the call asked for)" : ""));
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

// --- messages -----------------------------------------------------------------------------------

namespace {

/// Reads a payload with `fields` and checks nothing is left; a field that does not fit is a
/// protocol_violation naming the message, the field and its offset.
template <class Fields>
auto decode(std::span<const std::byte> payload, const char* message, Fields&& fields) {
  try {
    binary_reader r(payload, message);
    auto m = fields(r);
    r.expect_end();
    return m;
  } catch (const binary_read_error& e) {
    throw protocol_violation(e.what());
  }
}

std::vector<std::byte> copy_of(std::span<const std::byte> bytes) {
  return {bytes.begin(), bytes.end()};
}

// Bytes of one buffer_descriptor on the wire: id, size, address (u64 each), has_fd (u8), device.
constexpr std::size_t buffer_descriptor_bytes = 3 * 8 + 1 + 4;

void write_buffers(binary_writer& w, const std::vector<buffer_descriptor>& buffers) {
  w.u32(static_cast<std::uint32_t>(buffers.size()));
  for (const auto& b : buffers)
    w.u64(b.id).u64(b.size_bytes).u64(b.host_address).u8(b.has_fd ? 1 : 0).i32(b.device);
}

std::vector<buffer_descriptor> read_buffers(binary_reader& r, const char* message) {
  const std::size_t at = r.offset();
  const std::uint32_t count = r.u32("buffer count");
  // Refuse counts the rest cannot hold before reserving room for them.
  if (count > r.remaining() / buffer_descriptor_bytes)
    throw protocol_violation(std::string(message) + ": buffer count at offset " +
                             std::to_string(at) + " announces " + std::to_string(count) +
                             " buffers, " + std::to_string(r.remaining()) + " bytes are left");
  std::vector<buffer_descriptor> buffers(count);
  for (auto& b : buffers) {
    b.id = r.u64("buffer id");
    b.size_bytes = r.u64("buffer size");
    b.host_address = r.u64("buffer address");
    const std::uint8_t has_fd = r.u8("buffer flag");
    if (has_fd > 1)
      throw protocol_violation("buffer flag " + std::to_string(has_fd) + " is not 0 or 1");
    b.has_fd = has_fd == 1;
    b.device = r.i32("buffer device");
  }
  return buffers;
}

/// A u16 code of an enum whose values are 1 .. last; anything else is a protocol violation
/// ("unknown <name> N").
template <class Enum>
Enum read_code(binary_reader& r, const char* field, const char* name, std::uint16_t last) {
  const std::uint16_t code = r.u16(field);
  if (code < 1 || code > last)
    throw protocol_violation("unknown " + std::string(name) + " " + std::to_string(code));
  return static_cast<Enum>(code);
}

void put_le(std::byte* at, std::uint64_t value, std::size_t bytes) noexcept {
  for (std::size_t i = 0; i < bytes; ++i) at[i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
}

}  // namespace

std::vector<std::byte> encode(const ready_message& m) {
  return binary_writer().i32(m.pid).text(m.cuda_status).take();
}
std::vector<std::byte> encode(const start_failed_message& m) {
  return binary_writer().text(m.reason).take();
}
std::vector<std::byte> encode(const call_message& m) {
  binary_writer w;
  w.text(m.entry).length_prefixed(m.request).u64(m.reply_capacity);
  write_buffers(w, m.buffers);
  return w.take();
}
std::vector<std::byte> encode(const result_message& m) {
  return binary_writer().i32(m.status).length_prefixed(m.reply).take();
}
std::vector<std::byte> encode(const call_failed_message& m) {
  return binary_writer().u16(static_cast<std::uint16_t>(m.reason)).text(m.detail).take();
}
std::vector<std::byte> encode(const cuda_fault_message& m) {
  return binary_writer()
      .i32(m.code)
      .text(m.name)
      .text(m.entry)
      .i32(m.entry_status)
      .u8(m.context_reset ? 1 : 0)
      .take();
}
std::vector<std::byte> encode(const unshare_message& m) {
  return binary_writer().u64(m.id).take();
}
std::vector<std::byte> encode(const dying_message& m) {
  return binary_writer().u16(static_cast<std::uint16_t>(m.cause)).i32(m.value).take();
}
std::vector<std::byte> encode(const map_message& m) {
  binary_writer w;
  write_buffers(w, m.buffers);
  return w.take();
}
std::vector<std::byte> encode(const mapped_message& m) {
  binary_writer w;
  w.u32(static_cast<std::uint32_t>(m.ids.size()));
  for (const auto id : m.ids) w.u64(id);
  return w.text(m.failure).take();
}

void encode_dying_frame(const dying_message& m,
                        std::span<std::byte, dying_frame_bytes> out) noexcept {
  // The layout of encode_header() and encode(dying_message), written in place: no allocation.
  std::byte* p = out.data();
  put_le(p, frame_magic, 4);
  put_le(p + 4, protocol_version, 2);
  put_le(p + 6, static_cast<std::uint16_t>(message_type::dying), 2);
  put_le(p + 8, 0, 4);   // descriptors
  put_le(p + 12, 0, 4);  // reserved
  put_le(p + 16, dying_frame_bytes - header_bytes, 8);
  put_le(p + header_bytes, static_cast<std::uint16_t>(m.cause), 2);
  put_le(p + header_bytes + 2, static_cast<std::uint32_t>(m.value), 4);
}

ready_message decode_ready(std::span<const std::byte> payload) {
  return decode(payload, "ready message", [](binary_reader& r) {
    ready_message m;
    m.pid = r.i32("pid");
    m.cuda_status = r.text("CUDA status");
    return m;
  });
}
start_failed_message decode_start_failed(std::span<const std::byte> payload) {
  return decode(payload, "start_failed message",
                [](binary_reader& r) { return start_failed_message{r.text("reason")}; });
}
call_message decode_call(std::span<const std::byte> payload) {
  return decode(payload, "call message", [](binary_reader& r) {
    call_message m;
    m.entry = r.text("entry");
    m.request = copy_of(r.length_prefixed("request"));
    m.reply_capacity = r.u64("reply capacity");
    m.buffers = read_buffers(r, "call message");
    return m;
  });
}
result_message decode_result(std::span<const std::byte> payload) {
  return decode(payload, "result message", [](binary_reader& r) {
    result_message m;
    m.status = r.i32("status");
    m.reply = copy_of(r.length_prefixed("reply"));
    return m;
  });
}
call_failed_message decode_call_failed(std::span<const std::byte> payload) {
  return decode(payload, "call_failed message", [](binary_reader& r) {
    call_failed_message m;
    m.reason = read_code<call_failure>(r, "reason", "call failure", 3);
    m.detail = r.text("detail");
    return m;
  });
}
cuda_fault_message decode_cuda_fault(std::span<const std::byte> payload) {
  return decode(payload, "cuda_fault message", [](binary_reader& r) {
    cuda_fault_message m;
    m.code = r.i32("CUresult");
    m.name = r.text("error name");
    m.entry = r.text("entry");
    m.entry_status = r.i32("entry status");
    const std::uint8_t reset = r.u8("reset flag");
    if (reset > 1)
      throw protocol_violation("reset flag " + std::to_string(reset) + " is not 0 or 1");
    m.context_reset = reset == 1;
    return m;
  });
}
unshare_message decode_unshare(std::span<const std::byte> payload) {
  return decode(payload, "unshare message",
                [](binary_reader& r) { return unshare_message{r.u64("buffer id")}; });
}

dying_message decode_dying(std::span<const std::byte> payload) {
  return decode(payload, "dying message", [](binary_reader& r) {
    dying_message m;
    m.cause = read_code<dying_cause>(r, "cause", "dying cause", 2);
    m.value = r.i32("value");
    return m;
  });
}
map_message decode_map(std::span<const std::byte> payload) {
  return decode(payload, "map message",
                [](binary_reader& r) { return map_message{read_buffers(r, "map message")}; });
}
mapped_message decode_mapped(std::span<const std::byte> payload) {
  return decode(payload, "mapped message", [](binary_reader& r) {
    mapped_message m;
    const std::size_t at = r.offset();
    const std::uint32_t count = r.u32("id count");
    if (count > r.remaining() / 8)
      throw protocol_violation("mapped message: id count at offset " + std::to_string(at) +
                               " announces " + std::to_string(count) + " ids, " +
                               std::to_string(r.remaining()) + " bytes are left");
    m.ids.resize(count);
    for (auto& id : m.ids) id = r.u64("buffer id");
    m.failure = r.text("failure");
    return m;
  });
}

std::size_t fd_count(const map_message& m) noexcept {
  return static_cast<std::size_t>(
      std::count_if(m.buffers.begin(), m.buffers.end(), [](const auto& b) { return b.has_fd; }));
}

std::size_t fd_count(const call_message& m) noexcept {
  return static_cast<std::size_t>(
      std::count_if(m.buffers.begin(), m.buffers.end(), [](const auto& b) { return b.has_fd; }));
}

}  // namespace cubridge::detail::sandbox_protocol
