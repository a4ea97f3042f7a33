// Guest contexts: the caller's context stack, the host-state checks, and the misbehaving test
// library (tests/guest_lib) with no protection and inside a guest context. Each test that
// provokes a fault or a reset runs in its own process (CUBRIDGE_EXPECT_CLEAN_EXIT); "none" must
// show the damage, so that "guest" proves the protection (or, where a guest context cannot
// protect, that it reports what broke).
#include <cubridge/core/context.hpp>
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/isolation/guest_context.hpp>

#include "driver_helpers.hpp"
#include "gpu_test.hpp"
#include "isolation_host.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <any>
#include <csignal>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using cubridge::testing::cu;

using cubridge::guest_breakage;
using cubridge::guest_context;
using cubridge::guest_error;
using cubridge::testing::call_guest;
using cubridge::testing::isolation_host;
using cubridge::testing::verdict;

static_assert(!std::is_copy_constructible_v<guest_context>);
static_assert(std::is_nothrow_move_constructible_v<guest_context>);
static_assert(!std::is_move_constructible_v<cubridge::guest_scope>);

std::vector<CUcontext> stack_now() {
  return cubridge::detail::context_stack();
}

// --- without a GPU ------------------------------------------------------------------------------

TEST(GuestError, NamesEveryFinding) {
  const guest_error e("vendor-fft",
                      {{guest_breakage::primary_context_reset, "primary context X was reset"},
                       {guest_breakage::host_buffer_lost, "host buffer 'input' is gone"}});
  EXPECT_TRUE(e.is(cubridge::isolation_errc::guest_damage));
  EXPECT_TRUE(e.broke(guest_breakage::primary_context_reset));
  EXPECT_TRUE(e.broke(guest_breakage::host_buffer_lost));
  EXPECT_FALSE(e.broke(guest_breakage::sticky_error));
  EXPECT_EQ(e.guest(), "vendor-fft");
  const std::string what = e.what();
  EXPECT_NE(what.find("guest 'vendor-fft'"), std::string::npos) << what;
  EXPECT_NE(what.find("primary_context_reset: primary context X was reset"), std::string::npos)
      << what;
  EXPECT_NE(what.find("host_buffer_lost: host buffer 'input' is gone"), std::string::npos) << what;
  EXPECT_EQ(cubridge::to_string(cubridge::isolation_errc::guest_damage), "CUBRIDGE_GUEST_DAMAGE");
  EXPECT_FALSE(e.result().has_value());  // not raised by a call
}

TEST(GuestError, BreakageNames) {
  EXPECT_EQ(cubridge::to_string(guest_breakage::context_stack), "context_stack");
  EXPECT_EQ(cubridge::to_string(guest_breakage::primary_context_reset), "primary_context_reset");
  EXPECT_EQ(cubridge::to_string(guest_breakage::host_buffer_lost), "host_buffer_lost");
  EXPECT_EQ(cubridge::to_string(guest_breakage::sticky_error), "sticky_error");
}

// The library's abort() and hang need no GPU to show that, unprotected, they take the host down.
TEST(GuestMatrix, None_Abort_KillsTheHost) {
  if (cubridge::testing::in_process()) GTEST_SKIP() << "would end this process";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT((void)call_guest("guest_abort"), ::testing::KilledBySignal(SIGABRT), "");
}

TEST(GuestMatrix, None_Hang_BlocksTheHost) {
  if (cubridge::testing::in_process()) GTEST_SKIP() << "would end this process";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The host never gets control back: only the alarm ends it.
  EXPECT_EXIT(
      {
        alarm(1);
        (void)call_guest("guest_hang");
      },
      ::testing::KilledBySignal(SIGALRM), "");
}

// --- the context stack --------------------------------------------------------------------------

