// SPDX-License-Identifier: Apache-2.0
// One factor for every time limit in the tests: HORA_TEST_TIME_SCALE (default 1).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace hora_test {

// A loaded or slow machine (CI sharing its cores, a sanitizer build) stretches how long correct
// work takes; it never changes what the work must produce. So every limit a test waits up to (a
// watchdog, a deadline for a completion, hora's own HORA_TIMEOUT_S in a test job) is written for a
// quiet machine and multiplied by this factor; tools/run_tests.sh gives meson the same factor for
// its per-test timeouts. Lower bounds (a sleep lasted at least its length) are never scaled.
inline double timeScale() {
  static const double scale = [] {
    const char *s = std::getenv("HORA_TEST_TIME_SCALE");
    if (s == nullptr || *s == '\0') return 1.0;
    char *end = nullptr;
    const double v = std::strtod(s, &end);
    if (end == s || *end != '\0' || !(v >= 1.0)) {
      std::fprintf(stderr, "HORA_TEST_TIME_SCALE=%s: want a number >= 1; using 1\n", s);
      return 1.0;
    }
    return v;
  }();
  return scale;
}

// `seconds` on a quiet machine, stretched by the factor.
inline std::chrono::milliseconds scaled(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * timeScale() * 1000.0));
}

}  // namespace hora_test
