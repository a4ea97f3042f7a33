// Tests of cubridge/update/state_location.hpp: the default replay state directory follows
// CUBRIDGE_STATE_DIR, then XDG_STATE_HOME, then HOME, and says so when none is set.
#include <cubridge/core/error.hpp>
#include <cubridge/update/state_location.hpp>

#include "scoped_env.hpp"

#include <gtest/gtest.h>

#include <string>

namespace {

using cubridge::default_state_directory;
using cubridge::testing::scoped_env;

TEST(UpdateStateLocation, CubridgeStateDirComesFirst) {
  scoped_env dir("CUBRIDGE_STATE_DIR", "/srv/filters/state");
  scoped_env xdg("XDG_STATE_HOME", "/home/u/.state");
  scoped_env home("HOME", "/home/u");
  EXPECT_EQ(default_state_directory(), "/srv/filters/state");
}

TEST(UpdateStateLocation, ThenXdgStateHome) {
  scoped_env dir("CUBRIDGE_STATE_DIR", "");  // empty counts as unset
  scoped_env xdg("XDG_STATE_HOME", "/home/u/.state");
  scoped_env home("HOME", "/home/u");
  EXPECT_EQ(default_state_directory(), "/home/u/.state/cubridge");
}

TEST(UpdateStateLocation, ThenHome) {
  scoped_env dir("CUBRIDGE_STATE_DIR", nullptr);
  scoped_env home("HOME", "/home/u");
  {
    scoped_env xdg("XDG_STATE_HOME", nullptr);
    EXPECT_EQ(default_state_directory(), "/home/u/.local/state/cubridge");
  }
  {
    scoped_env xdg("XDG_STATE_HOME", "");
    EXPECT_EQ(default_state_directory(), "/home/u/.local/state/cubridge");
  }
  {
    scoped_env xdg("XDG_STATE_HOME", "relative/state");  // ignored, as the XDG spec says
    EXPECT_EQ(default_state_directory(), "/home/u/.local/state/cubridge");
  }
}

TEST(UpdateStateLocation, NoneSetIsAPreconditionThatNamesTheWayOut) {
  scoped_env dir("CUBRIDGE_STATE_DIR", nullptr);
  scoped_env xdg("XDG_STATE_HOME", nullptr);
  scoped_env home("HOME", "");
  try {
    (void)default_state_directory();
    FAIL() << "a directory without any variable set";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
    const std::string what = e.what();
    for (const char* word : {"CUBRIDGE_STATE_DIR", "XDG_STATE_HOME", "HOME", "persist_state"})
      EXPECT_NE(what.find(word), std::string::npos) << word << " in " << what;
  }
}

}  // namespace
