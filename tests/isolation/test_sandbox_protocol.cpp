// The sandbox's wire protocol (CPU): framing, file descriptors over SCM_RIGHTS, the messages,
// and every malformed header or payload refused as a protocol_violation naming what was wrong.
#include <cubridge/core/detail/binary_io.hpp>
#include <cubridge/core/unique_fd.hpp>
#include <cubridge/isolation/detail/sandbox_protocol.hpp>

#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <system_error>
#include <thread>

namespace {

namespace proto = cubridge::detail::sandbox_protocol;
using cubridge::unique_fd;
using cubridge::detail::binary_writer;
using namespace std::chrono_literals;

std::span<const std::byte> as_bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}
std::string as_text(const std::vector<std::byte>& b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

struct socket_pair {
  socket_pair() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
    a.reset(sv[0]);
    b.reset(sv[1]);
  }
  unique_fd a, b;
};

std::optional<std::chrono::steady_clock::time_point> in(std::chrono::milliseconds ms) {
  return std::chrono::steady_clock::now() + ms;
}

// --- unique_fd ----------------------------------------------------------------------------------

TEST(UniqueFd, ClosesOnceAndMoves) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  unique_fd w(p[1]);
  {
    unique_fd r(p[0]);
    unique_fd moved = std::move(r);
    EXPECT_FALSE(r);
    EXPECT_EQ(moved.get(), p[0]);
  }
  EXPECT_EQ(::fcntl(p[0], F_GETFD), -1);  // closed by `moved`
  EXPECT_NE(::fcntl(p[1], F_GETFD), -1);
  const int raw = w.release();
  EXPECT_FALSE(w);
  ::close(raw);
}

// --- framing ------------------------------------------------------------------------------------

TEST(SandboxProtocol, FramesArriveWholeAndInOrder) {
  socket_pair s;
  proto::send_frame(s.a.get(), proto::message_type::call, as_bytes("first"));
  proto::send_frame(s.a.get(), proto::message_type::result, {});
  proto::send_frame(s.a.get(), proto::message_type::unshare, as_bytes("third one"));
  proto::frame f;
  ASSERT_EQ(proto::receive_frame(s.b.get(), f, in(1000ms)), proto::receive_status::ok);
  EXPECT_EQ(f.type, proto::message_type::call);
  EXPECT_EQ(as_text(f.payload), "first");
  ASSERT_EQ(proto::receive_frame(s.b.get(), f, in(1000ms)), proto::receive_status::ok);
  EXPECT_EQ(f.type, proto::message_type::result);
  EXPECT_TRUE(f.payload.empty());
  ASSERT_EQ(proto::receive_frame(s.b.get(), f, in(1000ms)), proto::receive_status::ok);
  EXPECT_EQ(f.type, proto::message_type::unshare);
  EXPECT_EQ(as_text(f.payload), "third one");
}

TEST(SandboxProtocol, ALargePayloadArrivesWhole) {
  socket_pair s;
  std::vector<std::byte> big(8 << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>(i * 31 + (i >> 13));
  // Larger than the socket buffer: the sender blocks until the receiver reads.
  std::thread sender([&] { proto::send_frame(s.a.get(), proto::message_type::result, big); });
  proto::frame f;
  ASSERT_EQ(proto::receive_frame(s.b.get(), f, in(10000ms)), proto::receive_status::ok);
  sender.join();
  EXPECT_EQ(f.payload, big);
}

TEST(SandboxProtocol, TimesOutAndSeesAClosedPeer) {
  socket_pair s;
  proto::frame f;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(proto::receive_frame(s.b.get(), f, in(50ms)), proto::receive_status::timed_out);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms);
  // Half a header, then the peer goes away: closed, not a hang.
  const char half[10] = {};
  ASSERT_EQ(::send(s.a.get(), half, sizeof half, MSG_NOSIGNAL), 10);
  s.a.reset();
  EXPECT_EQ(proto::receive_frame(s.b.get(), f, in(1000ms)), proto::receive_status::closed);
}

TEST(SandboxProtocol, SendingToAClosedPeerThrowsInsteadOfRaisingSigpipe) {
  socket_pair s;
  s.b.reset();
  EXPECT_THROW(proto::send_frame(s.a.get(), proto::message_type::call, as_bytes("x")),
               std::system_error);
}