TEST(GuestContext, CallRunsInTheGuestContextAndRestoresTheStack) {
  CUBRIDGE_REQUIRE_GPU();
  auto host = cubridge::context::create(cubridge::device::get(0));
  auto guest = guest_context::create(cubridge::device::get(0), {.name = "stack"});
  ASSERT_NE(guest.ref(), host.ref());
  // From an empty stack.
  ASSERT_TRUE(stack_now().empty());
  EXPECT_EQ(guest.call([] { return cubridge::context_ref::current(); }), guest.ref());
  EXPECT_TRUE(stack_now().empty());
  // From the caller's own stack [host, host2].
  auto host2 = cubridge::context::create(cubridge::device::get(0));
  CUBRIDGE_ASSERT_CU(cu().cuCtxPushCurrent(host.get()));
  CUBRIDGE_ASSERT_CU(cu().cuCtxPushCurrent(host2.get()));
  const std::vector<CUcontext> before{host2.get(), host.get()};
  ASSERT_EQ(stack_now(), before);
  guest.call([&] {
    EXPECT_EQ(stack_now(), (std::vector<CUcontext>{guest.ref().get(), host2.get(), host.get()}));
  });
  EXPECT_EQ(stack_now(), before);
  {
    auto scope = guest.enter();
    EXPECT_EQ(cubridge::context_ref::current(), guest.ref());
    scope.leave();
  }
  EXPECT_EQ(stack_now(), before);
  CUcontext popped = nullptr;
  CUBRIDGE_ASSERT_CU(cu().cuCtxPopCurrent(&popped));
  CUBRIDGE_ASSERT_CU(cu().cuCtxPopCurrent(&popped));
}

TEST(GuestContext, RuntimeCallsInsideUseTheGuestContext) {
  CUBRIDGE_REQUIRE_GPU();
  auto guest = guest_context::create(cubridge::device::get(0));
  void* p = nullptr;
  CUcontext owner = nullptr;
  guest.call([&] {
    ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
    CUBRIDGE_ASSERT_CU(cu().cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT,
                                                  reinterpret_cast<CUdeviceptr>(p)));
    ASSERT_EQ(cudaFree(p), cudaSuccess);
  });
  EXPECT_EQ(owner, guest.ref().get());
}

