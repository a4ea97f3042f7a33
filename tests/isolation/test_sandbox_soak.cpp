// The sandbox soak (issue 15): failures in a row, of every kind, mixed, while the host goes on
// with its own work; at the end the host's buffers and contexts are intact, no worker is left (not
// even a zombie), and the host's descriptors and the device's free memory are back where they
// started. One summary line each, for the logs. CPU: the library that needs no GPU, 200 failures
// (crash, abort, hang, exit), on CI too. GPU: the soak library (sandbox_soak_library.cu), 1,000
// failures (crash, abort, fault, reset, hang). CUBRIDGE_SOAK_ROUNDS=N runs N failures instead.
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include "eventually.hpp"
#include "gpu_test.hpp"
#include "isolation/sandbox_test_support.hpp"
#include "isolation_host.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using cubridge::sandbox;
using cubridge::sandbox_error;
using cubridge::sandbox_failure;
using cubridge::testing::as_bytes;
using cubridge::testing::as_text;
using cubridge::testing::eventually;
using namespace std::chrono_literals;

int soak_rounds(int otherwise) {
  const char* v = std::getenv("CUBRIDGE_SOAK_ROUNDS");
  return v && std::atoi(v) > 0 ? std::atoi(v) : otherwise;
}

struct failure_kind {
  const char* entry;
  sandbox_failure reason;
  bool hangs = false;
};

