// The logger (core/log.hpp): levels, the threshold, the sink, the default line on stderr.
#include <cubridge/core/log.hpp>

#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <utility>
#include <vector>

namespace {

using cubridge::log::level;

/// Takes the sink and the threshold for one test and gives both back after it.
class Log : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_threshold_ = cubridge::log::threshold();
    saved_sink_ = cubridge::log::set_sink(
        [this](level l, std::string_view m) { lines_.emplace_back(l, std::string(m)); });
  }
  void TearDown() override {
    cubridge::log::set_sink(std::move(saved_sink_));
    cubridge::log::set_threshold(saved_threshold_);
  }
  std::vector<std::pair<level, std::string>> lines_;

 private:
  level saved_threshold_ = level::warn;
  cubridge::log::sink saved_sink_;
};

TEST(LogLevel, NamesAndParsesEveryLevel) {
  for (const level l :
       {level::trace, level::debug, level::info, level::warn, level::error, level::off})
    EXPECT_EQ(cubridge::log::parse_level(cubridge::log::name(l)), l);
  EXPECT_EQ(cubridge::log::parse_level("warning"), level::warn);
  EXPECT_EQ(cubridge::log::parse_level("WARN"), std::nullopt);  // as documented: lower case
  EXPECT_EQ(cubridge::log::parse_level(""), std::nullopt);
  EXPECT_EQ(cubridge::log::parse_level("verbose"), std::nullopt);
}

TEST_F(Log, WritesOnlyWhatPassesTheThreshold) {
  cubridge::log::set_threshold(level::info);
  cubridge::log::debug("not this");
  cubridge::log::info("this");
  cubridge::log::error("and this");
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_EQ(lines_[0], std::pair(level::info, std::string("this")));
  EXPECT_EQ(lines_[1], std::pair(level::error, std::string("and this")));
  EXPECT_FALSE(cubridge::log::enabled(level::debug));
  EXPECT_TRUE(cubridge::log::enabled(level::warn));
}

TEST_F(Log, OffWritesNothingNotEvenErrors) {
  cubridge::log::set_threshold(level::off);
  cubridge::log::error("nothing");
  cubridge::log::write(level::off, "nor this");
  EXPECT_TRUE(lines_.empty());
}

TEST_F(Log, ASinkThatThrowsLosesItsLineAndNothingElse) {
  cubridge::log::set_threshold(level::trace);
  cubridge::log::set_sink([](level, std::string_view) { throw std::runtime_error("full"); });
  EXPECT_NO_THROW(cubridge::log::warn("lost"));
}

TEST_F(Log, TheDefaultSinkWritesOneStampedLineToStderr) {
  cubridge::log::set_threshold(level::info);
  cubridge::log::set_sink({});  // the default again
  ::testing::internal::CaptureStderr();
  cubridge::log::info("module 'm' promoted");
  const std::string err = ::testing::internal::GetCapturedStderr();
  // An RFC 3339 time with milliseconds and the zone's offset, the level, the message.
  EXPECT_TRUE(std::regex_match(
      err, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d cubridge info: )"
                      R"(module 'm' promoted\n)")))
      << err;
}

}  // namespace
