#pragma once
// The wire protocol between a sandbox host and its worker, over one Unix stream socket.
//
// Each message is one frame: a 24-byte header (magic "CBSX", version, type, number of file
// descriptors, a reserved word, payload length; little-endian), then the payload. File
// descriptors travel as SCM_RIGHTS ancillary data on the header's bytes, so a receiver gets them
// with the header or not at all; the header says how many to expect. Header and payload fields
// are little-endian integers and length-prefixed byte strings (core/detail/binary_io.hpp), read
// with bounds checks: a short, long or malformed message is a protocol_violation, never a crash.

#include <cubridge/core/unique_fd.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::detail::sandbox_protocol {

inline constexpr std::uint32_t frame_magic = 0x58534243;  // "CBSX"
inline constexpr std::uint16_t protocol_version =
    2;  // 2: dying, map, mapped; cuda_fault's reset flag
inline constexpr std::size_t header_bytes = 24;
inline constexpr std::size_t max_payload_bytes = std::size_t{64} << 20;
inline constexpr std::size_t max_fds = 64;
/// The largest reply a call may ask room for, and the largest request (entry name and bytes
/// together): what fits a frame with the rest of the call message.
inline constexpr std::size_t max_reply_capacity = max_payload_bytes - 64;
inline constexpr std::size_t max_request_bytes = max_payload_bytes - 4096;

/// Exit status of a worker that reported a sticky CUDA error and ended itself.
inline constexpr int worker_exit_cuda_fault = 70;
/// Exit status of a worker that could not load its library (after sending start_failed).
inline constexpr int worker_exit_start_failed = 71;
/// Exit status of a worker that received a malformed message.
inline constexpr int worker_exit_protocol = 72;

enum class message_type : std::uint16_t {
  ready = 1,     ///< worker -> host: loaded, waiting for calls
  start_failed,  ///< worker -> host: could not load the library; the worker exits
  call,          ///< host -> worker: run an entry point (buffer fds attached)
  result,        ///< worker -> host: the entry returned
  call_failed,   ///< worker -> host: the call could not be made; the worker carries on
  cuda_fault,    ///< worker -> host: a sticky CUDA error after the call; the worker exits
  unshare,       ///< host -> worker: unmap a shared buffer
  dying,         ///< worker -> host: a fatal signal or exit() is ending the worker (its last words)
  map,           ///< host -> worker: map these shared buffers now (fds attached), before a call
  mapped,        ///< worker -> host: the answer to map
};
inline constexpr std::uint16_t last_message_type = static_cast<std::uint16_t>(message_type::mapped);

/// A malformed frame or payload.
class protocol_violation : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One received frame.
struct frame {
  message_type type{};
  std::vector<std::byte> payload;
  std::vector<unique_fd> fds;
};

/// Sends one frame on a stream socket (MSG_NOSIGNAL: a dead peer is an error, not SIGPIPE).
/// @throws std::system_error (e.g. EPIPE, ECONNRESET) if the socket fails; protocol_violation
///         for a payload or fd count above the limits.
void send_frame(int socket, message_type type, std::span<const std::byte> payload,
                std::span<const int> fds = {});

enum class receive_status { ok, closed, timed_out };

/// Receives one frame, waiting at most until `deadline` (none: forever). `closed` when the peer
/// closed the socket before a whole frame arrived (a partial frame then is a violation only if
/// the peer is still there: a crash mid-frame reads as closed).
/// @throws protocol_violation for a bad header (magic, version, type, sizes) or fds that do not
///         match the header; std::system_error if the socket fails.
/// `max_payload`: a larger payload is a violation, found from the header before any of it is
/// read (a reply is held to the room its call asked for: reply_payload_limit).
receive_status receive_frame(int socket, frame& out,
                             std::optional<std::chrono::steady_clock::time_point> deadline,
                             std::size_t max_payload = max_payload_bytes);

/// The largest payload of a frame answering a call that asked for `reply_capacity` bytes of
/// reply: the reply and 64 KiB for the rest (a result's status, a refusal's or a fault's text).
[[nodiscard]] constexpr std::size_t reply_payload_limit(std::size_t reply_capacity) noexcept {
  return reply_capacity + (std::size_t{64} << 10) < max_payload_bytes
             ? reply_capacity + (std::size_t{64} << 10)
             : max_payload_bytes;
}

