// The out-of-process sandbox: worker failure detection and restart with a library that needs
// no GPU (CPU), and the misbehaving CUDA test library (tests/guest_lib) in a worker sharing the
// host's memory (GPU; each in its own process). The wire protocol: test_sandbox_protocol.cpp.
#include <cubridge/core/detail/process_tree.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/core/unique_fd.hpp>
#include <cubridge/isolation/detail/sandbox_protocol.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include "eventually.hpp"
#include "gpu_test.hpp"
#include "isolation/sandbox_test_support.hpp"
#include "isolation_host.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <thread>
#include <vector>

namespace {

using cubridge::sandbox;
using cubridge::sandbox_error;
using cubridge::sandbox_failure;
using cubridge::unique_fd;
using namespace std::chrono_literals;

using cubridge::testing::as_bytes;
using cubridge::testing::as_text;
using cubridge::testing::gone;
using cubridge::testing::ms;

// --- the worker, with a library that needs no GPU ------------------------------------------------

cubridge::sandbox_options cpu_options(std::size_t standby = 1) {
  cubridge::sandbox_options o;
  o.library = CUBRIDGE_TEST_SANDBOX_CPU_LIB;
  o.worker = CUBRIDGE_TEST_SANDBOX_WORKER;
  o.initialize_cuda = false;
  o.call_timeout = 10s;
  o.standby = standby;
  return o;
}

TEST(SandboxError, Names) {
  EXPECT_EQ(cubridge::to_string(sandbox_failure::crashed), "crashed");
  EXPECT_EQ(cubridge::to_string(sandbox_failure::aborted), "aborted");
  EXPECT_EQ(cubridge::to_string(sandbox_failure::timed_out), "timed_out");
  EXPECT_EQ(cubridge::to_string(sandbox_failure::cuda_fault), "cuda_fault");
  EXPECT_EQ(cubridge::to_string(sandbox_failure::protocol), "protocol");
  EXPECT_EQ(cubridge::to_string(sandbox_failure::device_reset), "device_reset");
  EXPECT_EQ(cubridge::to_string(cubridge::sandbox_recovery::spare_promoted), "spare_promoted");
  EXPECT_EQ(cubridge::to_string(cubridge::sandbox_recovery::restarted), "restarted");
  EXPECT_EQ(cubridge::to_string(cubridge::isolation_errc::sandbox_failure),
            "CUBRIDGE_SANDBOX_FAILURE");
  const sandbox_error e(sandbox_failure::aborted, "sandbox::call(\"f\")", "worker pid 1 killed",
                        true, std::chrono::milliseconds(12));
  EXPECT_TRUE(e.is(cubridge::isolation_errc::sandbox_failure));
  EXPECT_NE(std::string(e.what()).find("worker restarted in 12.0"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("sandbox aborted"), std::string::npos) << e.what();
  EXPECT_EQ(e.recovery(), cubridge::sandbox_recovery::restarted);
  const sandbox_error spare(sandbox_failure::crashed, "sandbox::call(\"f\")", "worker pid 1 died",
                            cubridge::sandbox_recovery::spare_promoted,
                            std::chrono::microseconds(40), std::chrono::steady_clock::now());
  EXPECT_TRUE(spare.restarted());
  EXPECT_NE(std::string(spare.what()).find("a standby worker took over in 0.04"), std::string::npos)
      << spare.what();
  // What a worker reports of a CUDA fault is in fields, not only in the text.
  EXPECT_FALSE(e.cuda_error());
  EXPECT_FALSE(e.entry_status());
  const sandbox_error fault(sandbox_failure::cuda_fault, "sandbox::call(\"f\")",
                            "'f' (returned 700) broke CUDA", cubridge::sandbox_recovery::restarted,
                            std::chrono::milliseconds(3), std::chrono::steady_clock::now(),
                            cubridge::sandbox_fault_report{CUDA_ERROR_ILLEGAL_ADDRESS, 700});
  EXPECT_EQ(fault.cuda_error(), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(fault.entry_status(), 700);
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

/// Calls `entry` in a sandbox with `standby` spares, expects `reason`, then checks the worker that
/// serves the next call is fresh: a spare that took over (standby 1, once it is ready), or a
/// worker started before the call threw, the old one reaped by then (standby 0, as before).
void expect_failure_and_restart(std::size_t standby, const char* entry, sandbox_failure reason,
                                const char* message, cubridge::sandbox_request request = {}) {
  SCOPED_TRACE("standby " + std::to_string(standby));
  auto box = sandbox::start(cpu_options(standby));
  ASSERT_EQ(box.call("count_calls").status, 1);
  ASSERT_EQ(box.call("count_calls").status, 2);
  if (standby) {
    ASSERT_TRUE(box.wait_for_standby(60s));
  }
  const pid_t before = box.worker_pid();
  const std::size_t restarts = box.restarts();
  try {
    (void)box.call(entry, request);
    FAIL() << entry << ": no sandbox_error";
  } catch (const sandbox_error& e) {
    EXPECT_EQ(e.reason(), reason) << e.what();
    EXPECT_TRUE(e.restarted()) << e.what();
    EXPECT_EQ(e.recovery(), standby ? cubridge::sandbox_recovery::spare_promoted
                                    : cubridge::sandbox_recovery::restarted)
        << e.what();
    EXPECT_GT(e.restart_duration().count(), 0);
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(entry), std::string::npos) << e.what();
    EXPECT_FALSE(e.cuda_error()) << "no CUDA fault was reported";
    EXPECT_FALSE(e.entry_status()) << "the entry did not return";
    std::printf("%s: %s; %s in %.3f ms\n", entry,
                std::string(cubridge::to_string(e.reason())).c_str(),
                std::string(cubridge::to_string(e.recovery())).c_str(), ms(e.restart_duration()));
  }
  EXPECT_NE(box.worker_pid(), before);
  EXPECT_GT(box.worker_pid(), 0);
  EXPECT_EQ(box.restarts(), restarts + 1);
  if (standby) {  // reaped by the background thread
    EXPECT_TRUE(cubridge::testing::eventually([&] { return gone(before); }))
        << "the old worker was not reaped";
  } else {
    EXPECT_TRUE(gone(before)) << "the old worker was not reaped before the call threw";
  }
  EXPECT_EQ(box.call("count_calls").status, 1) << "the new worker is not fresh";
}

TEST(Sandbox, ACrashIsDetectedAndTheWorkerRestarted) {
  for (std::size_t standby : {0U, 1U})
    expect_failure_and_restart(standby, "crash", sandbox_failure::crashed, "signal 11");
}

TEST(Sandbox, AnAbortIsReportedAsAborted) {
  for (std::size_t standby : {0U, 1U})
    expect_failure_and_restart(standby, "do_abort", sandbox_failure::aborted, "signal 6");
}

TEST(Sandbox, AnExitIsReportedAsACrash) {
  for (std::size_t standby : {0U, 1U})
    expect_failure_and_restart(standby, "exit_early", sandbox_failure::crashed,
                               "exited with status 3");
}

TEST(Sandbox, AHangIsKilledAfterTheTimeout) {
  for (std::size_t standby : {0U, 1U}) {
    const auto start = std::chrono::steady_clock::now();
    expect_failure_and_restart(standby, "hang", sandbox_failure::timed_out,
                               "did not return within 300 ms", {.timeout = 300ms});
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_GE(took, 300ms);
    EXPECT_LT(took, 10s);
  }
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

// --- a worker that cannot be taken at its word, and what its library leaves behind -------------

namespace proto = cubridge::detail::sandbox_protocol;

/// The bytes of one frame of `type` carrying `payload`, as the worker would send it.
std::vector<std::byte> frame_bytes(proto::message_type type, std::span<const std::byte> payload) {
  int pair[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  unique_fd writer(pair[0]), reader(pair[1]);
  std::vector<std::byte> bytes;
  std::thread drain([&] {
    std::byte chunk[65536];
    for (ssize_t n; (n = ::read(reader.get(), chunk, sizeof chunk)) > 0;)
      bytes.insert(bytes.end(), chunk, chunk + n);
  });
  proto::send_frame(writer.get(), type, payload);
  writer.reset();
  drain.join();
  return bytes;
}

using cubridge::detail::has_ended;

/// Calls `entry` with `bytes`, expecting a protocol failure that says `message`; the worker is
/// replaced.
void expect_protocol_failure(const char* entry, std::vector<std::byte> bytes,
                             std::size_t reply_capacity, const std::string& message) {
  auto box = sandbox::start(cpu_options(0));
  const pid_t before = box.worker_pid();
  try {
    (void)box.call(entry, {.bytes = std::move(bytes), .reply_capacity = reply_capacity});
    FAIL() << "no sandbox_error";
  } catch (const sandbox_error& e) {
    EXPECT_EQ(e.reason(), sandbox_failure::protocol) << e.what();
    EXPECT_TRUE(e.restarted()) << e.what();
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
  EXPECT_TRUE(gone(before)) << "the worker that broke the protocol was not reaped";
  EXPECT_EQ(box.call("echo", {.bytes = as_bytes("fresh")}).status, 5);
}

TEST(Sandbox, AReplyLongerThanTheRoomAskedForIsAProtocolFailure) {
  // A whole frame far over the room (16 bytes asked, 1 MiB sent): refused from its header.
  const std::vector<std::byte> huge(std::size_t{1} << 20, std::byte{'x'});
  expect_protocol_failure(
      "write_to_host",
      frame_bytes(proto::message_type::result, proto::encode(proto::result_message{0, huge})), 16,
      "the room the call asked for");
  // A small frame whose reply is still over the room.
  const std::vector<std::byte> some(1000, std::byte{'y'});
  expect_protocol_failure(
      "write_to_host",
      frame_bytes(proto::message_type::result, proto::encode(proto::result_message{0, some})), 16,
      "replied 1000 bytes, more than the 16 bytes of room the call asked for");
}

TEST(Sandbox, LastWordsTheExitDoesNotConfirmAreReportedAsAClaim) {
  // "Dying of signal 11", then the worker's own result, and it runs on: not a crash.
  std::array<std::byte, proto::dying_frame_bytes> dying{};
  proto::encode_dying_frame({proto::dying_cause::signal, 11}, dying);
  expect_protocol_failure("write_to_host", {dying.begin(), dying.end()}, 0,
                          "said it killed by signal 11 (Segmentation fault) but ran on");
}

TEST(Sandbox, WhatTheLibraryLeftRunningEndsWithItsWorker) {
  // A child in the worker's group and a daemon of its own session, then a hang the host kills:
  // neither outlives the worker.
  {
    auto box = sandbox::start(cpu_options(0));
    const pid_t child = box.call("leave_child").status;
    const pid_t daemon = box.call("leave_daemon").status;
    ASSERT_GT(child, 0);
    ASSERT_GT(daemon, 0);
    ASSERT_FALSE(has_ended(child));
    ASSERT_FALSE(has_ended(daemon));
    EXPECT_THROW((void)box.call("hang", {.timeout = 300ms}), sandbox_error);
    EXPECT_TRUE(cubridge::testing::eventually([&] {
      return has_ended(child) && has_ended(daemon);
    })) << "left running after its worker was killed: "
        << (has_ended(child) ? "" : "the child ") << (has_ended(daemon) ? "" : "the daemon");
  }
  // A worker that crashes by itself: what stayed in its group ends with it.
  {
    auto box = sandbox::start(cpu_options(0));
    const pid_t child = box.call("leave_child").status;
    ASSERT_GT(child, 0);
    EXPECT_THROW((void)box.call("crash"), sandbox_error);
    EXPECT_TRUE(cubridge::testing::eventually([&] { return has_ended(child); }))
        << "the child outlived its crashed worker";
  }
  // Shutdown: the sandbox destroyed.
  pid_t daemon = 0;
  {
    auto box = sandbox::start(cpu_options(1));
    daemon = box.call("leave_daemon").status;
    ASSERT_GT(daemon, 0);
  }
  EXPECT_TRUE(cubridge::testing::eventually([&] { return has_ended(daemon); }))
      << "the daemon outlived its sandbox";
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

/// What each descriptor above 2 of process `pid` is open on ("pipe:[123]", "socket:[456]",
/// a path), by number.
std::map<int, std::string> open_files(pid_t pid) {
  std::map<int, std::string> files;
  for (const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    const int fd = std::stoi(e.path().filename().string());
    std::error_code ec;  // a descriptor closed meanwhile (the directory's own) is no finding
    const auto target = std::filesystem::read_symlink(e.path(), ec);
    if (fd > 2 && !ec) files.emplace(fd, target.string());
  }
  return files;
}

TEST(Sandbox, TheWorkerGetsNoDescriptorOfTheHostButItsSocket) {
  int leaky[2];  // without O_CLOEXEC: only the spawner keeps it from the worker
  ASSERT_EQ(::pipe(leaky), 0);
  const unique_fd r(leaky[0]), w(leaky[1]);
  auto other = sandbox::start(cpu_options());  // another sandbox's socket is open here too
  auto box = sandbox::start(cpu_options());
  const auto worker = open_files(box.worker_pid());
  ASSERT_TRUE(worker.contains(3));
  EXPECT_TRUE(worker.at(3).starts_with("socket:")) << worker.at(3);
  // Nothing the host holds is open in the worker (a tool such as a sanitizer may add its own).
  // Anonymous inodes ("anon_inode:[eventpoll]") carry no identity in /proc: compute-sanitizer
  // opens one in the host and in the worker alike, so equal names prove nothing there; pipes,
  // sockets ("pipe:[inode]") and files do.
  for (const auto& [fd, file] : open_files(::getpid())) {
    if (file.starts_with("anon_inode:")) continue;
    for (const auto& [worker_fd, worker_file] : worker)
      EXPECT_NE(file, worker_file) << "host descriptor " << fd << " is the worker's " << worker_fd;
  }
  EXPECT_EQ(box.call("echo", {.bytes = as_bytes("fd")}).status, 2);
}

TEST(Sandbox, ARestartWhoseWorkerIsGoneSaysItCouldNotExecuteIt) {
  cubridge::testing::temp_dir dir;
  const auto copy = dir.path / "cubridge-sandbox-worker";
  std::filesystem::copy_file(CUBRIDGE_TEST_SANDBOX_WORKER, copy);
  auto options = cpu_options();
  options.worker = copy;
  auto box = sandbox::start(options);
  std::filesystem::remove(copy);
  try {
    box.restart();
    FAIL() << "restarted a worker that is gone";
  } catch (const sandbox_error& e) {
    EXPECT_EQ(e.reason(), sandbox_failure::start_failed) << e.what();
    EXPECT_NE(std::string(e.what()).find("could not execute " + copy.string() +
                                         ": No such file or directory"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(box.worker_pid(), 0);
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

// --- an entry library that uses cubridge itself (docs/isolation.md) ---------------------------

cubridge::sandbox_options cubridge_library_options(bool initialize_cuda) {
  auto o = cpu_options();
  o.library = CUBRIDGE_TEST_SANDBOX_CUBRIDGE_LIB;
  o.initialize_cuda = initialize_cuda;
  return o;
}

TEST(SandboxCubridgeLibrary, AnEntryLibraryMayUseCubridgeItself) {
  {
    // It exports its entries and none of the cubridge linked into it (docs/isolation.md).
    void* library = ::dlopen(CUBRIDGE_TEST_SANDBOX_CUBRIDGE_LIB, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(library, nullptr) << ::dlerror();
    EXPECT_NE(::dlsym(library, "cubridge_inspect"), nullptr);
    EXPECT_EQ(::dlsym(library, "_ZN8cubridge6driver9availableEv"), nullptr)
        << "cubridge::driver::available() is exported";
    ::dlclose(library);
  }
  auto box = sandbox::start(cubridge_library_options(false));
  // Its own cubridge's errors, made and caught in the worker.
  const auto refused = box.call("cubridge_precondition");
  EXPECT_EQ(refused.status, static_cast<int>(cubridge::errc::precondition));
  EXPECT_NE(as_text(refused.bytes).find("the request of cubridge_precondition is empty"),
            std::string::npos)
      << as_text(refused.bytes);
  EXPECT_EQ(box.call("cubridge_precondition", {.bytes = as_bytes("x")}).status, 0);
  // Its own cubridge reads an image as the host's does.
  const auto cubin = cubridge::testing::read_bytes(cubridge::testing::test_cubin_path());
  const auto here = cubridge::inspect_image(cubin);
  const auto there = box.call("cubridge_inspect", {.bytes = cubin});
  EXPECT_EQ(there.status, 0) << as_text(there.bytes);
  EXPECT_EQ(as_text(there.bytes), std::string(cubridge::to_string(here.kind)) + " " +
                                      std::to_string(here.kernels.size()));
  EXPECT_EQ(box.stats().failures, 0u);
}

TEST(SandboxCubridgeLibrary, ItsCubridgeFindsTheWorkersPrimaryContextCurrent) {
  CUBRIDGE_REQUIRE_GPU();
  auto box = sandbox::start(cubridge_library_options(true));
  ASSERT_EQ(box.worker_cuda_status(), "");
  const auto reply = box.call("cubridge_current_context", {.reply_capacity = 4096});
  EXPECT_EQ(reply.status, 1) << as_text(reply.bytes);
  EXPECT_NE(as_text(reply.bytes).find("on device 0"), std::string::npos) << as_text(reply.bytes);
  EXPECT_EQ(box.stats().failures, 0u);
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

using cubridge::testing::exportable_buffer;
using cubridge::testing::wrong_elements;

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

/// What a sandbox_error must carry of a worker's fault report: both set for a cuda_fault or
/// device_reset (to these values where given), neither for the other failures.
struct expected_fault {
  std::optional<CUresult> cuda_error;
  std::optional<int> entry_status;
};

void expect_fault_fields(verdict& v, const sandbox_error& e, const expected_fault& expected) {
  const bool reported =
      e.reason() == sandbox_failure::cuda_fault || e.reason() == sandbox_failure::device_reset;
  v.expect(e.cuda_error().has_value() == reported, "cuda_error() set only for a CUDA fault");
  v.expect(e.entry_status().has_value() == reported, "entry_status() set only for a CUDA fault");
  if (expected.cuda_error)
    v.expect(e.cuda_error() == expected.cuda_error,
             "cuda_error() " +
                 std::to_string(static_cast<int>(e.cuda_error().value_or(CUDA_SUCCESS))) +
                 ", expected " + std::to_string(static_cast<int>(*expected.cuda_error)));
  if (expected.entry_status)
    v.expect(e.entry_status() == expected.entry_status,
             "entry_status() " + std::to_string(e.entry_status().value_or(-1)) + ", expected " +
                 std::to_string(*expected.entry_status));
}

/// Runs `entry` in the worker; expects it to fail with `reason` and the worker to be replaced,
/// then the host to be intact and the fresh worker to work on the host's buffer in place. Once
/// without standby (a restart before the call throws), once with a ready spare taking over.
void sandbox_case(const char* entry, sandbox_failure reason,
                  std::chrono::milliseconds timeout = 0ms, const expected_fault& fault = {}) {
  verdict v;
  isolation_host host;
  for (const std::size_t standby : {0U, 1U}) {
    std::vector<unsigned> values;
    auto memory = exportable_buffer(values);
    auto options = gpu_options();
    options.standby = standby;
    auto box = sandbox::start(options);
    const std::string with = " (standby " + std::to_string(standby) + ")";
    v.note("worker start (with CUDA): " + std::to_string(ms(box.last_start_duration())) + " ms");
    auto share = box.share(memory);
    v.expect(box.call("guest_init").status == 0, "worker library initialised");
    v.expect(box.call("guest_add_one", {.buffers = {share}}).status == 0, "worker adds in place");
    v.expect(wrong_elements(memory, values, 1) == 0, "the worker's kernel wrote the host's buffer");
    if (standby) v.expect(box.wait_for_standby(60s), "the spare is ready");
    try {
      const auto reply = box.call(entry, {.timeout = timeout});
      v.expect(false, std::string(entry) + " returned " + std::to_string(reply.status) +
                          " in the worker instead of failing");
    } catch (const sandbox_error& e) {
      v.note(e.what());
      v.note(std::string(entry) + with + ": worker restart took " +
             std::to_string(ms(e.restart_duration())) + " ms (" +
             std::string(cubridge::to_string(e.recovery())) + ")");
      v.expect(e.reason() == reason, std::string("reason: ") + e.what());
      v.expect(e.recovery() == (standby ? cubridge::sandbox_recovery::spare_promoted
                                        : cubridge::sandbox_recovery::restarted),
               "recovery" + with + ": " + e.what());
      expect_fault_fields(v, e, fault);
    }
    expect_host_intact(v, host, box, share, memory, values, 1);
  }
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
// the worker notices, reports it as a device_reset (not a cuda_fault) and is replaced.
TEST(SandboxMatrix, Sandbox_ResetInOwnCall_LeavesTheHostIntact) {
  CUBRIDGE_REQUIRE_GPU();
  // guest_reset returns what cudaDeviceReset returned: success.
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      sandbox_case("guest_reset", sandbox_failure::device_reset, 0ms, {std::nullopt, 0}),
      "primary context of device 0 was reset");
}

TEST(SandboxMatrix, Sandbox_ResetFromOwnThread_LeavesTheHostIntact) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      sandbox_case("guest_reset_from_own_thread", sandbox_failure::device_reset),
      "primary context of device 0 was reset");
}

// (c): the fault poisons the worker only.
TEST(SandboxMatrix, Sandbox_InvalidAddress_IsACudaFaultAndTheHostIsIntact) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      // The entry returns its cudaDeviceSynchronize's error: the runtime's spelling of the same.
      sandbox_case("guest_write_invalid_address", sandbox_failure::cuda_fault, 0ms,
                   {CUDA_ERROR_ILLEGAL_ADDRESS, static_cast<int>(cudaErrorIllegalAddress)}),
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
