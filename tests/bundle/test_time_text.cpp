// The signed records' time form (bundle.hpp's detail::format_time / parse_time): RFC 3339 UTC in
// whole seconds, one spelling per time.
#include <cubridge/bundle/bundle.hpp>

#include <gtest/gtest.h>

#include <chrono>

namespace {

using namespace std::chrono;
using cubridge::detail::format_time;
using cubridge::detail::parse_time;

TEST(TimeText, FormatsAndParsesTheCanonicalSpelling) {
  const sys_seconds t = sys_days{2027y / January / 31} + 23h + 59min + 58s;
  EXPECT_EQ(format_time(t), "2027-01-31T23:59:58Z");
  EXPECT_EQ(parse_time("2027-01-31T23:59:58Z"), t);
  EXPECT_EQ(parse_time("1970-01-01T00:00:00Z"), sys_seconds{});
  EXPECT_EQ(parse_time("2028-02-29T12:00:00Z"), sys_days{2028y / February / 29} + 12h);
}

TEST(TimeText, RefusesEveryOtherSpelling) {
  for (const char* text : {
           "",                           // nothing
           "2027-01-31",                 // a date alone
           "2027-01-31T23:59:58",        // no zone
           "2027-01-31T23:59:58z",       // lower-case zone
           "2027-01-31T23:59:58+00:00",  // an offset, even UTC's
           "2027-01-31T23:59:58.5Z",     // fractions
           "2027-01-31 23:59:58Z",       // a space for the T
           "2027-1-31T23:59:58Z",        // short fields
           "2027-01-31T3:59:58Z",
           "+2027-01-31T23:59:58Z",     // a sign
           "2027-01-31T23:59:58Zjunk",  // anything after
           "2027-02-30T00:00:00Z",      // no such day
           "2027-02-29T00:00:00Z",      // not a leap year
           "2027-13-01T00:00:00Z",      // no such month
           "2027-01-31T24:00:00Z",      // no such hour
           "2027-01-31T23:60:00Z",
           "2027-01-31T23:59:60Z",  // leap seconds are not written
       })
    EXPECT_EQ(parse_time(text), std::nullopt) << text;
}

TEST(TimeText, EveryFormattedTimeParsesBack) {
  for (sys_seconds t = sys_days{1999y / December / 31}; t < sys_days{2000y / March / 2};
       t += 3h + 7min + 11s)
    EXPECT_EQ(parse_time(format_time(t)), t) << format_time(t);
}

}  // namespace
