#include <cubridge/context.hpp>
#include <cubridge/device_buffer.hpp>
#include <cubridge/hot_module.hpp>
#include <cubridge/scoped_current.hpp>
#include <cubridge/stream.hpp>

#include "hot_module_fixture.hpp"

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include <malloc.h>
#include <unistd.h>

namespace {

/// This process's resident set in KiB (Linux /proc/self/statm), or 0 if unreadable.
/// Host memory as the stress test judges it. RSS is read after malloc_trim, so that free pages
/// the allocator kept (arenas of 8 serving threads, fragmentation) do not count as growth;
/// heap_in_use is what malloc has handed out and not had back (ours and the driver's).
struct host_memory {
  std::size_t rss_kib = 0;
  std::size_t heap_in_use_kib = 0;
};

host_memory host_memory_now() {
  malloc_trim(0);
  host_memory m;
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  if (statm >> pages >> resident)
    m.rss_kib = resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) / 1024;
  const auto heap = mallinfo2();
  m.heap_in_use_kib = (heap.uordblks + heap.hblkhd) / 1024;
  return m;
}

using cubridge::testing::hot_image;
using cubridge::testing::read_back;
using HotModule = cubridge::testing::hot_module_fixture;

TEST_F(HotModule, PromoteSwitchesLaterLaunchesAndRollbackReturns) {
  EXPECT_EQ(run_write_version(), 1u);
  EXPECT_EQ(hot_->promote(hot_->stage(hot_image("v2"))), 2u);
  EXPECT_EQ(run_write_version(), 2u);
  EXPECT_EQ(hot_->rollback(), 1u);
  EXPECT_EQ(run_write_version(), 1u);
  EXPECT_EQ(hot_->stats().promotions, 2u);
}

