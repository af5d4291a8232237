// SPDX-License-Identifier: Apache-2.0
// HORA_TEST_AT: test-only pauses and kills at named points.
#include "base/test_points.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/knobs.h"
#include "base/logging.h"

namespace hora {
namespace {

struct Action {
  std::string point;
  int rank = -1;  // -1: every rank
  bool kill = false;
  int sleepMs = 0;
};

std::vector<Action> parse(const std::string &text) {
  std::vector<Action> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    start = end + 1;
    const size_t at = item.find('@'), colon = item.find(':');
    Action a;
    bool ok = at != std::string::npos && colon != std::string::npos && at < colon && at > 0;
    if (ok) {
      a.point = item.substr(0, at);
      const std::string rank = item.substr(at + 1, colon - at - 1);
      const std::string action = item.substr(colon + 1);
      if (rank == "*") {
        a.rank = -1;
      } else {
        char *stop = nullptr;
        a.rank = static_cast<int>(std::strtol(rank.c_str(), &stop, 10));
        ok = !rank.empty() && *stop == '\0' && a.rank >= 0;
      }
      if (action == "kill") {
        a.kill = true;
      } else if (action.rfind("sleep=", 0) == 0) {
        char *stop = nullptr;
        a.sleepMs = static_cast<int>(std::strtol(action.c_str() + 6, &stop, 10));
        ok = ok && *stop == '\0' && a.sleepMs >= 0;
      } else {
        ok = false;
      }
    }
    if (ok) {
      out.push_back(a);
    } else if (!item.empty()) {
      HORA_LOG(kWarning) << "HORA_TEST_AT: ignoring '" << item
                         << "' (expected point@rank:sleep=MS or point@rank:kill)";
    }
  }
  return out;
}

const std::vector<Action> &actions() {
  static const std::vector<Action> *all = [] {
    const char *text = environmentValue("HORA_TEST_AT");
    return new std::vector<Action>(text != nullptr ? parse(text) : std::vector<Action>{});
  }();
  return *all;
}

}  // namespace

void testPoint(const char *point, int rank) {
  for (const Action &a : actions()) {
    if (a.point != point || (a.rank >= 0 && a.rank != rank)) continue;
    if (a.kill) {
      HORA_LOG(kWarning) << "HORA_TEST_AT: rank " << rank << " killed at " << point;
      kill(getpid(), SIGKILL);
    }
    HORA_LOG(kInfo) << "HORA_TEST_AT: rank " << rank << " sleeps " << a.sleepMs << " ms at "
                    << point;
    std::this_thread::sleep_for(std::chrono::milliseconds(a.sleepMs));
  }
}

}  // namespace hora