// --- messages -----------------------------------------------------------------------------------

struct ready_message {
  std::int32_t pid = 0;
  std::string cuda_status;  ///< empty: CUDA initialised (or not asked for); else why not
};
struct start_failed_message {
  std::string reason;
};
struct buffer_descriptor {
  std::uint64_t id = 0;
  std::uint64_t size_bytes = 0;
  std::uint64_t host_address = 0;  ///< a hint: the worker maps there if that range is free
  bool has_fd = false;             ///< first use in this worker: an fd comes with the frame
  std::int32_t device = 0;         ///< where the memory lives
};
struct call_message {
  std::string entry;
  std::vector<std::byte> request;
  std::uint64_t reply_capacity = 0;
  std::vector<buffer_descriptor> buffers;
};
struct result_message {
  std::int32_t status = 0;
  std::vector<std::byte> reply;
};
enum class call_failure : std::uint16_t { no_such_entry = 1, buffer_import = 2, bad_request = 3 };
struct call_failed_message {
  call_failure reason = call_failure::bad_request;
  std::string detail;
};
struct cuda_fault_message {
  std::int32_t code = 0;  ///< the CUresult
  std::string name;       ///< "CUDA_ERROR_ILLEGAL_ADDRESS"
  std::string entry;
  std::int32_t entry_status = 0;
  bool context_reset = false;  ///< the worker's primary context was reset (cudaDeviceReset)
};
struct unshare_message {
  std::uint64_t id = 0;
};
enum class dying_cause : std::uint16_t {
  signal = 1,  ///< value: the signal (SIGSEGV, SIGABRT, ...)
  exit = 2,    ///< value: the status the library passed to exit()
};
struct dying_message {
  dying_cause cause = dying_cause::signal;
  std::int32_t value = 0;
};
struct map_message {
  std::vector<buffer_descriptor> buffers;  ///< each with has_fd set: one fd each, in order
};
struct mapped_message {
  std::vector<std::uint64_t> ids;  ///< the buffers now mapped
  std::string failure;             ///< why the first one that could not be mapped was not
};

std::vector<std::byte> encode(const ready_message& m);
std::vector<std::byte> encode(const start_failed_message& m);
std::vector<std::byte> encode(const call_message& m);
std::vector<std::byte> encode(const result_message& m);
std::vector<std::byte> encode(const call_failed_message& m);
std::vector<std::byte> encode(const cuda_fault_message& m);
std::vector<std::byte> encode(const unshare_message& m);
std::vector<std::byte> encode(const dying_message& m);
std::vector<std::byte> encode(const map_message& m);
std::vector<std::byte> encode(const mapped_message& m);

/// The whole frame of a dying message: header and payload.
inline constexpr std::size_t dying_frame_bytes = header_bytes + 2 + 4;
/// Writes the frame of `m` into `out` without allocating, for a signal handler to send.
void encode_dying_frame(const dying_message& m,
                        std::span<std::byte, dying_frame_bytes> out) noexcept;

/// Decoders: @throws protocol_violation for a malformed payload (a field or string past the end,
/// bytes left over, a value out of range), naming the message, the field and its offset.
ready_message decode_ready(std::span<const std::byte> payload);
start_failed_message decode_start_failed(std::span<const std::byte> payload);
call_message decode_call(std::span<const std::byte> payload);
result_message decode_result(std::span<const std::byte> payload);
call_failed_message decode_call_failed(std::span<const std::byte> payload);
cuda_fault_message decode_cuda_fault(std::span<const std::byte> payload);
unshare_message decode_unshare(std::span<const std::byte> payload);
dying_message decode_dying(std::span<const std::byte> payload);
map_message decode_map(std::span<const std::byte> payload);
mapped_message decode_mapped(std::span<const std::byte> payload);

/// Number of buffers of `m` that carry an fd (the fds a call or map frame must have).
[[nodiscard]] std::size_t fd_count(const call_message& m) noexcept;
[[nodiscard]] std::size_t fd_count(const map_message& m) noexcept;

}  // namespace cubridge::detail::sandbox_protocol
