// Tests of cubridge/core/process_health.hpp without a GPU: simulated sticky errors
// (note_cuda_result, the driver's codes as plain values), the record kept once, the listeners and
// the exit policy, which ends its own process (a death test, in a child).
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/process_health.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <source_location>
#include <string>
#include <thread>

namespace {

using namespace std::chrono_literals;

// The record is forgotten before and after each test: the errors here are simulated, so the
// driver holds none (reset_process_health_for_tests forgets no real one).
class ProcessHealth : public ::testing::Test {
 protected:
  void SetUp() override { cubridge::detail::reset_process_health_for_tests(); }
  void TearDown() override { cubridge::detail::reset_process_health_for_tests(); }
};

// Removes a listener when the test ends, however it ends: a listener refers to the test's
// locals, and reset_process_health_for_tests keeps the listeners.
struct listener_guard {
  std::uint64_t id;
  ~listener_guard() { cubridge::remove_poison_listener(id); }
};

// Whether `statement` throws cubridge::error with errc::precondition.
template <class Statement>
::testing::AssertionResult refused_as_precondition(Statement statement) {
  try {
    statement();
  } catch (const cubridge::error& e) {
    if (e.is(cubridge::errc::precondition)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "another error: " << e.what();
  }
  return ::testing::AssertionFailure() << "no throw";
}

TEST_F(ProcessHealth, AProcessStartsHealthy) {
  EXPECT_FALSE(cubridge::process_poisoned());
  EXPECT_FALSE(cubridge::process_health().has_value());
  // A probe of no context asks no driver, and finds nothing.
  EXPECT_FALSE(cubridge::probe_process_health(cubridge::context_ref::from_native(nullptr)));
}

TEST_F(ProcessHealth, StickyErrorsAreTheFaultsThatPoisonEveryContext) {
  for (const CUresult sticky :
       {CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_HARDWARE_STACK_ERROR,
        CUDA_ERROR_ILLEGAL_INSTRUCTION, CUDA_ERROR_MISALIGNED_ADDRESS,
        CUDA_ERROR_INVALID_ADDRESS_SPACE, CUDA_ERROR_INVALID_PC, CUDA_ERROR_ECC_UNCORRECTABLE})
    EXPECT_TRUE(cubridge::is_sticky_error(sticky)) << cubridge::detail::driver_error_name(sticky);
  // A reset context is the reset guard's matter (a new context works), and the rest fail one
  // call only.
  for (const CUresult passing :
       {CUDA_SUCCESS, CUDA_ERROR_NOT_READY, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
        CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_CONTEXT_IS_DESTROYED, CUDA_ERROR_DEINITIALIZED,
        CUDA_ERROR_LAUNCH_TIMEOUT, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES})
    EXPECT_FALSE(cubridge::is_sticky_error(passing))
        << cubridge::detail::driver_error_name(passing);
}

TEST_F(ProcessHealth, AnErrorThatIsNotStickyChangesNothing) {
  for (const CUresult r : {CUDA_SUCCESS, CUDA_ERROR_NOT_READY, CUDA_ERROR_INVALID_VALUE,
                           CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_CONTEXT_IS_DESTROYED})
    cubridge::note_cuda_result(r, "cuMemAlloc");
  EXPECT_FALSE(cubridge::process_poisoned());
  EXPECT_FALSE(cubridge::process_health().has_value());
}

TEST_F(ProcessHealth, AStickyErrorMarksTheProcessWithTheCallTheKernelAndTheTime) {
  const auto before = std::chrono::system_clock::now();
  const auto before_steady = std::chrono::steady_clock::now();
  cubridge::note_cuda_result(CUDA_ERROR_ILLEGAL_ADDRESS, "cuStreamSynchronize", "scale");
  const auto after = std::chrono::system_clock::now();
  const auto after_steady = std::chrono::steady_clock::now();

  EXPECT_TRUE(cubridge::process_poisoned());
  const auto record = cubridge::process_health();
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->error, CUDA_ERROR_ILLEGAL_ADDRESS);
  // Named alike with and without a driver (driver_error_name knows the sticky errors).
  EXPECT_EQ(record->error_name, "CUDA_ERROR_ILLEGAL_ADDRESS");
  EXPECT_EQ(record->call, "cuStreamSynchronize");
  EXPECT_GE(record->at, before);
  EXPECT_LE(record->at, after);
  EXPECT_GE(record->seen_at, before_steady);
  EXPECT_LE(record->seen_at, after_steady);
  ASSERT_FALSE(record->running.empty()) << "the kernel names the first suspect";
  EXPECT_EQ(record->running.front().kernel, "scale");

  const auto text = cubridge::describe(*record);
  for (const std::string& part :
       {std::string("poisoned by ") + record->error_name,
        std::string("seen by cuStreamSynchronize"), std::string("kernel 'scale'")})
    EXPECT_NE(text.find(part), std::string::npos) << part << " in: " << text;
  // A probe of no context answers from the flag.
  EXPECT_TRUE(cubridge::probe_process_health(cubridge::context_ref::from_native(nullptr)));
}

TEST_F(ProcessHealth, AFailedCheckedCallMarksTheProcess) {
  // What every CUBRIDGE_CU does on a failure: the error is thrown, and noted first.
  EXPECT_THROW(
      cubridge::detail::throw_driver_error(CUDA_ERROR_ILLEGAL_ADDRESS, "cuMemcpyDtoH",
                                           "copying 'out'", std::source_location::current()),
      cubridge::error);
  const auto record = cubridge::process_health();
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->call, "cuMemcpyDtoH");
}