/// Writes a raw header, as a broken or hostile peer would.
void send_raw_header(int socket, std::uint32_t magic, std::uint16_t version, std::uint16_t type,
                     std::uint32_t fds, std::uint64_t payload) {
  const auto h =
      binary_writer().u32(magic).u16(version).u16(type).u32(fds).u32(0).u64(payload).take();
  ASSERT_EQ(h.size(), proto::header_bytes);
  ASSERT_EQ(::send(socket, h.data(), h.size(), MSG_NOSIGNAL), static_cast<ssize_t>(h.size()));
}

TEST(SandboxProtocol, BadHeadersAreViolations) {
  struct case_t {
    std::uint32_t magic;
    std::uint16_t version, type;
    std::uint32_t fds;
    std::uint64_t payload;
    const char* expect;
  };
  constexpr auto v = proto::protocol_version;
  const case_t cases[] = {
      {0x12345678, v, 1, 0, 0, "magic"},
      {proto::frame_magic, 9, 1, 0, 0, "protocol version 9"},
      {proto::frame_magic, 1, 1, 0, 0, "protocol version 1"},  // before dying, map, mapped
      {proto::frame_magic, v, 0, 0, 0, "unknown message type 0"},
      {proto::frame_magic, v, 11, 0, 0, "unknown message type 11"},
      {proto::frame_magic, v, 99, 0, 0, "unknown message type 99"},
      {proto::frame_magic, v, 1, 0, proto::max_payload_bytes + 1, "exceeds the limit"},
      {proto::frame_magic, v, 1, 2, 0, "announced 2 file descriptor(s), 0 arrived"},
  };
  for (const auto& c : cases) {
    socket_pair s;
    send_raw_header(s.a.get(), c.magic, c.version, c.type, c.fds, c.payload);
    proto::frame f;
    try {
      (void)proto::receive_frame(s.b.get(), f, in(1000ms));
      ADD_FAILURE() << "accepted a header expecting '" << c.expect << "'";
    } catch (const proto::protocol_violation& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
    }
  }
}

TEST(SandboxProtocol, RefusesOversizedSends) {
  socket_pair s;
  std::vector<int> fds(proto::max_fds + 1, 0);
  EXPECT_THROW(proto::send_frame(s.a.get(), proto::message_type::call, {}, fds),
               proto::protocol_violation);
}

