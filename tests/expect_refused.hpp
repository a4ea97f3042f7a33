#pragma once
// EXPECT_REFUSED(statement, reason): `statement` must throw cubridge::bundle_error with that
// bundle_reason (bundles, keys and signed rollback requests share the error type).
#include <cubridge/bundle/bundle.hpp>

#include <gtest/gtest.h>

#define EXPECT_REFUSED(statement, expected)                                                     \
  do {                                                                                          \
    try {                                                                                       \
      (void)(statement);                                                                        \
      ADD_FAILURE() << #statement " did not throw; expected " << cubridge::to_string(expected); \
    } catch (const cubridge::bundle_error& e_) {                                                \
      EXPECT_EQ(e_.reason(), expected)                                                          \
          << "got " << cubridge::to_string(e_.reason()) << ": " << e_.what();                   \
    }                                                                                           \
  } while (false)
