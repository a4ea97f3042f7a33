#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/device.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/error.hpp>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <source_location>
#include <string>

namespace {

using cubridge::errc;

TEST(Error, CarriesEveryField) {
  const auto here = std::source_location::current();
  const cubridge::error e(cubridge::error_source::driver, 400, "CUDA_ERROR_INVALID_HANDLE",
                          "invalid resource handle", "cuModuleUnload",
                          "unloading module 'filters' in context 0x1 on device 0", here);
  EXPECT_EQ(e.source(), cubridge::error_source::driver);
  EXPECT_EQ(e.code(), 400);
  EXPECT_EQ(e.code_name(), "CUDA_ERROR_INVALID_HANDLE");
  EXPECT_EQ(e.description(), "invalid resource handle");
  EXPECT_EQ(e.call(), "cuModuleUnload");
  EXPECT_EQ(e.involved(), "unloading module 'filters' in context 0x1 on device 0");
  const std::string what = e.what();
  EXPECT_EQ(what.rfind("cuModuleUnload CUDA_ERROR_INVALID_HANDLE (invalid resource handle): "
                       "unloading module 'filters' in context 0x1 on device 0 [",
                       0),
            0u)
      << what;
  EXPECT_NE(what.find("test_error.cpp:"), std::string::npos) << what;
  EXPECT_EQ(e.where().line(), here.line());
}

TEST(Error, LocationsAreRelativeToTheProjectRoot) {
  // Thrown inside the library: its location names the source as the repository does, with no
  // path of the machine that built it.
  try {
    (void)cubridge::device::get(-1);
    FAIL() << "device -1 was accepted";
  } catch (const cubridge::error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(" [src/core/"), std::string::npos) << what;
    EXPECT_EQ(what.find(" [/"), std::string::npos) << what;
    EXPECT_EQ(what.find(" [../"), std::string::npos) << what;
  }
}

TEST(Error, ThrowErrcRaisesTheMatchingSubclass) {
  EXPECT_THROW(cubridge::detail::throw_errc(errc::no_driver, "c", "i"),
               cubridge::driver_unavailable);
  EXPECT_THROW(cubridge::detail::throw_errc(errc::bad_image, "c", "i"), cubridge::image_error);
  EXPECT_THROW(cubridge::detail::throw_errc(errc::incompatible_image, "c", "i"),
               cubridge::image_error);
  EXPECT_THROW(cubridge::detail::throw_errc(errc::bad_launch_arguments, "c", "i"),
               cubridge::launch_argument_error);
  EXPECT_THROW(cubridge::detail::throw_errc(errc::context_reset, "c", "i"),
               cubridge::context_reset_error);
  try {
    cubridge::detail::throw_errc(errc::io, "open", "cannot read /nope");
    FAIL() << "no throw";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(errc::io));
    EXPECT_FALSE(e.is(errc::bad_image));
    EXPECT_EQ(e.source(), cubridge::error_source::cubridge);
    EXPECT_EQ(e.code_name(), "CUBRIDGE_IO");
    EXPECT_NE(std::string(e.what()).find("cannot read /nope"), std::string::npos);
  }
}

// A layer of its own, as swap/error.hpp or isolation/error.hpp declare theirs: the core knows
// nothing of it, and its code 1 is not the core's code 1.
namespace test_layer {
enum class codes { refused = 1 };
inline constexpr std::array<cubridge::error_code_info, 1> table{{
    {static_cast<int>(codes::refused), "TEST_REFUSED", "refused by the test layer"},
}};
inline constexpr cubridge::error_domain domain{"test", table};
}  // namespace test_layer
}  // namespace
template <>
inline constexpr const cubridge::error_domain* cubridge::error_domain_of<test_layer::codes> =
    &test_layer::domain;
