// SPDX-License-Identifier: Apache-2.0
// Small helpers of the unit tests that write and read files (timeline, flight recorder).
#pragma once

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace hora {
namespace testing {

// The whole file as a string ("" if it cannot be read).
inline std::string slurp(const std::string &path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Occurrences of `what` in `text`.
inline size_t count(const std::string &text, const std::string &what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A path in /tmp of this test process: "/tmp/hora-test-<pid>-<leaf>".
inline std::string tempPath(const std::string &leaf) {
  return "/tmp/hora-test-" + std::to_string(getpid()) + "-" + leaf;
}

}  // namespace testing
}  // namespace hora
