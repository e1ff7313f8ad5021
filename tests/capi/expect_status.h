// What the C API tests check of a call's result: its status and the thread's message
// (exactcoll_last_error), or a text's part.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "exactcoll/exactcoll.h"

namespace exactcoll::capitest {

inline std::string last_error() { return exactcoll_last_error(); }

// Expects `text` to contain `part`, showing both when it does not.
inline void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << text << "' lacks '" << part << "'";
}

// Expects `status` to be `expected` and the thread's message to contain `part`.
inline void expect_error(int status, int expected, const std::string& part) {
  EXPECT_EQ(status, expected) << exactcoll_status_name(status) << ": " << last_error();
  expect_contains(last_error(), part);
}

}  // namespace exactcoll::capitest
