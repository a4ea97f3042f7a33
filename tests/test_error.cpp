#include <cubridge/detail/check.hpp>
#include <cubridge/driver.hpp>
#include <cubridge/error.hpp>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

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

}  // namespace
