// Where the helpers are found (installation.hpp) and whether the reset guard is in this process
// (reset_guard_status.hpp). The moved install tree itself is tests/package_consumer's; the guard
// loaded by `cubridge guard` is the tool tests' (tests/CMakeLists.txt, tool_guard_*).
#include "scoped_env.hpp"

#include <cubridge/core/error.hpp>
#include <cubridge/core/installation.hpp>
#include <cubridge/core/reset_guard_status.hpp>

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace {

using cubridge::helper_file;
using cubridge::testing::scoped_env;
namespace fs = std::filesystem;

TEST(Installation, TheCodeIsInThisTestProgram) {
  // cubridge's static libraries are linked into the test: its code is the program itself.
  EXPECT_EQ(cubridge::code_location(), fs::canonical("/proc/self/exe"));
}

TEST(Installation, TheEnvironmentOverridesAndIsTakenAsGiven) {
  {
    scoped_env worker("CUBRIDGE_SANDBOX_WORKER", "/bin/sh");
    const auto at = cubridge::locate(helper_file::sandbox_worker);
    EXPECT_EQ(at.path, "/bin/sh");
    EXPECT_EQ(at.found_by, "CUBRIDGE_SANDBOX_WORKER");
    EXPECT_TRUE(at.found);
  }
  {
    // Not there: still the answer (an explicit choice is never replaced by a guess).
    scoped_env guard("CUBRIDGE_RESET_GUARD", "/nonexistent/libcubridge_reset_guard.so");
    const auto at = cubridge::locate(helper_file::reset_guard);
    EXPECT_EQ(at.path, "/nonexistent/libcubridge_reset_guard.so");
    EXPECT_EQ(at.found_by, "CUBRIDGE_RESET_GUARD");
    EXPECT_FALSE(at.found);
  }
  {
    // A directory is not a worker.
    scoped_env worker("CUBRIDGE_SANDBOX_WORKER", "/tmp");
    EXPECT_FALSE(cubridge::locate(helper_file::sandbox_worker).found);
  }
}

TEST(Installation, WithoutTheEnvironmentItLooksFromTheCode) {
  scoped_env worker("CUBRIDGE_SANDBOX_WORKER", nullptr);
  scoped_env guard("CUBRIDGE_RESET_GUARD", nullptr);
  scoped_env entry("CUBRIDGE_PROBATION_ENTRY", nullptr);
  for (const auto which :
       {helper_file::sandbox_worker, helper_file::reset_guard, helper_file::probation_entry}) {
    const auto at = cubridge::locate(which);
    const auto name = std::string(cubridge::to_string(which));
    EXPECT_FALSE(at.path.empty()) << name;
    EXPECT_NE(at.found_by, "CUBRIDGE_SANDBOX_WORKER") << name;
    EXPECT_NE(at.found_by, "CUBRIDGE_RESET_GUARD") << name;
    EXPECT_NE(at.found_by, "CUBRIDGE_PROBATION_ENTRY") << name;
    if (!at.found) {
      EXPECT_EQ(at.found_by, "the configured prefix") << name;  // the last place looked
    }
  }
  EXPECT_EQ(cubridge::locate(helper_file::sandbox_worker).path.filename(),
            "cubridge-sandbox-worker");
  EXPECT_EQ(cubridge::locate(helper_file::reset_guard).path.filename(),
            "libcubridge_reset_guard.so");
  EXPECT_EQ(cubridge::locate(helper_file::probation_entry).path.filename(),
            "libcubridge_probation_entry.so");
}

TEST(Installation, EveryHelperFileHasItsName) {
  EXPECT_EQ(cubridge::to_string(helper_file::sandbox_worker), "sandbox_worker");
  EXPECT_EQ(cubridge::to_string(helper_file::reset_guard), "reset_guard");
  EXPECT_EQ(cubridge::to_string(helper_file::probation_entry), "probation_entry");
}

TEST(ResetGuardStatus, NotLoadedAndNotAskedFor) {
  scoped_env preload("LD_PRELOAD", nullptr);
  scoped_env policy("CUBRIDGE_RESET_POLICY", nullptr);
  const auto s = cubridge::reset_guard_state();
  EXPECT_FALSE(s.loaded);
  EXPECT_TRUE(s.requested_by.empty());
  EXPECT_FALSE(s.missing());
}

TEST(ResetGuardStatus, AskedForAndNotLoadedIsMissing) {
  {
    // What ld.so ignored: a bare name it could not find.
    scoped_env preload("LD_PRELOAD", "libcubridge_reset_guard.so");
    const auto s = cubridge::reset_guard_state();
    EXPECT_FALSE(s.loaded);
    EXPECT_EQ(s.requested_by, "LD_PRELOAD=libcubridge_reset_guard.so");
    EXPECT_TRUE(s.missing());
  }
  {
    scoped_env preload("LD_PRELOAD", nullptr);
    scoped_env policy("CUBRIDGE_RESET_POLICY", "deny");
    const auto s = cubridge::reset_guard_state();
    EXPECT_EQ(s.requested_by, "CUBRIDGE_RESET_POLICY=deny");
    EXPECT_TRUE(s.missing());
  }
}

TEST(ResetGuardStatus, RequiringItSaysHowToLoadIt) {
  scoped_env preload("LD_PRELOAD", "libcubridge_reset_guard.so");
  try {
    cubridge::require_reset_guard();
    FAIL() << "require_reset_guard() passed without the guard";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find("not loaded"), std::string::npos) << what;
    EXPECT_NE(what.find("LD_PRELOAD=libcubridge_reset_guard.so asks for it"), std::string::npos)
        << what;
    EXPECT_NE(what.find("cubridge guard -- PROGRAM"), std::string::npos) << what;
  }
}

}  // namespace