TEST_F(ProcessHealth, TheFirstStickyErrorIsKept) {
  cubridge::note_cuda_result(CUDA_ERROR_ILLEGAL_ADDRESS, "first");
  cubridge::note_cuda_result(CUDA_ERROR_LAUNCH_FAILED, "second");
  cubridge::note_cuda_result(CUDA_ERROR_INVALID_VALUE, "third");
  const auto record = cubridge::process_health();
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->error, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(record->call, "first");
}

TEST_F(ProcessHealth, AListenerIsToldOnceAndOneAddedLaterAtOnce) {
  int told = 0;
  std::string call;
  std::thread::id on;
  const listener_guard early{cubridge::add_poison_listener([&](const cubridge::poison_record& r) {
    ++told;
    call = r.call;
    on = std::this_thread::get_id();
  })};
  int removed_told = 0;
  const auto removed =
      cubridge::add_poison_listener([&](const cubridge::poison_record&) { ++removed_told; });
  cubridge::remove_poison_listener(removed);
  EXPECT_EQ(told, 0) << "nothing to tell while healthy";

  cubridge::note_cuda_result(CUDA_ERROR_ILLEGAL_ADDRESS, "cuStreamSynchronize");
  cubridge::note_cuda_result(CUDA_ERROR_LAUNCH_FAILED, "cuLaunchKernel");
  EXPECT_EQ(told, 1);
  EXPECT_EQ(call, "cuStreamSynchronize");
  EXPECT_EQ(on, std::this_thread::get_id()) << "told on the thread that marked it";
  EXPECT_EQ(removed_told, 0) << "a removed listener is not told";

  int late_told = 0;
  std::string late_call;
  const listener_guard late{cubridge::add_poison_listener([&](const cubridge::poison_record& r) {
    ++late_told;
    late_call = r.call;
  })};
  EXPECT_EQ(late_told, 1) << "added after the poisoning: told at once";
  EXPECT_EQ(late_call, "cuStreamSynchronize");
  EXPECT_EQ(told, 1);
}

TEST_F(ProcessHealth, TheExitPolicyRefusesCodesOutsideOneTo255AndANegativeGrace) {
  for (const int code : {0, 256, -1})
    EXPECT_TRUE(refused_as_precondition([&] {
      (void)cubridge::exit_when_poisoned({.grace = 10ms, .exit_code = code});
    })) << "exit code "
        << code;
  EXPECT_TRUE(refused_as_precondition(
      [] { (void)cubridge::exit_when_poisoned({.grace = std::chrono::milliseconds(-1)}); }));
  EXPECT_FALSE(cubridge::process_poisoned());
}

// The policy ends the process with 75 after its grace: in a child (threadsafe: the binary is
// executed again, so nothing of this process's state is shared), where a simulated sticky error
// starts the timer and the statement then waits for the end.
TEST_F(ProcessHealth, APoisonedProcessEndsWithCode75AfterTheGrace) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        (void)cubridge::exit_when_poisoned({.grace = 50ms});
        cubridge::note_cuda_result(CUDA_ERROR_ILLEGAL_ADDRESS, "cuStreamSynchronize");
        // Not a synchronisation: the timer ends the process long before; if it did not, the
        // statement returns and the death test fails.
        std::this_thread::sleep_for(60s);
      },
      ::testing::ExitedWithCode(cubridge::poisoned_exit_code),
      "exiting with 75 \\(exit_when_poisoned\\)");
  EXPECT_EQ(cubridge::poisoned_exit_code, 75);
}

}  // namespace
