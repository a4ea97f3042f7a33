#include <cubridge/core/driver.hpp>
#include <cubridge/core/error.hpp>

#include <gtest/gtest.h>

#include <string>

namespace {

TEST(Driver, AvailabilityAndReasonAgree) {
  const bool available = cubridge::driver::available();
  const std::string reason = cubridge::driver::unavailable_reason();
  EXPECT_EQ(available, reason.empty()) << reason;
  if (available) {
    EXPECT_NO_THROW((void)cubridge::driver::api());
  } else {
    try {
      (void)cubridge::driver::api();
      FAIL() << "api() must throw without a driver";
    } catch (const cubridge::driver_unavailable& e) {
      EXPECT_TRUE(e.is(cubridge::errc::no_driver));
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  }
}

TEST(Driver, MissingLibraryIsNamedPlainly) {
  if (cubridge::driver::available()) GTEST_SKIP() << "a driver is present on this machine";
  const std::string reason = cubridge::driver::unavailable_reason();
  // Either no libcuda at all, or a libcuda without a usable GPU: both must say which.
  EXPECT_TRUE(reason == "no CUDA driver: libcuda.so.1 not found" ||
              reason.find("no usable CUDA device") == 0 || reason.find("CUDA driver too old") == 0)
      << reason;
}

TEST(Driver, EveryEntryPointIsResolvedOnce) {
  if (!cubridge::driver::available()) GTEST_SKIP() << cubridge::driver::unavailable_reason();
  const auto& first = cubridge::driver::api();
  const auto& second = cubridge::driver::api();
  EXPECT_EQ(&first, &second) << "entry points must be cached, not resolved per call";
#define CUBRIDGE_EXPECT_RESOLVED(name) EXPECT_NE(first.name, nullptr) << #name;
  CUBRIDGE_DRIVER_ENTRY_POINTS(CUBRIDGE_EXPECT_RESOLVED)
#undef CUBRIDGE_EXPECT_RESOLVED
  EXPECT_GE(cubridge::driver::version(), 13000);
  EXPECT_NE(cubridge::driver::library_path().find("libcuda"), std::string::npos);
}

}  // namespace