TEST(SandboxProtocol, PassesFileDescriptorsWithScmRights) {
  cubridge::testing::temp_dir dir;
  const auto first = dir.path / "first.txt";
  const auto second = dir.path / "second.txt";
  cubridge::testing::write_text(first, "contents of the first file");
  cubridge::testing::write_text(second, "second");
  unique_fd f1(::open(first.c_str(), O_RDONLY | O_CLOEXEC));
  unique_fd f2(::open(second.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(f1 && f2);

  socket_pair s;
  const int fds[] = {f1.get(), f2.get()};
  proto::send_frame(s.a.get(), proto::message_type::call, as_bytes("with fds"), fds);
  f1.reset();  // the receiver's copies stay valid without the sender's
  f2.reset();
  proto::frame f;
  ASSERT_EQ(proto::receive_frame(s.b.get(), f, in(1000ms)), proto::receive_status::ok);
  EXPECT_EQ(as_text(f.payload), "with fds");
  ASSERT_EQ(f.fds.size(), 2u);
  auto read_all = [](int fd) {
    char text[64] = {};
    const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
    return std::string(text, n > 0 ? static_cast<std::size_t>(n) : 0);
  };
  EXPECT_EQ(read_all(f.fds[0].get()), "contents of the first file");
  EXPECT_EQ(read_all(f.fds[1].get()), "second");
  EXPECT_TRUE(::fcntl(f.fds[0].get(), F_GETFD) & FD_CLOEXEC) << "received fds leak into exec";
  // A frame without fds after one with them: nothing carried over.
  proto::send_frame(s.a.get(), proto::message_type::result, as_bytes("plain"));
  ASSERT_EQ(proto::receive_frame(s.b.get(), f, in(1000ms)), proto::receive_status::ok);
  EXPECT_TRUE(f.fds.empty());
}

TEST(SandboxProtocol, MessagesRoundTrip) {
  proto::call_message call;
  call.entry = "guest_add_one";
  call.request = {std::byte{1}, std::byte{2}, std::byte{3}};
  call.reply_capacity = 4096;
  call.buffers = {{7, 1 << 21, 0x7f0000200000ull, true, 0},
                  {9, 1 << 22, 0x7f0000400000ull, false, 1}};
  const auto back = proto::decode_call(proto::encode(call));
  EXPECT_EQ(back.entry, call.entry);
  EXPECT_EQ(back.request, call.request);
  EXPECT_EQ(back.reply_capacity, 4096u);
  ASSERT_EQ(back.buffers.size(), 2u);
  EXPECT_EQ(back.buffers[1].id, 9u);
  EXPECT_EQ(back.buffers[1].size_bytes, std::uint64_t{1} << 22);
  EXPECT_EQ(back.buffers[1].host_address, 0x7f0000400000ull);
  EXPECT_FALSE(back.buffers[1].has_fd);
  EXPECT_EQ(back.buffers[1].device, 1);
  EXPECT_EQ(proto::fd_count(back), 1u);

  const auto fault = proto::decode_cuda_fault(
      proto::encode(proto::cuda_fault_message{700, "CUDA_ERROR_ILLEGAL_ADDRESS", "write", 700}));
  EXPECT_EQ(fault.code, 700);
  EXPECT_EQ(fault.name, "CUDA_ERROR_ILLEGAL_ADDRESS");
  EXPECT_EQ(fault.entry, "write");
  EXPECT_FALSE(fault.context_reset);
  EXPECT_TRUE(proto::decode_cuda_fault(
                  proto::encode(proto::cuda_fault_message{709, "reset", "guest_reset", 0, true}))
                  .context_reset);
  const auto failed = proto::decode_call_failed(proto::encode(
      proto::call_failed_message{proto::call_failure::no_such_entry, "no entry 'x'"}));
  EXPECT_EQ(failed.reason, proto::call_failure::no_such_entry);
  EXPECT_EQ(proto::decode_ready(proto::encode(proto::ready_message{42, "no GPU"})).cuda_status,
            "no GPU");
  EXPECT_EQ(proto::decode_unshare(proto::encode(proto::unshare_message{5})).id, 5u);

  const auto dying =
      proto::decode_dying(proto::encode(proto::dying_message{proto::dying_cause::exit, 3}));
  EXPECT_EQ(dying.cause, proto::dying_cause::exit);
  EXPECT_EQ(dying.value, 3);
  const auto map = proto::decode_map(proto::encode(
      proto::map_message{{{4, 1 << 21, 0x7f0000200000ull, true, 0}, {6, 1 << 21, 0, true, 0}}}));
  ASSERT_EQ(map.buffers.size(), 2u);
  EXPECT_EQ(map.buffers[1].id, 6u);
  EXPECT_EQ(proto::fd_count(map), 2u);
  const auto mapped =
      proto::decode_mapped(proto::encode(proto::mapped_message{{4}, "buffer 6: cuMemMap failed"}));
  EXPECT_EQ(mapped.ids, std::vector<std::uint64_t>{4});
  EXPECT_EQ(mapped.failure, "buffer 6: cuMemMap failed");
}

// What a worker's signal handler sends: built without allocating, read as any other frame.
TEST(SandboxProtocol, TheDyingFrameIsAFrameLikeAnyOther) {
  socket_pair s;
  std::array<std::byte, proto::dying_frame_bytes> frame{};
  proto::encode_dying_frame({proto::dying_cause::signal, 11}, frame);
  ASSERT_EQ(::send(s.a.get(), frame.data(), frame.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(frame.size()));
  proto::frame f;
  ASSERT_EQ(proto::receive_frame(s.b.get(), f, in(1000ms)), proto::receive_status::ok);
  EXPECT_EQ(f.type, proto::message_type::dying);
  const auto m = proto::decode_dying(f.payload);
  EXPECT_EQ(m.cause, proto::dying_cause::signal);
  EXPECT_EQ(m.value, 11);
  // The same bytes as the ordinary encoder's frame.
  proto::send_frame(s.a.get(), proto::message_type::dying,
                    proto::encode(proto::dying_message{proto::dying_cause::signal, 11}));
  std::array<std::byte, proto::dying_frame_bytes> sent{};
  ASSERT_EQ(::recv(s.b.get(), sent.data(), sent.size(), MSG_WAITALL),
            static_cast<ssize_t>(sent.size()));
  EXPECT_EQ(sent, frame);
}

TEST(SandboxProtocol, MalformedPayloadsAreViolations) {
  proto::call_message call;
  call.entry = "f";
  call.buffers = {{1, 2, 3, true, 0}};
  auto bytes = proto::encode(call);
  // Every truncation fails cleanly.
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW((void)proto::decode_call(std::span(bytes).first(n)), proto::protocol_violation)
        << n;
  // A trailing byte.
  auto longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_THROW((void)proto::decode_call(longer), proto::protocol_violation);
  // A buffer count the payload cannot hold: refused before anything is reserved.
  auto lying = binary_writer().text("f").length_prefixed({}).u64(0).u32(0xffffffffu).take();
  EXPECT_THROW((void)proto::decode_call(lying), proto::protocol_violation);
  // A string length past the end.
  auto long_string = binary_writer().u64(1ull << 40).take();
  EXPECT_THROW((void)proto::decode_start_failed(long_string), proto::protocol_violation);
  // An unknown failure reason.
  auto bad_reason = binary_writer().u16(77).text("x").take();
  EXPECT_THROW((void)proto::decode_call_failed(bad_reason), proto::protocol_violation);
  // An unknown dying cause, a reset flag that is no flag, more ids than bytes.
  EXPECT_THROW((void)proto::decode_dying(binary_writer().u16(3).i32(0).take()),
               proto::protocol_violation);
  auto bad_flag = binary_writer().i32(1).text("n").text("e").i32(0).u8(2).take();
  EXPECT_THROW((void)proto::decode_cuda_fault(bad_flag), proto::protocol_violation);
  EXPECT_THROW((void)proto::decode_mapped(binary_writer().u32(1000).text("").take()),
               proto::protocol_violation);
  auto map = proto::encode(proto::map_message{{{1, 2, 3, true, 0}}});
  for (std::size_t n = 0; n < map.size(); ++n)
    EXPECT_THROW((void)proto::decode_map(std::span(map).first(n)), proto::protocol_violation) << n;
}

TEST(SandboxProtocol, AViolationNamesTheMessageTheFieldAndItsOffset) {
  // The entry "f" (8 + 1 bytes), an empty request (8), the reply capacity (8), then 2 of the
  // buffer count's 4 bytes.
  auto bytes = binary_writer().text("f").length_prefixed({}).u64(0).u16(1).take();
  try {
    (void)proto::decode_call(bytes);
    FAIL() << "accepted a cut call message";
  } catch (const proto::protocol_violation& e) {
    EXPECT_NE(std::string(e.what()).find("call message: buffer count at offset 25 (4 bytes)"),
              std::string::npos)
        << e.what();
  }
  auto longer = proto::encode(proto::unshare_message{5});
  longer.push_back(std::byte{0});
  try {
    (void)proto::decode_unshare(longer);
    FAIL() << "accepted a trailing byte";
  } catch (const proto::protocol_violation& e) {
    EXPECT_NE(std::string(e.what()).find("unshare message: trailing bytes at offset 8"),
              std::string::npos)
        << e.what();
  }
}

TEST(SandboxProtocol, HeadersAreLittleEndian) {
  socket_pair s;
  proto::send_frame(s.a.get(), proto::message_type::unshare, as_bytes("abc"));
  unsigned char raw[proto::header_bytes + 3] = {};
  ASSERT_EQ(::recv(s.b.get(), raw, sizeof raw, MSG_WAITALL), static_cast<ssize_t>(sizeof raw));
  const unsigned char expected[proto::header_bytes] = {'C', 'B', 'S', 'X',  // magic 0x58534243
                                                       2,   0,              // version
                                                       7,   0,            // message type (unshare)
                                                       0,   0,   0,   0,  // descriptors
                                                       0,   0,   0,   0,  // reserved
                                                       3,   0,   0,   0,
                                                       0,   0,   0,   0};  // payload length
  EXPECT_EQ(std::memcmp(raw, expected, sizeof expected), 0);
  EXPECT_EQ(std::memcmp(raw + proto::header_bytes, "abc", 3), 0);
}

}  // namespace