TEST_F(HotModule, InFlightWorkFinishesOnItsVersionAndIsUnloadedAfter) {
  auto spin = hot_->get_kernel("spin_then_write");
  auto slow_out = cubridge::driver_buffer<unsigned>::allocate(*ctx_, 1);
  auto s = cubridge::stream::create(*ctx_);
  // Staged first: a module load can wait for the context's queued work (FACTS.md), which would let
  // the spin finish before the promotions.
  auto v2 = hot_->stage(hot_image("v2"));
  auto v3 = hot_->stage(hot_image("v1"));  // version 3: v1's code again
  // ~300 ms of version 1 still running while two promotions retire it.
  spin.launch({.stream = s}, slow_out.span(), 300'000'000ull);
  hot_->promote(std::move(v2));
  hot_->promote(std::move(v3));  // version 1 retires
  EXPECT_EQ(hot_->stats().retired_waiting, 1u);
  EXPECT_EQ(hot_->reclaim(), 0u) << "version 1's kernel still runs on the GPU";
  EXPECT_EQ(run_write_version(), 1u);  // synchronizes the context: the spin ends here
  s.synchronize();
  EXPECT_EQ(read_back(slow_out), 1u) << "in-flight work finished on the version it started with";
  for (int i = 0; i < 100 && hot_->stats().unloaded < 1u; ++i) {
    hot_->reclaim();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(hot_->stats().retired_waiting, 0u);
  EXPECT_EQ(hot_->stats().unloaded, 1u);
}

TEST_F(HotModule, BadVersionsAreRefusedAndTheCurrentKeepsServing) {
  auto expect_rejected = [&](const std::vector<std::byte>& image, const char* cause,
                             cubridge::stage_options options = {}) {
    try {
      (void)hot_->stage(image, options);
      ADD_FAILURE() << "accepted a version that should fail with: " << cause;
    } catch (const cubridge::version_rejected_error& e) {
      EXPECT_NE(std::string(e.what()).find(cause), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("the current version keeps serving"), std::string::npos);
    }
  };
  expect_rejected(hot_image("missing"), "kernel 'spin_then_write' is missing");
  expect_rejected(hot_image("changed"), "kernel 'write_version' took 1 parameters, now 2");
  cubridge::stage_options failing_smoke;
  failing_smoke.smoke_test = [](const cubridge::module&) { throw std::runtime_error("wrong output"); };
  expect_rejected(hot_image("v2"), "smoke test failed: wrong output", failing_smoke);

  std::vector<std::byte> garbage(2048);
  std::mt19937 rng(1);
  for (auto& b : garbage) b = static_cast<std::byte>(rng());
  EXPECT_THROW((void)hot_->stage(garbage), cubridge::image_error);
  EXPECT_THROW((void)hot_->stage({}), cubridge::image_error);
  EXPECT_THROW((void)hot_->stage(cubridge::read_file_bytes(cubridge::testing::test_cubin_other_path())),
               cubridge::image_error);

  EXPECT_EQ(hot_->stats().rejected, 6u);
  EXPECT_EQ(hot_->stats().current_version, 1u);
  EXPECT_EQ(run_write_version(), 1u);
}

TEST_F(HotModule, DeviceVariablesAreCarriedOverOnRequest) {
  auto count = hot_->get_kernel("count_served");
  auto served = [&] {
    unsigned long long value = 0;
    hot_->read_global("served", std::as_writable_bytes(std::span(&value, 1)));
    return value;
  };
  for (int i = 0; i < 3; ++i) count.launch({});  // version 1 adds 1 per launch
  ASSERT_EQ(cubridge::driver::api().cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(served(), 3u);

  cubridge::stage_options carry;
  carry.carry_globals = {"served"};
  hot_->promote(hot_->stage(hot_image("v2"), carry));
  EXPECT_EQ(served(), 3u) << "carried into version 2";
  count.launch({});  // version 2 adds 2
  ASSERT_EQ(cubridge::driver::api().cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(served(), 5u);

  hot_->promote(hot_->stage(hot_image("v1")));  // not carried: a fresh zero
  EXPECT_EQ(served(), 0u);

  cubridge::stage_options missing;
  missing.carry_globals = {"no_such_variable"};
  try {
    (void)hot_->stage(hot_image("v2"), missing);
    FAIL() << "no throw";
  } catch (const cubridge::version_rejected_error& e) {
    EXPECT_NE(std::string(e.what()).find("'no_such_variable' to carry over is missing"),
              std::string::npos) << e.what();
  }
}

TEST_F(HotModule, TrackedGraphsFollowPromotionAndRollback) {
  const auto& cu = cubridge::driver::api();
  auto k = hot_->get_kernel("write_version");
  CUgraph graph = nullptr;
  ASSERT_EQ(cu.cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  (void)k.add_graph_node(graph, {.block = {256}}, out_->span());
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cu.cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  hot_->track_graph(graph, exec);
  auto s = cubridge::stream::create(*ctx_);
  auto run_graph = [&] {
    const auto id = hot_->launch_graph(exec, s);
    s.synchronize();
    return std::pair{id, read_back(*out_, 255)};
  };
  EXPECT_EQ(run_graph(), (std::pair<std::uint64_t, unsigned>{1, 1}));
  hot_->promote(hot_->stage(hot_image("v2")));
  EXPECT_EQ(run_graph(), (std::pair<std::uint64_t, unsigned>{2, 2})) << "retargeted on promote";
  hot_->rollback();
  EXPECT_EQ(run_graph(), (std::pair<std::uint64_t, unsigned>{1, 1})) << "and on rollback";
  hot_->untrack_graph(exec);
  EXPECT_THROW((void)hot_->launch_graph(exec, s), cubridge::error);
  EXPECT_EQ(cu.cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cu.cuGraphDestroy(graph), CUDA_SUCCESS);
}

TEST_F(HotModule, AGraphWithoutItsKernelsCannotBeTracked) {
  const auto& cu = cubridge::driver::api();
  CUgraph graph = nullptr;
  ASSERT_EQ(cu.cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cu.cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  EXPECT_THROW(hot_->track_graph(graph, exec), cubridge::error);
  cu.cuGraphExecDestroy(exec);
  cu.cuGraphDestroy(graph);
}

TEST_F(HotModule, LaunchConfigurationsInUseMustFitANewVersion) {
  auto k = hot_->get_kernel("write_version");
  // Before any wide launch, a version limited to 128 threads per block fits.
  EXPECT_NO_THROW((void)hot_->stage(hot_image("small")));
  auto wide = cubridge::driver_buffer<unsigned>::allocate(*ctx_, 1024);
  k.launch({.block = {1024}}, wide.span());
  ASSERT_EQ(cubridge::driver::api().cuCtxSynchronize(), CUDA_SUCCESS);
  // v2 allows 1024 threads per block as well: accepted.
  EXPECT_NO_THROW((void)hot_->stage(hot_image("v2")));
  // Now that 1024-thread blocks are in use, the 128-thread version is refused, saying why.
  try {
    (void)hot_->stage(hot_image("small"));
    ADD_FAILURE() << "a version too narrow for the launches in use was accepted";
  } catch (const cubridge::version_rejected_error& e) {
    EXPECT_NE(std::string(e.what()).find("kernel 'write_version' is launched with 1024 threads per "
                                         "block, the new version allows 128"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(hot_->stats().current_version, 1u);
}

TEST_F(HotModule, AThousandSwapsUnderLaunchesReturnMemoryToBaseline) {
  const auto v1 = hot_image("v1");
  const auto v2 = hot_image("v2");
  auto k = hot_->get_kernel("write_version");
  // The driver's first module loads and launches in a context grow pools it keeps (up to a few
  // hundred MiB on the H200): take the baseline after a warm-up, as a service would see it.
  for (int i = 0; i < 20; ++i) {
    hot_->promote(hot_->stage(i % 2 ? v1 : v2));
    k.launch({.block = {256}}, out_->span());
  }
  ASSERT_EQ(cubridge::driver::api().cuCtxSynchronize(), CUDA_SUCCESS);
  for (int i = 0; i < 400 && hot_->stats().unloaded + 1 < hot_->stats().promotions; ++i) {
    hot_->reclaim();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto unloaded_before = hot_->stats().unloaded;
  std::size_t free_before = 0, total = 0;
  ASSERT_EQ(cubridge::driver::api().cuMemGetInfo(&free_before, &total), CUDA_SUCCESS);
  for (int i = 0; i < 1000; ++i) {
    hot_->promote(hot_->stage(i % 2 ? v1 : v2));
    k.launch({.block = {256}}, out_->span());
  }
  ASSERT_EQ(cubridge::driver::api().cuCtxSynchronize(), CUDA_SUCCESS);
  for (int i = 0; i < 400; ++i) {
    const auto st = hot_->stats();
    if (st.retired_waiting == 0 && st.unloaded - unloaded_before == 1000u) break;
    hot_->reclaim();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto stats = hot_->stats();
  EXPECT_EQ(stats.retired_waiting, 0u);
  EXPECT_EQ(stats.unloaded - unloaded_before, 1000u) << "every version the swaps retired";
  std::size_t free_after = 0;
  ASSERT_EQ(cubridge::driver::api().cuMemGetInfo(&free_after, &total), CUDA_SUCCESS);
  EXPECT_LE(free_before, free_after + (std::size_t{1} << 20))
      << "device memory back to baseline: " << free_before / 1024 << " KiB free before, "
      << free_after / 1024 << " KiB after";
}

TEST_F(HotModule, ConcurrentLaunchersNeverFailAcrossSwaps) {
  const auto v1 = hot_image("v1");
  const auto v2 = hot_image("v2");
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> promoted{1};
  std::atomic<long> launches{0}, stale{0}, failures{0};
  std::vector<std::thread> servers;
  for (int t = 0; t < 4; ++t)
    servers.emplace_back([&] {
      try {
        cubridge::scoped_current current(*ctx_);
        auto s = cubridge::stream::create(*ctx_);
        auto out = cubridge::driver_buffer<unsigned>::allocate(*ctx_, 256);
        auto k = hot_->get_kernel("write_version");
        while (!stop.load()) {
          const auto floor = promoted.load();
          if (k.launch({.block = {256}, .stream = s}, out.span()) < floor) stale.fetch_add(1);
          launches.fetch_add(1);
          if (launches.load() % 64 == 0) s.synchronize();
        }
        s.synchronize();
      } catch (const std::exception& e) {
        failures.fetch_add(1);
        ADD_FAILURE() << e.what();
      }
    });
  for (int i = 0; i < 200; ++i) promoted.store(hot_->promote(hot_->stage(i % 2 ? v1 : v2)));
  stop.store(true);
  for (auto& t : servers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(stale.load(), 0) << "a launch after promote() returned ran an older version";
  EXPECT_GT(launches.load(), 200);
}

TEST_F(HotModule, AVersionWhoseStreamWasDestroyedIsStillUnloaded) {
  auto k = hot_->get_kernel("write_version");
  {
    auto s = cubridge::stream::create(*ctx_);
    (void)k.launch({.block = {256}, .stream = s}, out_->span());
  }  // the stream that launched version 1 is gone before version 1 retires
  hot_->promote(hot_->stage(hot_image("v2")));
  hot_->promote(hot_->stage(hot_image("v1")));
  for (int i = 0; i < 100 && hot_->stats().unloaded < 1u; ++i) {
    hot_->reclaim();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(hot_->stats().retired_waiting, 0u);
  EXPECT_EQ(hot_->stats().unloaded, 1u);
  EXPECT_EQ(run_write_version(), 1u);
}

// The bound: across 10,000 swaps under load, with bad versions mixed in, device memory
// returns to baseline +-1 MiB and host RSS stays flat. Prints its numbers for the GPU log.
TEST_F(HotModule, TenThousandSwapsWithRejectsUnderEightLaunchersStayBounded) {
  const auto v1 = hot_image("v1");
  const auto v2 = hot_image("v2");
  const auto missing = hot_image("missing");
  const auto changed = hot_image("changed");
  std::atomic<std::uint64_t> promoted{hot_->stats().current_version};
  auto swap = [&](int i) {
    try {
      hot_->promote(hot_->stage(i % 4 == 3 ? (i % 8 == 3 ? missing : changed) : i % 2 ? v1 : v2));
      promoted.store(hot_->stats().current_version);
      return true;
    } catch (const cubridge::version_rejected_error&) {
      return false;
    }
  };
  // Every version but the current and the rollback target unloaded (not merely taken off the
  // retired list: the reclaimer unloads outside its lock, after that). The servers keep
  // launching meanwhile; they only ever launch the current version.
  auto settle = [&] {
    for (int i = 0; i < 2000; ++i) {
      const auto st = hot_->stats();
      if (st.retired_waiting == 0 && st.unloaded + 1 == st.promotions) return;
      hot_->reclaim();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };

  // The servers run for the whole test, so both memory readings see the same serving state
  // (8 streams, their buffers, the driver's per-stream resources): what differs is only the
  // versions swapped in between. (Readings taken before the servers started and after they
  // stopped differed by 3-4 MiB on the H200 with every version unloaded.)
  std::atomic<bool> stop{false};
  std::atomic<long> launches{0}, stale{0}, failures{0};
  std::vector<std::thread> servers;
  for (int t = 0; t < 8; ++t)
    servers.emplace_back([&] {
      try {
        cubridge::scoped_current current(*ctx_);
        auto s = cubridge::stream::create(*ctx_);
        auto out = cubridge::driver_buffer<unsigned>::allocate(*ctx_, 256);
        // Paced like a service: ~20 us kernels, at most 8 queued per stream. (Unpaced launch
        // loops on 8 threads hold the driver's context lock so much that a swap's ~20 driver
        // calls starve: one swap per second on the H200.)
        auto k = hot_->get_kernel("spin_then_write");
        for (long n = 1; !stop.load(); ++n) {
          const auto floor = promoted.load();
          if (k.launch({.stream = s}, out.span(), 20'000ull) < floor) stale.fetch_add(1);
          if (n % 8 == 0) s.synchronize();
          launches.fetch_add(1);
        }
        s.synchronize();
      } catch (const std::exception& e) {
        failures.fetch_add(1);
        ADD_FAILURE() << e.what();
      }
    });
  // Warm up allocator and driver caches under load before taking the baselines.
  for (int i = 0; i < 200; ++i) (void)swap(i);
  settle();
  std::size_t free_before = 0, total = 0;
  EXPECT_EQ(cubridge::driver::api().cuMemGetInfo(&free_before, &total), CUDA_SUCCESS);
  const auto memory_before = host_memory_now();
  const auto launches_before = launches.load();

  long accepted = 0, refused = 0;
  host_memory memory_half;
  // Progress every 10 s on stderr, so that a stall shows where it is (swap count, launches).
  std::atomic<int> swaps_done{0};
  std::atomic<bool> finished{false};
  std::thread progress([&] {
    for (int tick = 1; !finished.load(); ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (tick % 100 == 0) {
        const auto st = hot_->stats();
        std::cerr << "[stress] " << tick / 10 << " s: " << swaps_done.load() << " swaps, "
                  << launches.load() << " launches, version " << st.current_version
                  << ", retired waiting " << st.retired_waiting << ", unloaded " << st.unloaded
                  << std::endl;
      }
    }
  });
  for (int i = 0; i < 10'000; ++i) {
    swaps_done.store(i);
    if (i == 5'000) memory_half = host_memory_now();
    if (swap(i)) {
      ++accepted;
    } else {
      ++refused;
    }
  }
  swaps_done.store(10'000);
  settle();
  std::size_t free_after = 0;
  // EXPECT, not ASSERT, while the servers run: an early return would leave them joinable.
  EXPECT_EQ(cubridge::driver::api().cuMemGetInfo(&free_after, &total), CUDA_SUCCESS);
  const auto memory_after = host_memory_now();
  const auto stats = hot_->stats();
  stop.store(true);
  for (auto& t : servers) t.join();
  finished.store(true);
  progress.join();
  ASSERT_EQ(cubridge::driver::api().cuCtxSynchronize(), CUDA_SUCCESS);
  std::cout << "[stress] swaps " << accepted << " promoted, " << refused << " refused; launches "
            << launches.load() - launches_before << " on 8 threads during the swaps; failed "
            << failures.load() << ", stale " << stale.load() << "; retired waiting "
            << stats.retired_waiting << ", unloaded " << stats.unloaded << "; device free "
            << free_before / 1024 << " -> " << free_after / 1024 << " KiB; RSS "
            << memory_before.rss_kib << " -> " << memory_half.rss_kib << " (5,000 swaps) -> "
            << memory_after.rss_kib << " KiB; heap in use " << memory_before.heap_in_use_kib
            << " -> " << memory_half.heap_in_use_kib << " -> " << memory_after.heap_in_use_kib
            << " KiB\n";
  EXPECT_EQ(accepted, 7'500);
  EXPECT_EQ(refused, 2'500);
  EXPECT_EQ(stats.rejected, 200u / 4 + 2'500u);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(stale.load(), 0) << "a launch after promote() returned ran an older version";
  EXPECT_EQ(stats.retired_waiting, 0u);
  EXPECT_EQ(stats.unloaded + 1, stats.promotions) << "all but the current and rollback versions";
  const auto mib = std::size_t{1} << 20;
  EXPECT_LE(free_before, free_after + mib) << "device memory back to baseline";
  EXPECT_LE(free_after, free_before + mib) << "device memory back to baseline";
  ASSERT_GT(memory_before.rss_kib, 0u);
  // Back to baseline: both readings are taken settled (every retired version unloaded) with the
  // same servers running, after 200 warm-up swaps grew arenas and driver pools to their working
  // size. A leak of even 1 KiB per swap would show as 10 MiB. (The halfway reading, mid-swap, is
  // printed only: retired versions still in flight make it up to 30 MiB higher on the H200.)
  const std::size_t bound_kib = 4 * 1024;
  EXPECT_LE(memory_after.heap_in_use_kib, memory_before.heap_in_use_kib + bound_kib)
      << "heap in use after 10,000 swaps";
  EXPECT_LE(memory_after.rss_kib, memory_before.rss_kib + bound_kib)
      << "host RSS after 10,000 swaps";
}

}  // namespace