/// What the failing calls saw.
struct tally {
  std::mutex mutex;
  std::map<std::string, int> by_reason;
  int by_spare = 0;
  int restarted = 0;
  int unexpected = 0;  // no failure, another reason, or no worker left to serve
  std::string first_unexpected;
  int worked = 0;  // working calls between the failures (the GPU soak's add_one)
  int noted = 0;
  const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  void note(const failure_kind& kind, const sandbox_error* e) {
    std::lock_guard lock(mutex);
    // A progress line per 100 failures: a run cut off by a time limit still shows how far it got.
    if (++noted % 100 == 0)
      std::fprintf(
          stderr, "soak: %d failures so far (%d by a spare, %d restarted, %d unexpected), %.1f s\n",
          noted, by_spare, restarted, unexpected,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    if (e && e->reason() == kind.reason && e->restarted()) {
      ++by_reason[std::string(cubridge::to_string(e->reason()))];
      (e->recovery() == cubridge::sandbox_recovery::spare_promoted ? by_spare : restarted) += 1;
      return;
    }
    ++unexpected;
    if (first_unexpected.empty())
      first_unexpected = std::string(kind.entry) + ": " + (e ? e->what() : "did not fail");
  }
  [[nodiscard]] std::string reasons() const {
    std::string text;
    for (const auto& [reason, n] : by_reason)
      text += (text.empty() ? "" : ", ") + reason + " " + std::to_string(n);
    return text;
  }
};

/// `rounds` failures over `threads` threads, the kinds mixed: failure i is kind i modulo their
/// number, whatever the threads (a formula with the thread in it gave 4 threads over 4 kinds one
/// kind only). `between(thread)`: a working call after every fifth failure; false if it failed.
void fail_repeatedly(sandbox& box, const std::vector<failure_kind>& kinds, int rounds, int threads,
                     tally& t, const std::function<bool(int)>& between = {}) {
  std::vector<std::thread> pool;
  for (int thread = 0; thread < threads; ++thread)
    pool.emplace_back([&, thread] {
      for (int i = thread; i < rounds; i += threads) {
        const auto& kind = kinds[static_cast<std::size_t>(i) % kinds.size()];
        try {
          (void)box.call(kind.entry, {.timeout = kind.hangs ? 200ms : 0ms});
          t.note(kind, nullptr);
        } catch (const sandbox_error& e) {
          t.note(kind, &e);
        }
        if (between && i % 5 == 4) {
          const bool ok = between(thread);
          std::lock_guard lock(t.mutex);
          (ok ? t.worked : t.unexpected) += 1;
        }
      }
    });
  for (auto& p : pool) p.join();
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(SandboxSoak, CpuLibrary_200MixedFailures_LeaveNoWorkerOrDescriptorBehind) {
  const int rounds = soak_rounds(200);
  const std::vector<failure_kind> kinds = {{"crash", sandbox_failure::crashed},
                                           {"do_abort", sandbox_failure::aborted},
                                           {"hang", sandbox_failure::timed_out, true},
                                           {"exit_early", sandbox_failure::crashed}};
  const auto started = std::chrono::steady_clock::now();
  const auto fds_before = cubridge::testing::open_fd_count();
  const auto children_before = cubridge::testing::children().size();
  tally t;
  std::atomic<int> echoes{0}, echoes_wrong{0};
  cubridge::sandbox_stats st;
  {
    auto box = sandbox::start({.library = CUBRIDGE_TEST_SANDBOX_CPU_LIB,
                               .worker = CUBRIDGE_TEST_SANDBOX_WORKER,
                               .call_timeout = 60s,
                               .initialize_cuda = false,
                               .workers = 2,
                               .standby = 1});
    // The host's own work: calls in the other worker all along, none of them disturbed.
    std::atomic<bool> stop{false};
    std::thread host_work([&] {
      while (!stop) {
        try {
          if (as_text(box.call("echo", {.bytes = as_bytes("host work")}).bytes) != "host work")
            ++echoes_wrong;
        } catch (const std::exception&) {
          ++echoes_wrong;
        }
        ++echoes;
      }
    });
    fail_repeatedly(box, kinds, rounds, 1, t);
    stop = true;
    host_work.join();
    EXPECT_TRUE(eventually([] { return cubridge::testing::zombie_children() == 0; }))
        << "failed workers are left unreaped";
    st = box.stats();
  }
  const auto fds_after = cubridge::testing::open_fd_count();
  const auto children_after = cubridge::testing::children().size();
  std::printf(
      "sandbox soak (cpu library): %d failures (%s): %d taken over by a spare, %d restarted, "
      "%d unexpected; host work: %d calls, %d wrong; fds %zu -> %zu, children %zu -> %zu; "
      "%.1f s\n",
      rounds, t.reasons().c_str(), t.by_spare, t.restarted, t.unexpected, echoes.load(),
      echoes_wrong.load(), fds_before, fds_after, children_before, children_after,
      seconds_since(started));
  EXPECT_EQ(t.unexpected, 0) << t.first_unexpected;
  EXPECT_EQ(st.failures, static_cast<std::size_t>(rounds));
  EXPECT_EQ(echoes_wrong.load(), 0);
  EXPECT_EQ(fds_after, fds_before);
  EXPECT_EQ(children_after, children_before);
}

std::size_t device_free_bytes() {
  std::size_t free = 0, total = 0;
  CUBRIDGE_CU(cuMemGetInfo, (&free, &total), "device 0");
  return free;
}

/// What the host did beside the GPU soak's failures.
struct host_work_done {
  std::vector<unsigned> added;  // working calls per shared buffer
  std::atomic<int> kernels{0}, wrong{0};
};

/// The GPU soak proper: `rounds` failures from one thread per buffer, each thread working on its
/// buffer in between, while the host launches its own kernels; the sandbox ends with it.
void soak_gpu_sandbox(cubridge::testing::isolation_host& host,
                      const std::vector<cubridge::shared_device_memory>& memory, int rounds,
                      tally& t, host_work_done& done) {
  const std::vector<failure_kind> kinds = {{"soak_crash", sandbox_failure::crashed},
                                           {"soak_abort", sandbox_failure::aborted},
                                           {"soak_fault", sandbox_failure::cuda_fault},
                                           {"soak_reset", sandbox_failure::device_reset},
                                           {"soak_hang", sandbox_failure::timed_out, true}};
  const int threads = static_cast<int>(memory.size());
  auto box = sandbox::start({.library = CUBRIDGE_TEST_SOAK_LIB,
                             .worker = CUBRIDGE_TEST_SANDBOX_WORKER,
                             .call_timeout = 60s,
                             .workers = memory.size(),
                             .standby = 2});
  std::vector<cubridge::sandbox_share> shares;
  for (const auto& m : memory) shares.push_back(box.share(m));
  done.added.assign(memory.size(), 0);
  std::atomic<bool> stop{false};
  std::thread host_work([&] {
    cubridge::scoped_current current(host.primary);
    while (!stop) {
      if (!host.kernel_damage().empty()) ++done.wrong;
      ++done.kernels;
    }
  });
  fail_repeatedly(box, kinds, rounds, threads, t, [&](int thread) {
    const auto i = static_cast<std::size_t>(thread);
    const bool ok = box.call("soak_add_one", {.buffers = {shares[i]}}).status == 0;
    done.added[i] += ok;
    return ok;
  });
  stop = true;
  host_work.join();
  EXPECT_TRUE(eventually([] { return cubridge::testing::zombie_children() == 0; }))
      << "failed workers are left unreaped";
}

TEST(SandboxSoak, GpuLibrary_1000MixedFailures_ReturnMemoryToBaseline) {
  CUBRIDGE_REQUIRE_GPU();
  const int rounds = soak_rounds(1000);
  const auto started = std::chrono::steady_clock::now();
  cubridge::testing::isolation_host host;  // device 0's primary context, current here
  ASSERT_EQ(host.kernel_damage(), "");     // the host's kernels launched once before the baseline
  std::vector<std::vector<unsigned>> values(4);
  std::vector<cubridge::shared_device_memory> memory;
  for (auto& v : values) memory.push_back(cubridge::testing::exportable_buffer(v));
  const auto fds_before = cubridge::testing::open_fd_count();
  const auto children_before = cubridge::testing::children().size();
  const auto free_before = device_free_bytes();
  tally t;
  host_work_done done;
  soak_gpu_sandbox(host, memory, rounds, t, done);
  const auto fds_after = cubridge::testing::open_fd_count();
  const auto children_after = cubridge::testing::children().size();
  // Gone workers' contexts are freed by the time they are reaped; allow the driver a moment.
  std::size_t free_after = 0;
  const bool memory_back = eventually(
      [&] {
        free_after = device_free_bytes();
        return free_after == free_before;
      },
      30s);
  const auto damage = host.buffer_damage();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < memory.size(); ++i)
    wrong += cubridge::testing::wrong_elements(memory[i], values[i], done.added[i]);
  std::printf(
      "sandbox soak (gpu library): %d failures (%s) from %zu threads: %d taken over by a spare, "
      "%d restarted, %d unexpected; %d working calls between, %zu elements wrong; host: %d kernel "
      "rounds, %d wrong, buffer %s, primary context %s; fds %zu -> %zu, children %zu -> %zu; "
      "device free %zu -> %zu MiB; %.1f s\n",
      rounds, t.reasons().c_str(), memory.size(), t.by_spare, t.restarted, t.unexpected, t.worked,
      wrong, done.kernels.load(), done.wrong.load(), damage.empty() ? "intact" : damage.c_str(),
      host.primary.was_reset() ? "RESET" : "intact", fds_before, fds_after, children_before,
      children_after, free_before >> 20, free_after >> 20, seconds_since(started));
  EXPECT_EQ(t.unexpected, 0) << t.first_unexpected;
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(done.wrong.load(), 0);
  EXPECT_EQ(damage, "");
  EXPECT_EQ(host.kernel_damage(), "");
  EXPECT_FALSE(host.primary.was_reset());
  EXPECT_EQ(fds_after, fds_before);
  EXPECT_EQ(children_after, children_before);
  EXPECT_TRUE(memory_back) << "device free memory " << free_before << " -> " << free_after;
}

}  // namespace
