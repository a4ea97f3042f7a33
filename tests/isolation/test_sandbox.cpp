// The out-of-process sandbox: its wire protocol and fd passing (CPU), worker failure detection
// and restart with a library that needs no GPU (CPU), and the misbehaving CUDA test library
// (tests/guest_lib) in a worker sharing the host's memory (GPU; each in its own process).
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/isolation/detail/sandbox_protocol.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include "gpu_test.hpp"
#include "isolation_host.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

namespace {

namespace proto = cubridge::detail::sandbox_protocol;
using cubridge::sandbox;
using cubridge::sandbox_error;
using cubridge::sandbox_failure;
using cubridge::unique_fd;
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
  struct {
    std::uint32_t magic;
    std::uint16_t version, type;
    std::uint32_t fds, reserved;
    std::uint64_t payload;
  } h{magic, version, type, fds, 0, payload};
  static_assert(sizeof h == proto::header_bytes);
  ASSERT_EQ(::send(socket, &h, sizeof h, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof h));
}

TEST(SandboxProtocol, BadHeadersAreViolations) {
  struct case_t {
    std::uint32_t magic;
    std::uint16_t version, type;
    std::uint32_t fds;
    std::uint64_t payload;
    const char* expect;
  };
  const case_t cases[] = {
      {0x12345678, 1, 1, 0, 0, "magic"},
      {proto::frame_magic, 9, 1, 0, 0, "protocol version 9"},
      {proto::frame_magic, 1, 0, 0, 0, "unknown message type 0"},
      {proto::frame_magic, 1, 99, 0, 0, "unknown message type 99"},
      {proto::frame_magic, 1, 1, 0, proto::max_payload_bytes + 1, "exceeds the limit"},
      {proto::frame_magic, 1, 1, 2, 0, "announced 2 file descriptor(s), 0 arrived"},
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
  const auto failed = proto::decode_call_failed(proto::encode(
      proto::call_failed_message{proto::call_failure::no_such_entry, "no entry 'x'"}));
  EXPECT_EQ(failed.reason, proto::call_failure::no_such_entry);
  EXPECT_EQ(proto::decode_ready(proto::encode(proto::ready_message{42, "no GPU"})).cuda_status,
            "no GPU");
  EXPECT_EQ(proto::decode_unshare(proto::encode(proto::unshare_message{5})).id, 5u);
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
  auto lying = proto::writer().text("f").bytes({}).u64(0).u32(0xffffffffu).take();
  EXPECT_THROW((void)proto::decode_call(lying), proto::protocol_violation);
  // A string length past the end.
  auto long_string = proto::writer().u64(1ull << 40).take();
  EXPECT_THROW((void)proto::decode_start_failed(long_string), proto::protocol_violation);
  // An unknown failure reason.
  auto bad_reason = proto::writer().u16(77).text("x").take();
  EXPECT_THROW((void)proto::decode_call_failed(bad_reason), proto::protocol_violation);
}

// --- the worker, with a library that needs no GPU ------------------------------------------------

cubridge::sandbox_options cpu_options() {
  cubridge::sandbox_options o;
  o.library = CUBRIDGE_TEST_SANDBOX_CPU_LIB;
  o.worker = CUBRIDGE_TEST_SANDBOX_WORKER;
  o.initialize_cuda = false;
  o.call_timeout = 10s;
  return o;
}

double ms(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

TEST(SandboxError, Names) {
  EXPECT_EQ(cubridge::to_string(sandbox_failure::crashed), "crashed");
  EXPECT_EQ(cubridge::to_string(sandbox_failure::aborted), "aborted");
  EXPECT_EQ(cubridge::to_string(sandbox_failure::timed_out), "timed_out");
  EXPECT_EQ(cubridge::to_string(sandbox_failure::cuda_fault), "cuda_fault");
  EXPECT_EQ(cubridge::to_string(sandbox_failure::protocol), "protocol");
  EXPECT_EQ(cubridge::to_string(cubridge::isolation_errc::sandbox_failure),
            "CUBRIDGE_SANDBOX_FAILURE");
  const sandbox_error e(sandbox_failure::aborted, "sandbox::call(\"f\")", "worker pid 1 killed",
                        true, std::chrono::milliseconds(12));
  EXPECT_TRUE(e.is(cubridge::isolation_errc::sandbox_failure));
  EXPECT_NE(std::string(e.what()).find("worker restarted in 12.0"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("sandbox aborted"), std::string::npos) << e.what();
}

TEST(Sandbox, EchoesThroughTheWorker) {
  auto box = sandbox::start(cpu_options());
  EXPECT_GT(box.worker_pid(), 0);
  EXPECT_NE(box.worker_pid(), ::getpid());
  EXPECT_EQ(box.name(), "libcubridge_test_sandbox_cpu.so");
  const auto reply = box.call("echo", {.bytes = as_bytes("hello worker")});
  EXPECT_EQ(reply.status, 12);
  EXPECT_EQ(as_text(reply.bytes), "hello worker");
  std::printf("worker start: %.2f ms\n", ms(box.last_start_duration()));
}

TEST(Sandbox, AnUnknownEntryLeavesTheWorkerRunning) {
  auto box = sandbox::start(cpu_options());
  const pid_t pid = box.worker_pid();
  try {
    (void)box.call("no_such_function");
    FAIL() << "no sandbox_error";
  } catch (const sandbox_error& e) {
    EXPECT_EQ(e.reason(), sandbox_failure::no_such_entry) << e.what();
    EXPECT_FALSE(e.restarted());
    EXPECT_NE(std::string(e.what()).find("no entry point 'no_such_function'"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(box.worker_pid(), pid);
  EXPECT_EQ(box.call("echo", {.bytes = as_bytes("still here")}).status, 10);
}

/// Calls `entry`, expects `reason`, then checks the worker is fresh and serving.
void expect_failure_and_restart(sandbox& box, const char* entry, sandbox_failure reason,
                                const char* message, cubridge::sandbox_request request = {}) {
  ASSERT_EQ(box.call("count_calls").status, 1);
  ASSERT_EQ(box.call("count_calls").status, 2);
  const pid_t before = box.worker_pid();
  const std::size_t restarts = box.restarts();
  try {
    (void)box.call(entry, request);
    FAIL() << entry << ": no sandbox_error";
  } catch (const sandbox_error& e) {
    EXPECT_EQ(e.reason(), reason) << e.what();
    EXPECT_TRUE(e.restarted()) << e.what();
    EXPECT_GT(e.restart_duration().count(), 0);
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(entry), std::string::npos) << e.what();
    std::printf("%s: %s; restart took %.2f ms\n", entry,
                std::string(cubridge::to_string(e.reason())).c_str(), ms(e.restart_duration()));
  }
  EXPECT_NE(box.worker_pid(), before);
  EXPECT_GT(box.worker_pid(), 0);
  EXPECT_EQ(box.restarts(), restarts + 1);
  EXPECT_EQ(::kill(before, 0), -1) << "the old worker was not reaped";
  EXPECT_EQ(box.call("count_calls").status, 1) << "the new worker is not fresh";
}

TEST(Sandbox, ACrashIsDetectedAndTheWorkerRestarted) {
  auto box = sandbox::start(cpu_options());
  expect_failure_and_restart(box, "crash", sandbox_failure::crashed, "signal 11");
}

TEST(Sandbox, AnAbortIsReportedAsAborted) {
  auto box = sandbox::start(cpu_options());
  expect_failure_and_restart(box, "do_abort", sandbox_failure::aborted, "signal 6");
}

TEST(Sandbox, AnExitIsReportedAsACrash) {
  auto box = sandbox::start(cpu_options());
  expect_failure_and_restart(box, "exit_early", sandbox_failure::crashed, "exited with status 3");
}

TEST(Sandbox, AHangIsKilledAfterTheTimeout) {
  auto box = sandbox::start(cpu_options());
  const auto start = std::chrono::steady_clock::now();
  expect_failure_and_restart(box, "hang", sandbox_failure::timed_out,
                             "did not return within 300 ms", {.timeout = 300ms});
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 10s);
  // The sandbox's own timeout applies when the call sets none.
  auto options = cpu_options();
  options.call_timeout = 200ms;
  auto quick = sandbox::start(options);
  try {
    (void)quick.call("hang");
    FAIL() << "no timeout";
  } catch (const sandbox_error& e) {
    EXPECT_EQ(e.reason(), sandbox_failure::timed_out) << e.what();
    EXPECT_NE(std::string(e.what()).find("within 200 ms"), std::string::npos) << e.what();
  }
}

TEST(Sandbox, TheReplyIsClampedToItsCapacity) {
  auto box = sandbox::start(cpu_options());
  const auto reply = box.call("overclaim_reply", {.reply_capacity = 16});
  EXPECT_EQ(reply.bytes.size(), 16u);
  EXPECT_EQ(as_text(reply.bytes), std::string(16, 'x'));
}

TEST(Sandbox, StartFailuresSayWhy) {
  auto missing = cpu_options();
  missing.library = "/nonexistent/libvendor.so";
  try {
    (void)sandbox::start(missing);
    FAIL();
  } catch (const sandbox_error& e) {
    EXPECT_EQ(e.reason(), sandbox_failure::start_failed);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/libvendor.so does not exist"),
              std::string::npos)
        << e.what();
  }
  cubridge::testing::temp_dir dir;
  const auto not_a_library = dir.path / "libfake.so";
  cubridge::testing::write_text(not_a_library, "not an ELF file");
  auto bad = cpu_options();
  bad.library = not_a_library;
  try {
    (void)sandbox::start(bad);
    FAIL();
  } catch (const sandbox_error& e) {
    EXPECT_EQ(e.reason(), sandbox_failure::start_failed);
    EXPECT_NE(std::string(e.what()).find("cannot load " + not_a_library.string()),
              std::string::npos)
        << e.what();
  }
  auto no_worker = cpu_options();
  no_worker.worker = "/nonexistent/cubridge-sandbox-worker";
  try {
    (void)sandbox::start(no_worker);
    FAIL();
  } catch (const sandbox_error& e) {
    EXPECT_EQ(e.reason(), sandbox_failure::start_failed);
    EXPECT_NE(std::string(e.what()).find("is not an executable file"), std::string::npos)
        << e.what();
  }
}

TEST(Sandbox, DestructionEndsAndReapsTheWorker) {
  pid_t pid = 0;
  {
    auto box = sandbox::start(cpu_options());
    pid = box.worker_pid();
    ASSERT_EQ(::kill(pid, 0), 0);
  }
  EXPECT_EQ(::kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

TEST(Sandbox, AMovedSandboxKeepsItsWorker) {
  auto box = sandbox::start(cpu_options());
  const pid_t pid = box.worker_pid();
  sandbox other = std::move(box);
  EXPECT_EQ(other.worker_pid(), pid);
  EXPECT_EQ(other.call("echo", {.bytes = as_bytes("moved")}).status, 5);
}

TEST(Sandbox, CallsFromManyThreadsAreSerialized) {
  auto box = sandbox::start(cpu_options());
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const std::string text = "thread " + std::to_string(t) + " call " + std::to_string(i);
        const auto reply = box.call("echo", {.bytes = as_bytes(text)});
        if (as_text(reply.bytes) != text) ++wrong;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(Sandbox, AWorkerWithoutCudaStillServesCpuEntries) {
  // initialize_cuda on a machine without a GPU: the worker says why and serves anyway.
  auto options = cpu_options();
  options.initialize_cuda = true;
  auto box = sandbox::start(options);
  if (!cubridge::testing::gpu_unavailable_reason().empty())
    EXPECT_FALSE(box.worker_cuda_status().empty());
  else
    EXPECT_EQ(box.worker_cuda_status(), "");
  EXPECT_EQ(box.call("echo", {.bytes = as_bytes("cpu")}).status, 3);
}

// --- the misbehaving CUDA library in a worker (GPU) ---------------------------------------------

using cubridge::testing::isolation_host;
using cubridge::testing::verdict;

cubridge::sandbox_options gpu_options() {
  cubridge::sandbox_options o;
  o.library = CUBRIDGE_TEST_GUEST_LIB;
  o.worker = CUBRIDGE_TEST_SANDBOX_WORKER;
  o.call_timeout = 30s;
  return o;
}

/// A VMM buffer the worker can import, holding `values`.
cubridge::shared_device_memory exportable_buffer(std::vector<unsigned>& values) {
  auto memory = cubridge::shared_device_memory::allocate(cubridge::device::get(0), 1 << 22,
                                                         cubridge::memory_export::posix_fd);
  values = cubridge::testing::pattern(memory.size_bytes() / sizeof(unsigned), 0xb0b);
  CUBRIDGE_CU(cuMemcpy,
              (memory.address(), reinterpret_cast<CUdeviceptr>(values.data()), memory.size_bytes()),
              "filling the shared buffer");
  return memory;
}

/// How many elements of `memory` differ from values + add.
std::size_t wrong_elements(const cubridge::shared_device_memory& memory,
                           const std::vector<unsigned>& values, unsigned add) {
  std::vector<unsigned> back(values.size());
  if (cubridge::driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(back.data()), memory.address(),
                                       memory.size_bytes()) != CUDA_SUCCESS)
    return values.size();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < values.size(); ++i) wrong += back[i] != values[i] + add;
  return wrong;
}

/// Checks the host after a worker misbehaved: buffers, kernels, primary context, and a fresh
/// worker that works on the shared buffer in place again.
void expect_host_intact(verdict& v, isolation_host& host, sandbox& box,
                        const cubridge::sandbox_share& share,
                        const cubridge::shared_device_memory& memory,
                        const std::vector<unsigned>& values, unsigned add_before) {
  const auto damage = host.buffer_damage();
  v.note("host buffer: " +
         (damage.empty() ? "intact, checksum " + std::to_string(host.expected_checksum) : damage));
  v.expect(damage.empty(), "host buffer intact");
  const auto kernel = host.kernel_damage();
  v.expect(kernel.empty(), "host kernels still launch: " + kernel);
  v.expect(!host.primary.was_reset(), "host primary context unchanged");
  v.expect(wrong_elements(memory, values, add_before) == 0, "shared buffer as the worker left it");
  try {
    v.expect(box.call("guest_add_one", {.buffers = {share}}).status == 0, "fresh worker adds");
    v.expect(wrong_elements(memory, values, add_before + 1) == 0,
             "the fresh worker worked on the host's buffer in place");
  } catch (const std::exception& e) {
    v.expect(false, std::string("the fresh worker failed: ") + e.what());
  }
}

/// Runs `entry` in the worker; expects it to fail with `reason` and the worker to be restarted,
/// then the host to be intact and the fresh worker to work on the host's buffer in place.
void sandbox_case(const char* entry, sandbox_failure reason,
                  std::chrono::milliseconds timeout = 0ms) {
  verdict v;
  isolation_host host;
  std::vector<unsigned> values;
  auto memory = exportable_buffer(values);
  auto box = sandbox::start(gpu_options());
  v.note("worker start (with CUDA): " + std::to_string(ms(box.last_start_duration())) + " ms");
  auto share = box.share(memory);
  v.expect(box.call("guest_init").status == 0, "worker library initialised");
  v.expect(box.call("guest_add_one", {.buffers = {share}}).status == 0, "worker adds in place");
  v.expect(wrong_elements(memory, values, 1) == 0, "the worker's kernel wrote the host's buffer");
  try {
    const auto reply = box.call(entry, {.timeout = timeout});
    v.expect(false, std::string(entry) + " returned " + std::to_string(reply.status) +
                        " in the worker instead of failing");
  } catch (const sandbox_error& e) {
    v.note(e.what());
    v.note(std::string(entry) + ": worker restart took " +
           std::to_string(ms(e.restart_duration())) + " ms");
    v.expect(e.reason() == reason, std::string("reason: ") + e.what());
    v.expect(e.restarted(), "worker restarted");
  }
  expect_host_intact(v, host, box, share, memory, values, 1);
  v.exit();
}

TEST(SandboxMatrix, Sandbox_AddOne_WorksOnTheHostsBufferInPlace) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      {
        verdict v;
        isolation_host host;
        std::vector<unsigned> values;
        auto memory = exportable_buffer(values);
        auto box = sandbox::start(gpu_options());
        v.expect(box.worker_cuda_status().empty(), "worker CUDA: " + box.worker_cuda_status());
        auto share = box.share(memory);
        for (unsigned round = 1; round <= 3; ++round) {
          const auto reply = box.call("guest_add_one", {.buffers = {share}});
          v.expect(reply.status == 0, "guest_add_one returned " + std::to_string(reply.status));
          v.expect(
              wrong_elements(memory, values, round) == 0,
              "round " + std::to_string(round) + ": the worker wrote the host's buffer in place");
        }
        v.expect(host.buffer_damage().empty(), "host buffer intact");
        v.expect(host.kernel_damage().empty(), "host kernels launch");
        v.exit();
      },
      "");
}

// (a), (b): the worker resets its own primary context (the host's belongs to another process);
// the worker notices, reports it as a cuda_fault and is replaced.
TEST(SandboxMatrix, Sandbox_ResetInOwnCall_LeavesTheHostIntact) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(sandbox_case("guest_reset", sandbox_failure::cuda_fault),
                             "primary context of device 0 was reset");
}

TEST(SandboxMatrix, Sandbox_ResetFromOwnThread_LeavesTheHostIntact) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      sandbox_case("guest_reset_from_own_thread", sandbox_failure::cuda_fault),
      "primary context of device 0 was reset");
}