namespace {

TEST(Error, EachLayerOwnsItsCodesInADomainOfItsOwn) {
  const cubridge::error e(test_layer::domain, 1, {}, "test_layer::refuse", "what was refused",
                          std::source_location::current());
  EXPECT_TRUE(e.is(test_layer::codes::refused));
  EXPECT_FALSE(e.is(errc::no_driver)) << "the core's code 1 is another code";
  ASSERT_NE(e.domain(), nullptr);
  EXPECT_EQ(e.domain()->layer(), "test");
  EXPECT_EQ(e.source(), cubridge::error_source::cubridge);
  EXPECT_EQ(e.code_name(), "TEST_REFUSED");
  EXPECT_EQ(e.description(), "refused by the test layer");
  EXPECT_NE(std::string(e.what()).find("what was refused"), std::string::npos) << e.what();
  try {
    cubridge::detail::throw_errc(errc::no_driver, "c", "i");
  } catch (const cubridge::error& core) {
    EXPECT_TRUE(core.is(errc::no_driver));
    EXPECT_FALSE(core.is(test_layer::codes::refused));
    EXPECT_EQ(core.domain(), &cubridge::core_error_domain);
  }
  // A library's failure belongs to no domain: it is none of cubridge's codes.
  const cubridge::error driver(cubridge::error_source::driver, 1, "CUDA_ERROR_INVALID_VALUE", "",
                               "cuMemAlloc", "", std::source_location::current());
  EXPECT_EQ(driver.domain(), nullptr);
  EXPECT_FALSE(driver.is(errc::no_driver));
}

TEST(Error, ErrcNamesAreDistinct) {
  EXPECT_EQ(cubridge::to_string(errc::no_driver), "CUBRIDGE_NO_DRIVER");
  EXPECT_EQ(cubridge::to_string(errc::bad_launch_arguments), "CUBRIDGE_BAD_LAUNCH_ARGUMENTS");
  EXPECT_NE(cubridge::to_string(errc::bad_image), cubridge::to_string(errc::incompatible_image));
}

TEST(Error, PreconditionMacroNamesTheCondition) {
  const int size = 0;
  try {
    CUBRIDGE_EXPECTS(size > 0, "buffer 'weights'");
    FAIL() << "no throw";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(errc::precondition));
    EXPECT_NE(std::string(e.what()).find("size > 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("buffer 'weights'"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(CUBRIDGE_EXPECTS(size == 0, "never shown"));
}

TEST(Error, RuntimeCheckNamesTheCallAndCode) {
  try {
    CUBRIDGE_CUDART(cudaErrorInvalidValue, "copying 'weights'");
    FAIL() << "no throw";
  } catch (const cubridge::error& e) {
    EXPECT_EQ(e.source(), cubridge::error_source::runtime);
    EXPECT_EQ(e.code(), cudaErrorInvalidValue);
    EXPECT_EQ(e.code_name(), "cudaErrorInvalidValue");
    EXPECT_EQ(e.call(), "cudaErrorInvalidValue");
    EXPECT_EQ(e.involved(), "copying 'weights'");
  }
  int evaluated = 0;
  CUBRIDGE_CUDART(cudaSuccess, std::to_string(++evaluated));
  EXPECT_EQ(evaluated, 0) << "the description must be built only on failure";
}

TEST(Error, DriverErrorNameWorksWithoutADriver) {
  // With a driver this is the driver's own name; without one, a number that still says what it is.
  const std::string name = cubridge::detail::driver_error_name(CUDA_ERROR_INVALID_HANDLE);
  if (cubridge::driver::available())
    EXPECT_EQ(name, "CUDA_ERROR_INVALID_HANDLE");
  else
    EXPECT_EQ(name, "CUresult 400");
}

// check_release, for destructors: process exit and a context destroyed behind our back are
// tolerated; anything else is reported, and in Debug builds fails an assert (as RMM's
// ..._SAFE_SHUTDOWN). Needs no driver (the name falls back to the number).
TEST(CheckRelease, ToleratesShutdownAndADestroyedContext) {
  ::testing::internal::CaptureStderr();
  cubridge::detail::check_release(CUDA_SUCCESS, "cuMemFree");
  cubridge::detail::check_release(CUDA_ERROR_DEINITIALIZED, "cuMemFree");
  cubridge::detail::check_release(CUDA_ERROR_CONTEXT_IS_DESTROYED, "cuStreamDestroy");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

#ifndef NDEBUG
TEST(CheckReleaseDeathTest, AssertsOnAnyOtherFailureInDebugBuilds) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(cubridge::detail::check_release(CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy"),
               "cuEventDestroy failed in a destructor");
}
#else
TEST(CheckRelease, ReportsAnyOtherFailureInReleaseBuilds) {
  ::testing::internal::CaptureStderr();
  cubridge::detail::check_release(CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy");
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("cuEventDestroy failed in a destructor"),
            std::string::npos);
}
#endif

}  // namespace