TEST(GuestContext, ContextsTheGuestLeftPushedAreReportedAndPopped) {
  CUBRIDGE_REQUIRE_GPU();
  auto host = cubridge::context::create(cubridge::device::get(0));
  auto stray = cubridge::context::create(cubridge::device::get(0));
  auto guest = guest_context::create(cubridge::device::get(0), {.name = "leaky"});
  cubridge::scoped_current current(host);
  try {
    guest.call([&] { ASSERT_EQ(cu().cuCtxPushCurrent(stray.get()), CUDA_SUCCESS); });
    FAIL() << "no guest_error";
  } catch (const guest_error& e) {
    EXPECT_TRUE(e.broke(guest_breakage::context_stack)) << e.what();
    EXPECT_NE(std::string(e.what()).find("left 1 context(s) pushed"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("guest 'leaky'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(stack_now(), std::vector<CUcontext>{host.get()});
}

TEST(GuestContext, CallersContextsTheGuestPoppedAreReportedAndPushedBack) {
  CUBRIDGE_REQUIRE_GPU();
  auto below = cubridge::context::create(cubridge::device::get(0));
  auto host = cubridge::context::create(cubridge::device::get(0));
  auto guest = guest_context::create(cubridge::device::get(0));
  cubridge::scoped_current first(below);
  cubridge::scoped_current second(host);
  try {
    guest.call([&] {
      CUcontext popped = nullptr;
      ASSERT_EQ(cu().cuCtxPopCurrent(&popped), CUDA_SUCCESS);  // its own
      ASSERT_EQ(cu().cuCtxPopCurrent(&popped), CUDA_SUCCESS);  // the caller's `host`
    });
    FAIL() << "no guest_error";
  } catch (const guest_error& e) {
    EXPECT_TRUE(e.broke(guest_breakage::context_stack)) << e.what();
    EXPECT_NE(std::string(e.what()).find("popped its own context"), std::string::npos) << e.what();
  }
  EXPECT_EQ(stack_now(), (std::vector<CUcontext>{host.get(), below.get()}));
}

TEST(GuestContext, AnExceptionFromTheGuestPropagatesWithTheStackRestored) {
  CUBRIDGE_REQUIRE_GPU();
  auto host = cubridge::context::create(cubridge::device::get(0));
  auto stray = cubridge::context::create(cubridge::device::get(0));
  auto guest = guest_context::create(cubridge::device::get(0));
  cubridge::scoped_current current(host);
  EXPECT_THROW(guest.call([&] {
    (void)cu().cuCtxPushCurrent(stray.get());
    throw std::runtime_error("library failed");
  }),
               std::runtime_error);
  EXPECT_EQ(stack_now(), std::vector<CUcontext>{host.get()});
}

TEST(GuestContext, ReturnsWhatTheCallReturns) {
  CUBRIDGE_REQUIRE_GPU();
  auto guest = guest_context::create(cubridge::device::get(0));
  EXPECT_EQ(guest.call([] { return 42; }), 42);
  int value = 0;
  int& ref = guest.call([&]() -> int& { return value; });
  EXPECT_EQ(&ref, &value);
}

// --- watched host state -------------------------------------------------------------------------

TEST(GuestContext, WatchRefusesMemoryTheDriverDoesNotKnow) {
  CUBRIDGE_REQUIRE_GPU();
  auto guest = guest_context::create(cubridge::device::get(0));
  std::vector<unsigned> plain_host(16);
  try {
    guest.watch("plain", reinterpret_cast<CUdeviceptr>(plain_host.data()), 64);
    FAIL() << "watch accepted pageable host memory";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
    EXPECT_NE(std::string(e.what()).find("host buffer 'plain'"), std::string::npos) << e.what();
  }
}

TEST(GuestContext, AHostBufferFreedDuringTheCallIsReportedByName) {
  CUBRIDGE_REQUIRE_GPU();
  auto host = cubridge::context::create(cubridge::device::get(0));
  auto guest = guest_context::create(cubridge::device::get(0));
  CUdeviceptr raw = 0;
  {
    cubridge::scoped_current current(host);
    CUBRIDGE_ASSERT_CU(cu().cuMemAlloc(&raw, 1 << 20));
  }
  auto shared = cubridge::shared_device_memory::allocate(cubridge::device::get(0), 1 << 20);
  guest.watch("weights", raw, 1 << 20);
  guest.watch("shared", shared);
  EXPECT_NO_THROW(guest.call([] {}));
  EXPECT_NO_THROW(guest.check_host());
  try {
    guest.call([&] { ASSERT_EQ(cu().cuMemFree(raw), CUDA_SUCCESS); });
    FAIL() << "no guest_error";
  } catch (const guest_error& e) {
    EXPECT_TRUE(e.broke(guest_breakage::host_buffer_lost)) << e.what();
    EXPECT_NE(std::string(e.what()).find("host buffer 'weights'"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("host buffer 'shared'"), std::string::npos) << e.what();
  }
  guest.unwatch(raw);
  EXPECT_NO_THROW(guest.check_host());
}

// The call returned before its damage was found: the error keeps what it returned.
TEST(GuestContext, AGuestErrorKeepsWhatTheCallReturned) {
  CUBRIDGE_REQUIRE_GPU();
  auto guest = guest_context::create(cubridge::device::get(0), {.name = "returns"});
  auto primary = cubridge::primary_context::retain(cubridge::device::get(0));
  for (const bool void_call : {false, true}) {
    CUdeviceptr raw = 0;
    {
      cubridge::scoped_current current(primary);
      CUBRIDGE_ASSERT_CU(cu().cuMemAlloc(&raw, 1 << 20));
    }
    guest.watch("input", raw, 1 << 20);
    try {
      if (void_call)
        guest.call([&] { (void)cu().cuMemFree(raw); });
      else
        (void)guest.call([&] { return cu().cuMemFree(raw); });
      FAIL() << "no guest_error";
    } catch (const guest_error& e) {
      EXPECT_TRUE(e.broke(guest_breakage::host_buffer_lost)) << e.what();
      if (void_call) {
        EXPECT_FALSE(e.result().has_value());
      } else {
        ASSERT_TRUE(e.result().has_value());
        EXPECT_EQ(std::any_cast<CUresult>(e.result()), CUDA_SUCCESS);
      }
    }
    guest.unwatch(raw);
  }
}

TEST(GuestContext, AnActivePrimaryIsWatchedByDefault) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      {
        verdict v;
        auto primary = cubridge::primary_context::retain(cubridge::device::get(0));
        auto guest = guest_context::create(cubridge::device::get(0), {.name = "resetter"});
        try {
          // What a library's reset does with the primary current: the primary is re-created.
          guest.call([&] { (void)cu().cuDevicePrimaryCtxReset(0); });
          v.expect(false, "no guest_error after a primary-context reset");
        } catch (const guest_error& e) {
          v.note(e.what());
          v.expect(e.broke(guest_breakage::primary_context_reset),
                   "primary_context_reset reported");
        }
        v.exit();
      },
      "primary_context_reset: primary context .* of device 0 retained with id");
}

// --- under MPS (faked: no machine here has MPS) --------------------------------------------------

// The process's MPS probe replaced for one test: the device attribute says `enabled`.
struct faked_mps_attribute {
  explicit faked_mps_attribute(bool enabled) {
    cubridge::mps_probe probe;
    probe.device_attribute = [enabled](int, std::string&) { return std::optional<bool>(enabled); };
    previous = cubridge::set_mps_probe(std::move(probe));
  }
  ~faked_mps_attribute() { cubridge::set_mps_probe(std::move(previous)); }
  cubridge::mps_probe previous;
};

TEST(GuestContext, UnderMpsTheDefaultWarnsAndStillCreates) {
  CUBRIDGE_REQUIRE_GPU();
  const faked_mps_attribute mps(true);
  std::vector<std::string> lines;
  auto previous_sink =
      cubridge::set_mps_warning_sink([&](std::string_view line) { lines.emplace_back(line); });
  auto guest = guest_context::create(cubridge::device::get(0), {.name = "under-mps"});
  cubridge::set_mps_warning_sink(std::move(previous_sink));
  EXPECT_NE(guest.ref().get(), nullptr);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("guest context 'under-mps' on device 0 does not contain faults"),
            std::string::npos)
      << lines[0];
}

TEST(GuestContext, RefuseWithoutMpsCreates) {
  CUBRIDGE_REQUIRE_GPU();
  // The real detection: the device attribute of the GPU machine, which runs no MPS.
  if (cubridge::detect_mps(0).active) GTEST_SKIP() << "MPS serves device 0 here";
  auto guest = guest_context::create(cubridge::device::get(0),
                                     {.name = "no-mps", .mps = cubridge::mps_policy::refuse});
  EXPECT_EQ(guest.call([] { return 7; }), 7);
}

// --- the misbehaving library: none vs guest context ---------------------------------------------

// (a) cudaDeviceReset in the library's own call.
TEST(GuestMatrix, None_ResetInOwnCall_DestroysTheHostBuffer) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      {
        verdict v;
        isolation_host host;
        v.expect(call_guest("guest_init") == 0, "library initialised");
        v.note("library reset returned " + std::to_string(call_guest("guest_reset")));
        const auto damage = host.buffer_damage();
        v.note("host buffer: " + (damage.empty() ? std::string("intact") : damage));
        v.expect(!damage.empty(), "the reset destroyed the host's primary-context buffer");
        v.expect(host.primary.was_reset(), "the primary context was reset");
        v.exit();
      },
      "");
}