// (c): the fault poisons the worker only.
TEST(SandboxMatrix, Sandbox_InvalidAddress_IsACudaFaultAndTheHostIsIntact) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      sandbox_case("guest_write_invalid_address", sandbox_failure::cuda_fault),
      "CUDA_ERROR_ILLEGAL_ADDRESS");
}

// (d)
TEST(SandboxMatrix, Sandbox_Abort_IsReportedAndTheHostIsIntact) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(sandbox_case("guest_abort", sandbox_failure::aborted), "");
}

// (e)
TEST(SandboxMatrix, Sandbox_Hang_IsKilledAndTheHostIsIntact) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(sandbox_case("guest_hang", sandbox_failure::timed_out, 2000ms),
                             "did not return within 2000 ms");
}

TEST(Sandbox, ShareRefusesMemoryThatCannotBeExported) {
  CUBRIDGE_REQUIRE_GPU();
  auto box = sandbox::start(cpu_options());
  auto memory = cubridge::shared_device_memory::allocate(cubridge::device::get(0), 1 << 20);
  try {
    (void)box.share(memory);
    FAIL() << "shared memory allocated without memory_export::posix_fd";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
    EXPECT_NE(std::string(e.what()).find("memory_export::posix_fd"), std::string::npos) << e.what();
  }
}

TEST(Sandbox, ABufferOfAnotherSandboxIsRefused) {
  CUBRIDGE_REQUIRE_GPU();
  auto a = sandbox::start(cpu_options());
  auto b = sandbox::start(cpu_options());
  auto memory = cubridge::shared_device_memory::allocate(cubridge::device::get(0), 1 << 20,
                                                         cubridge::memory_export::posix_fd);
  auto share = a.share(memory);
  EXPECT_THROW((void)b.call("echo", {.buffers = {share}}), cubridge::error);
}

}  // namespace
