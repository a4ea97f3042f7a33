// The sandbox's spares (standby), its pool of workers and the worker's environment, with a
// library that needs no GPU (tests/isolation/sandbox_pool_library.c); then the same with the
// misbehaving CUDA test library on the host's shared buffers (GPU).
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/isolation/detail/sandbox_protocol.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include "eventually.hpp"
#include "gpu_test.hpp"
#include "isolation/sandbox_test_support.hpp"
#include "isolation_host.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>
#include <set>
#include <thread>
#include <vector>

namespace {

using cubridge::sandbox;
using cubridge::sandbox_error;
using cubridge::sandbox_failure;
using cubridge::sandbox_options;
using cubridge::sandbox_recovery;
using cubridge::testing::as_bytes;
using cubridge::testing::as_text;
using cubridge::testing::eventually;
using cubridge::testing::gone;
using cubridge::testing::scoped_env;
using namespace std::chrono_literals;

cubridge::sandbox_options pool_options(std::size_t workers, std::size_t standby) {
  cubridge::sandbox_options o;
  o.library = CUBRIDGE_TEST_SANDBOX_POOL_LIB;
  o.worker = CUBRIDGE_TEST_SANDBOX_WORKER;
  o.initialize_cuda = false;
  o.call_timeout = 120s;
  o.workers = workers;
  o.standby = standby;
  return o;
}

/// Which worker served `entry`: the pid it returned.
pid_t served_by(sandbox& box, const std::string& request = "") {
  return static_cast<pid_t>(box.call("pid", {.bytes = as_bytes(request)}).status);
}

/// Expects a crash in `box`, returns the error.
sandbox_error crash_in(sandbox& box) {
  try {
    (void)box.call("crash");
  } catch (const sandbox_error& e) {
    EXPECT_EQ(e.reason(), sandbox_failure::crashed) << e.what();
    return e;
  }
  ADD_FAILURE() << "crash did not fail";
  return sandbox_error(sandbox_failure::protocol, "crash_in", "no failure", false, {});
}

// --- standby ------------------------------------------------------------------------------------

TEST(SandboxStandby, ASpareTakesOverWithNoStartInTheFailingCallsPath) {
  auto box = sandbox::start(pool_options(1, 1));
  ASSERT_TRUE(box.wait_for_standby(60s));
  const auto before = box.stats();
  ASSERT_EQ(before.spare_pids.size(), 1u);
  const pid_t failed = box.worker_pid();
  const pid_t spare = before.spare_pids.front();
  EXPECT_NE(spare, failed);
  EXPECT_EQ(served_by(box), failed);

  const auto e = crash_in(box);
  EXPECT_EQ(e.recovery(), sandbox_recovery::spare_promoted) << e.what();
  EXPECT_NE(std::string(e.what()).find("standby worker pid " + std::to_string(spare)),
            std::string::npos)
      << e.what();
  EXPECT_NE(std::string(e.what()).find("a standby worker took over in"), std::string::npos)
      << e.what();
  // Taken over, not restarted: the former spare serves the next call.
  const auto after = box.stats();
  EXPECT_EQ(after.failures, 1u);
  EXPECT_EQ(after.failovers, 1u);
  EXPECT_EQ(after.restarts, 0u);
  EXPECT_EQ(box.restarts(), 1u);
  EXPECT_EQ(box.worker_pid(), spare);
  EXPECT_EQ(served_by(box), spare);
  // A replacement spare comes up behind it, and the failed worker is reaped.
  ASSERT_TRUE(box.wait_for_standby(60s));
  const auto later = box.stats();
  ASSERT_EQ(later.spare_pids.size(), 1u);
  EXPECT_NE(later.spare_pids.front(), spare);
  EXPECT_NE(later.spare_pids.front(), failed);
  EXPECT_EQ(later.spares_started, 2u);
  EXPECT_TRUE(eventually([&] { return gone(failed); }));
}

TEST(SandboxStandby, WithoutStandbyAWorkerIsStartedBeforeTheFailingCallThrows) {
  auto box = sandbox::start(pool_options(1, 0));
  EXPECT_TRUE(box.wait_for_standby(0ms));  // none wanted
  const pid_t failed = box.worker_pid();
  const auto e = crash_in(box);
  EXPECT_EQ(e.recovery(), sandbox_recovery::restarted) << e.what();
  EXPECT_NE(std::string(e.what()).find("worker restarted in"), std::string::npos) << e.what();
  EXPECT_TRUE(gone(failed)) << "reaped before the call threw";
  const auto st = box.stats();
  EXPECT_EQ(st.failovers, 0u);
  EXPECT_EQ(st.restarts, 1u);
  EXPECT_EQ(st.spares_ready + st.spares_starting + st.spares_started, 0u);
  EXPECT_TRUE(st.spare_pids.empty());
  EXPECT_EQ(served_by(box), box.worker_pid());
  EXPECT_NE(box.worker_pid(), failed);
}

TEST(SandboxStandby, ASpareThatDiedIdleIsNotPromoted) {
  auto box = sandbox::start(pool_options(1, 1));
  ASSERT_TRUE(box.wait_for_standby(60s));
  const pid_t spare = box.stats().spare_pids.front();
  ASSERT_EQ(::kill(spare, SIGKILL), 0);
  // Dead: a zombie (nobody reaps an idle spare) whose threads are all gone, so that nothing
  // holds its socket open any more (a zombie leader alone is not enough: its threads may still
  // be exiting with the descriptor table).
  ASSERT_TRUE(eventually([&] {
    for (const auto& c : cubridge::testing::children())
      if (c.pid == spare && c.state == 'Z') {
        std::size_t threads = 0;
        std::error_code ec;
        for (std::filesystem::directory_iterator it("/proc/" + std::to_string(spare) + "/task", ec);
             !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
          ++threads;
        return !ec && threads == 1;
      }
    return false;
  }));
  const auto e = crash_in(box);
  EXPECT_EQ(e.recovery(), sandbox_recovery::restarted) << e.what();
  EXPECT_NE(box.worker_pid(), spare);
  EXPECT_EQ(served_by(box), box.worker_pid());
  EXPECT_TRUE(eventually([&] { return gone(spare); }));
}

TEST(SandboxStandby, DestroyingTheSandboxWhileASpareStartsJoinsAndReapsIt) {
  cubridge::testing::temp_dir gate;
  auto options = pool_options(1, 1);
  options.environment.variables = {"CUBRIDGE_TEST_LOAD_GATE=" + gate.path.string()};
  const auto children_before = cubridge::testing::children().size();
  pid_t held = 0;
  {
    auto box = sandbox::start(options);  // the first worker passes the gate
    // The spare is held in dlopen: its start cannot finish.
    ASSERT_TRUE(eventually([&] {
      for (const auto& e : std::filesystem::directory_iterator(gate.path))
        if (e.path().filename().string().starts_with("held."))
          held = std::stoi(e.path().extension().string().substr(1));
      return held != 0;
    }));
    EXPECT_EQ(box.stats().spares_starting, 1u);
    EXPECT_FALSE(box.wait_for_standby(0ms));
  }  // options.start_timeout is a minute: the destructor gives the start up instead of waiting
  EXPECT_TRUE(gone(held)) << "the spare being started was not reaped";
  EXPECT_EQ(cubridge::testing::children().size(), children_before);
}

// A worker that dies while it starts is reported as it died, not as a start that timed out
// (the host held the worker's end of the socket until the start ended, so it saw no EOF).
TEST(SandboxStandby, AWorkerThatDiesWhileStartingSaysHow) {
  for (const auto& [how, expected] :
       {std::pair<std::string, std::string>{"exit", "exited with status 7"},
        {"crash", "killed by signal 11 (Segmentation fault) while starting"}}) {
    auto options = pool_options(1, 0);
    options.environment.variables = {"CUBRIDGE_TEST_DIE_ON_LOAD=" + how};
    try {
      (void)sandbox::start(options);
      ADD_FAILURE() << how << ": started";
    } catch (const sandbox_error& e) {
      EXPECT_EQ(e.reason(), sandbox_failure::start_failed) << e.what();
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
}

// --- a pool of workers --------------------------------------------------------------------------

TEST(SandboxPool, FourWorkersServeFourCallsAtOnce) {
  cubridge::testing::temp_dir meeting;
  auto box = sandbox::start(pool_options(4, 0));
  const auto st = box.stats();
  EXPECT_EQ(st.workers, 4u);
  EXPECT_EQ(std::set<pid_t>(st.worker_pids.begin(), st.worker_pids.end()).size(), 4u);
  // Each call waits until all four have arrived: serialized calls would never meet.
  const std::string request = meeting.path.string() + " 4";
  std::vector<std::future<int>> calls;
  for (int i = 0; i < 4; ++i)
    calls.push_back(std::async(std::launch::async, [&] {
      return box.call("rendezvous", {.bytes = as_bytes(request)}).status;
    }));
  std::set<int> served;
  for (auto& c : calls) served.insert(c.get());
  EXPECT_FALSE(served.contains(-1)) << "the calls did not run at the same time";
  EXPECT_EQ(served, std::set<int>(st.worker_pids.begin(), st.worker_pids.end()));
}

TEST(SandboxPool, AFailureInOneWorkerLeavesTheCallInAnotherAlone) {
  for (const std::size_t standby : {0U, 1U}) {
    SCOPED_TRACE("standby " + std::to_string(standby));
    cubridge::testing::temp_dir dir;
    auto box = sandbox::start(pool_options(2, standby));
    const auto pids = box.stats().worker_pids;
    auto waiting = std::async(std::launch::async, [&] {
      return box.call("wait_for_go", {.bytes = as_bytes(dir.path.string())}).status;
    });
    pid_t busy = 0;
    ASSERT_TRUE(eventually([&] {
      for (const auto& e : std::filesystem::directory_iterator(dir.path))
        if (e.path().filename().string().starts_with("entered."))
          busy = std::stoi(e.path().extension().string().substr(1));
      return busy != 0;
    }));
    // The only free worker is the other one: the crash ends it, not the waiting call.
    const auto e = crash_in(box);
    EXPECT_TRUE(e.restarted()) << e.what();
    EXPECT_EQ(::kill(busy, 0), 0) << "the busy worker was disturbed";
    EXPECT_EQ(waiting.wait_for(0ms), std::future_status::timeout) << "the waiting call ended";
    cubridge::testing::write_text(dir.path / "go", "");
    EXPECT_EQ(waiting.get(), busy);
    const auto after = box.stats();
    EXPECT_TRUE(std::find(after.worker_pids.begin(), after.worker_pids.end(), busy) !=
                after.worker_pids.end());
    EXPECT_NE(std::find(pids.begin(), pids.end(), busy), pids.end());
    EXPECT_EQ(after.failures, 1u);
  }
}

TEST(SandboxPool, StatsListEveryWorkerAndSpare) {
  const auto children_before = cubridge::testing::children().size();
  auto box = sandbox::start(pool_options(3, 2));
  ASSERT_TRUE(box.wait_for_standby(60s));
  const auto st = box.stats();
  EXPECT_EQ(st.workers, 3u);
  EXPECT_EQ(st.busy, 0u);
  EXPECT_EQ(st.spares_ready, 2u);
  EXPECT_EQ(st.spares_starting, 0u);
  std::set<pid_t> all(st.worker_pids.begin(), st.worker_pids.end());
  all.insert(st.spare_pids.begin(), st.spare_pids.end());
  EXPECT_EQ(all.size(), 5u);
  EXPECT_EQ(box.worker_pid(), st.worker_pids.front());
  EXPECT_EQ(cubridge::testing::children().size(), children_before + 5);
}

TEST(SandboxPool, NoWorkersIsRefused) {
  try {
    (void)sandbox::start(pool_options(0, 1));
    FAIL() << "started without workers";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
  }
}

TEST(SandboxPool, MoreWorkersOrSparesThanTheCapsAreRefusedBeforeAnyStarts) {
  const auto before = cubridge::testing::children().size();
  for (const auto& [workers, standby] :
       {std::pair<std::size_t, std::size_t>{sandbox_options::max_workers + 1, 0},
        {1, sandbox_options::max_standby + 1},
        {std::size_t{1} << 40, 1}}) {
    try {
      (void)sandbox::start(pool_options(workers, standby));
      FAIL() << workers << " workers, " << standby << " spares started";
    } catch (const cubridge::error& e) {
      EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
      EXPECT_NE(std::string(e.what()).find("at most 256 and 64"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(cubridge::testing::children().size(), before) << "no worker was started";
}

// A caller's oversized call is its own mistake: refused before anything is sent, the worker kept.
TEST(SandboxPool, AnOversizedCallIsRefusedAndTheWorkerKept) {
  auto box = sandbox::start(pool_options(1, 0));
  const auto pid = box.worker_pid();
  namespace protocol = cubridge::detail::sandbox_protocol;
  const std::vector<std::byte> big(protocol::max_request_bytes + 1);
  for (const auto& request :
       {cubridge::sandbox_request{.reply_capacity = protocol::max_reply_capacity + 1},
        cubridge::sandbox_request{.bytes = big}}) {
    try {
      (void)box.call("pid", request);
      FAIL() << "an oversized call was sent";
    } catch (const cubridge::error& e) {
      EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
      EXPECT_NE(std::string(e.what()).find("at most"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(box.worker_pid(), pid);
  EXPECT_EQ(box.stats().failures, 0u);
  EXPECT_EQ(box.call("pid").status, pid) << "the same worker serves the next call";
}

// --- the worker's environment -------------------------------------------------------------------

// A library preloaded ahead of a sanitizer's runtime keeps a sanitized worker from starting (the
// reset guard too: scripts/sanitize leaves the reset_guard tests out for that reason).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif
#define CUBRIDGE_SKIP_UNDER_SANITIZER()                                         \
  do {                                                                          \
    if (sanitized) GTEST_SKIP() << "a preloaded library and a sanitizer clash"; \
  } while (false)

/// The worker's value of `name` ("" if unset) and whether it is set.
std::pair<std::string, bool> worker_env(sandbox& box, const std::string& name) {
  const auto reply = box.call("get_env", {.bytes = as_bytes(name)});
  return {as_text(reply.bytes), reply.status == 1};
}

bool loaded_in_worker(sandbox& box, const std::string& library) {
  return box.call("is_loaded", {.bytes = as_bytes(library)}).status == 1;
}

// A host preloading something (a guard, a sanitizer) no longer preloads it into its worker.
TEST(SandboxEnvironment, TheWorkerDoesNotInheritTheHostsPreloadUnlessAsked) {
  const std::string preload = CUBRIDGE_TEST_SANDBOX_CPU_LIB;  // any harmless library
  const scoped_env host_preload("LD_PRELOAD", preload);
  const scoped_env host_only("CUBRIDGE_TEST_HOST_VARIABLE", "from the host");
  {
    auto box = sandbox::start(pool_options(1, 0));
    EXPECT_EQ(worker_env(box, "LD_PRELOAD"), std::pair(std::string(), false));
    EXPECT_FALSE(loaded_in_worker(box, preload));
    EXPECT_EQ(worker_env(box, "CUBRIDGE_TEST_HOST_VARIABLE").first, "from the host");
  }
  CUBRIDGE_SKIP_UNDER_SANITIZER();
  auto options = pool_options(1, 0);
  options.environment.inherit_preload = true;
  auto box = sandbox::start(options);
  EXPECT_EQ(worker_env(box, "LD_PRELOAD"), std::pair(preload, true));
  EXPECT_TRUE(loaded_in_worker(box, preload));
}

TEST(SandboxEnvironment, VariablesAreSetInTheWorker) {
  const scoped_env host_value("CUBRIDGE_TEST_OVERRIDDEN", "host");
  auto options = pool_options(1, 1);
  options.environment.variables = {"CUBRIDGE_TEST_VALUE=42", "CUBRIDGE_TEST_OVERRIDDEN=worker",
                                   "CUBRIDGE_TEST_EMPTY="};
  auto box = sandbox::start(options);
  EXPECT_EQ(worker_env(box, "CUBRIDGE_TEST_VALUE"), std::pair(std::string("42"), true));
  EXPECT_EQ(worker_env(box, "CUBRIDGE_TEST_OVERRIDDEN").first, "worker");
  EXPECT_EQ(worker_env(box, "CUBRIDGE_TEST_EMPTY"), std::pair(std::string(), true));
  // A spare gets the same environment.
  ASSERT_TRUE(box.wait_for_standby(60s));
  (void)crash_in(box);
  EXPECT_EQ(worker_env(box, "CUBRIDGE_TEST_VALUE").first, "42");

  auto bad = pool_options(1, 0);
  bad.environment.variables = {"NO_VALUE"};
  EXPECT_THROW((void)sandbox::start(bad), cubridge::error);
}

#ifdef CUBRIDGE_TEST_RESET_GUARD
TEST(SandboxEnvironment, TheResetGuardIsPreloadedWhenAsked) {
  CUBRIDGE_SKIP_UNDER_SANITIZER();
  const std::string guard = CUBRIDGE_TEST_RESET_GUARD;
  auto options = pool_options(1, 0);
  options.environment.reset_guard = true;
  options.environment.reset_guard_library = guard;
  {
    auto box = sandbox::start(options);
    EXPECT_EQ(worker_env(box, "LD_PRELOAD").first, guard);
    EXPECT_TRUE(loaded_in_worker(box, guard));
  }
  // First, before what the worker would preload anyway.
  const std::string other = CUBRIDGE_TEST_SANDBOX_CPU_LIB;
  options.environment.variables = {"LD_PRELOAD=" + other};
  auto box = sandbox::start(options);
  EXPECT_EQ(worker_env(box, "LD_PRELOAD").first, guard + " " + other);
  EXPECT_TRUE(loaded_in_worker(box, guard));
  EXPECT_TRUE(loaded_in_worker(box, other));
}
#endif

TEST(SandboxEnvironment, AMissingResetGuardFailsTheStart) {
  auto options = pool_options(1, 0);
  options.environment.reset_guard = true;
  options.environment.reset_guard_library = "/nonexistent/libcubridge_reset_guard.so";
  try {
    (void)sandbox::start(options);
    FAIL() << "started without the guard";
  } catch (const sandbox_error& e) {
    EXPECT_EQ(e.reason(), sandbox_failure::start_failed);
    EXPECT_NE(std::string(e.what()).find(
                  "reset guard /nonexistent/libcubridge_reset_guard.so does not exist"),
              std::string::npos)
        << e.what();
  }
}

// --- with the CUDA test library (GPU) -----------------------------------------------------------

cubridge::sandbox_options gpu_options(std::size_t workers, std::size_t standby) {
  cubridge::sandbox_options o;
  o.library = CUBRIDGE_TEST_GUEST_LIB;
  o.worker = CUBRIDGE_TEST_SANDBOX_WORKER;
  o.call_timeout = 60s;
  o.workers = workers;
  o.standby = standby;
  return o;
}

// A buffer shared while the spare starts is mapped as it starts; one shared once it is ready,
// at once; the spare that takes over works on both in place, as does its own replacement.
TEST(SandboxStandbyGpu, TheSpareHasEveryShareMappedWhenItTakesOver) {
  CUBRIDGE_REQUIRE_GPU();
  cubridge::testing::isolation_host host;
  std::vector<unsigned> first_values, second_values;
  auto first = cubridge::testing::exportable_buffer(first_values);
  auto second = cubridge::testing::exportable_buffer(second_values);
  auto box = sandbox::start(gpu_options(1, 1));
  auto early = box.share(first);
  ASSERT_TRUE(box.wait_for_standby(60s));
  auto late = box.share(second);
  unsigned added = 0;
  for (int failure = 0; failure < 2; ++failure) {
    try {
      (void)box.call("guest_write_invalid_address");
      FAIL() << "no fault";
    } catch (const sandbox_error& e) {
      EXPECT_EQ(e.reason(), sandbox_failure::cuda_fault) << e.what();
      EXPECT_EQ(e.recovery(), sandbox_recovery::spare_promoted) << e.what();
      std::printf("fault %d: %s in %.3f ms\n", failure,
                  std::string(to_string(e.recovery())).c_str(),
                  cubridge::testing::ms(e.restart_duration()));
    }
    EXPECT_EQ(box.call("guest_add_one", {.buffers = {early}}).status, 0);
    EXPECT_EQ(box.call("guest_add_one", {.buffers = {late}}).status, 0);
    ++added;
    EXPECT_EQ(cubridge::testing::wrong_elements(first, first_values, added), 0u);
    EXPECT_EQ(cubridge::testing::wrong_elements(second, second_values, added), 0u);
    ASSERT_TRUE(box.wait_for_standby(60s));
  }
  EXPECT_EQ(box.stats().failovers, 2u);
  EXPECT_EQ(host.buffer_damage(), "");
  EXPECT_EQ(host.kernel_damage(), "");
  EXPECT_FALSE(host.primary.was_reset());
}

#ifdef CUBRIDGE_TEST_RESET_GUARD
// With the guard preloaded in the worker, a library's reset is denied: the call returns, the
// worker and its mappings stay. Without it (the matrix): device_reset, and a new worker.
TEST(SandboxEnvironmentGpu, TheResetGuardInTheWorkerDeniesAReset) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_SKIP_UNDER_SANITIZER();
  cubridge::testing::isolation_host host;
  std::vector<unsigned> values;
  auto memory = cubridge::testing::exportable_buffer(values);
  auto options = gpu_options(1, 0);
  options.environment.reset_guard = true;
  options.environment.reset_guard_library = CUBRIDGE_TEST_RESET_GUARD;
  options.environment.variables = {"CUBRIDGE_RESET_POLICY=deny"};
  auto box = sandbox::start(options);
  auto share = box.share(memory);
  ASSERT_EQ(box.call("guest_add_one", {.buffers = {share}}).status, 0);
  const pid_t pid = box.worker_pid();
  EXPECT_EQ(box.call("guest_reset").status, 0);  // cudaSuccess, and no sandbox_error
  EXPECT_EQ(box.worker_pid(), pid);
  EXPECT_EQ(box.call("guest_add_one", {.buffers = {share}}).status, 0);
  EXPECT_EQ(cubridge::testing::wrong_elements(memory, values, 2), 0u);
  EXPECT_EQ(box.stats().failures, 0u);
  EXPECT_EQ(host.buffer_damage(), "");
}
#endif

TEST(SandboxPoolGpu, EveryWorkerRunsKernelsOnTheSharedBuffers) {
  CUBRIDGE_REQUIRE_GPU();
  cubridge::testing::isolation_host host;  // a current context for the buffers' copies
  constexpr std::size_t workers = 4;
  constexpr int rounds = 10;
  std::vector<std::vector<unsigned>> values(workers);
  std::vector<cubridge::shared_device_memory> memory;
  for (auto& v : values) memory.push_back(cubridge::testing::exportable_buffer(v));
  auto box = sandbox::start(gpu_options(workers, 1));
  std::vector<cubridge::sandbox_share> shares;
  for (const auto& m : memory) shares.push_back(box.share(m));
  std::vector<std::future<int>> threads;
  for (std::size_t t = 0; t < workers; ++t)
    threads.push_back(std::async(std::launch::async, [&, t] {
      int failed = 0;
      for (int i = 0; i < rounds; ++i)
        failed += box.call("guest_add_one", {.buffers = {shares[t]}}).status != 0;
      return failed;
    }));
  for (auto& t : threads) EXPECT_EQ(t.get(), 0);
  for (std::size_t t = 0; t < workers; ++t)
    EXPECT_EQ(cubridge::testing::wrong_elements(memory[t], values[t], rounds), 0u) << t;
}

}  // namespace