TEST(GuestMatrix, Guest_ResetInOwnCall_LeavesTheHostIntact) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      {
        verdict v;
        isolation_host host;
        auto guest = guest_context::create(cubridge::device::get(0), {.name = "resetter"});
        guest.watch("host buffer", host.buffer.span());
        try {
          v.expect(guest.call([] { return call_guest("guest_init"); }) == 0, "library initialised");
          v.note("library reset returned " +
                 std::to_string(guest.call([] { return call_guest("guest_reset"); })));
        } catch (const guest_error& e) {
          v.expect(false, std::string("unexpected guest_error: ") + e.what());
        }
        const auto damage = host.buffer_damage();
        v.note("host buffer: " + (damage.empty()
                                      ? "intact, checksum " + std::to_string(host.expected_checksum)
                                      : damage));
        v.expect(damage.empty(), "host buffer intact");
        const auto kernel = host.kernel_damage();
        v.expect(kernel.empty(), "host kernels still launch: " + kernel);
        v.expect(!host.primary.was_reset(), "primary context unchanged");
        v.expect(cubridge::context_ref::current() == host.primary.ref(),
                 "host context current again");
        v.exit();
      },
      "");
}

// (b) cudaDeviceReset from a thread the library spawned: no guest context is current there.
TEST(GuestMatrix, None_ResetFromOwnThread_DestroysTheHostBuffer) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      {
        verdict v;
        isolation_host host;
        v.expect(call_guest("guest_init") == 0, "library initialised");
        v.note("library reset returned " +
               std::to_string(call_guest("guest_reset_from_own_thread")));
        v.expect(!host.buffer_damage().empty(), "the reset destroyed the host's buffer");
        v.expect(host.primary.was_reset(), "the primary context was reset");
        v.exit();
      },
      "");
}

TEST(GuestMatrix, Guest_ResetFromOwnThread_IsReportedNotPrevented) {
  // A guest context cannot reach a thread the library creates: the reset guard protects there
  // (tests/reset_guard). The guest context must still say what broke.
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      {
        verdict v;
        isolation_host host;
        auto guest = guest_context::create(cubridge::device::get(0), {.name = "thread-resetter"});
        guest.watch("host buffer", host.buffer.span());
        v.expect(guest.call([] { return call_guest("guest_init"); }) == 0, "library initialised");
        try {
          (void)guest.call([] { return call_guest("guest_reset_from_own_thread"); });
          v.expect(false, "no guest_error after the library reset the primary from its thread");
        } catch (const guest_error& e) {
          v.note(e.what());
          v.expect(e.broke(guest_breakage::primary_context_reset),
                   "primary_context_reset reported");
          v.expect(e.broke(guest_breakage::host_buffer_lost), "host_buffer_lost reported");
        }
        v.expect(!host.buffer_damage().empty(), "the host buffer is really gone (not prevented)");
        v.exit();
      },
      "guest 'thread-resetter' broke the host's state");
}

// (c) a kernel writing to an invalid address: every context of the process is poisoned.
TEST(GuestMatrix, None_InvalidAddress_PoisonsTheHost) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      {
        verdict v;
        isolation_host host;
        v.note("library returned " + std::to_string(call_guest("guest_write_invalid_address")));
        const auto damage = host.buffer_damage();
        v.note("host buffer: " + damage);
        v.expect(!damage.empty(), "the fault made the host's buffer unreadable");
        v.expect(!host.kernel_damage().empty(), "the fault stopped host kernels");
        v.exit();
      },
      "");
}

TEST(GuestMatrix, Guest_InvalidAddress_IsReportedAndStillPoisonsTheHost) {
  // FACTS.md: a second context is not a fault boundary. The guest context reports the sticky
  // error at the call that caused it; only a sandbox protects (test_sandbox).
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      {
        verdict v;
        isolation_host host;
        auto guest = guest_context::create(cubridge::device::get(0), {.name = "faulty"});
        try {
          (void)guest.call([] { return call_guest("guest_write_invalid_address"); });
          v.expect(false, "no guest_error after an illegal address in the guest");
        } catch (const guest_error& e) {
          v.note(e.what());
          v.expect(e.broke(guest_breakage::sticky_error), "sticky_error reported");
          v.expect(std::string(e.what()).find("CUDA_ERROR_ILLEGAL_ADDRESS") != std::string::npos,
                   "the error is named");
        }
        v.expect(!host.buffer_damage().empty(), "the host is poisoned too (process-wide fault)");
        v.exit();
      },
      "sticky_error: guest context .* reports CUDA_ERROR_ILLEGAL_ADDRESS");
}

// (d) abort(): a guest context is no help either.
TEST(GuestMatrix, Guest_Abort_KillsTheHost) {
  CUBRIDGE_REQUIRE_GPU();
  if (cubridge::testing::in_process()) GTEST_SKIP() << "would end this process";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto guest = guest_context::create(cubridge::device::get(0));
        (void)guest.call([] { return call_guest("guest_abort"); });
      },
      ::testing::KilledBySignal(SIGABRT), "");
}

// (f) the well-behaved library works on the host's buffer in place, through VMM memory.
TEST(GuestMatrix, Guest_AddOne_WorksOnTheHostsBufferInPlace) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      {
        verdict v;
        isolation_host host;
        auto shared = cubridge::shared_device_memory::allocate(cubridge::device::get(0), 1 << 22);
        const std::size_t n = shared.size_bytes() / sizeof(unsigned);
        auto values = cubridge::testing::pattern(n, 0xadd1);
        CUBRIDGE_CU(
            cuMemcpy,
            (shared.address(), reinterpret_cast<CUdeviceptr>(values.data()), shared.size_bytes()),
            "filling the shared buffer");
        auto guest = guest_context::create(cubridge::device::get(0), {.name = "adder"});
        guest.watch("host buffer", host.buffer.span());
        guest.watch("shared", shared);
        int status = -1;
        try {
          status = guest.call([&] {
            return call_guest("guest_add_one",
                              {{reinterpret_cast<void*>(shared.address()), shared.size_bytes()}});
          });
        } catch (const guest_error& e) {
          v.expect(false, std::string("unexpected guest_error: ") + e.what());
        }
        v.expect(status == 0, "guest_add_one returned " + std::to_string(status));
        std::vector<unsigned> back(n);
        CUBRIDGE_CU(
            cuMemcpy,
            (reinterpret_cast<CUdeviceptr>(back.data()), shared.address(), shared.size_bytes()),
            "reading the shared buffer");
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < n; ++i) wrong += back[i] != values[i] + 1;
        v.expect(wrong == 0,
                 std::to_string(wrong) + " of " + std::to_string(n) + " elements wrong");
        v.expect(host.buffer_damage().empty(), "host buffer intact");
        v.expect(cubridge::detail::context_stack() == std::vector<CUcontext>{host.primary.get()},
                 "the host's stack is [primary] again");
        v.exit();
      },
      "");
}

}  // namespace
