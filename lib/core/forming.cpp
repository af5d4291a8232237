// SPDX-License-Identifier: Apache-2.0
// formingPhase: a phase's word on the presence channel, and the message when it fails.
#include "core/forming.h"

#include <unistd.h>

#include <chrono>

#include "base/error.h"
#include "base/process.h"
#include "core/stall_watch.h"

namespace hora {
namespace {

thread_local std::string tForming;

int64_t wallMsNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// At most this many peers are described one by one in a failure's message.
constexpr int kPeersNamed = 8;

}  // namespace

FormingScope::FormingScope(std::string set) : previous_(std::move(tForming)) {
  tForming = std::move(set);
}

FormingScope::~FormingScope() { tForming = std::move(previous_); }

const std::string &FormingScope::current() { return tForming; }

void formingPhase(Presence *presence, int rank, int size, const std::string &phase,
                  const std::function<void()> &body) {
  const std::string set = tForming.empty() ? std::string("a group") : tForming;
  StallWatch::State mine;
  mine.phase = 'f';
  mine.what = "forming " + set + ": " + phase;
  mine.pid = static_cast<long>(getpid());
  mine.host = hostName();
  const auto began = std::chrono::steady_clock::now();
  if (presence != nullptr && size > 1) {
    mine.wallMs = wallMsNow();
    try {
      presence->publish(StallWatch::encode(mine));
    } catch (const std::exception &) {
      presence = nullptr;  // the channel is gone: the phase's own wait will say so
    }
  }
  try {
    body();
  } catch (const Error &e) {
    std::string message = mine.what + ": " + e.message();
    if (presence != nullptr && size > 1) {
      std::vector<std::string> lines;
      try {
        lines = presence->collect();
      } catch (const std::exception &) {
      }
      const int64_t now = wallMsNow();
      mine.wallMs = now;
      mine.forS = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      std::string others;
      std::vector<int> here;  // in this same phase
      int named = 0, unnamed = 0;
      for (int r = 0; r < size && !lines.empty(); ++r) {
        if (r == rank) continue;
        StallWatch::State peer;
        const bool known = r < static_cast<int>(lines.size()) &&
                           StallWatch::decode(lines[static_cast<size_t>(r)], &peer);
        const bool exited = known && peer.pid > 0 && peer.host == mine.host && processGone(peer.pid);
        if (known && peer.phase == 'f' && peer.what == mine.what && !exited) {
          here.push_back(r);
          continue;
        }
        if (named == kPeersNamed) {
          ++unnamed;
          continue;
        }
        ++named;
        // A peer that formed the group already and went quiet is not silent in the stall
        // watch's sense until its channel's tick has passed many times over.
        others += (others.empty() ? "" : "; ") +
                  StallWatch::describe(r, known ? &peer : nullptr, mine, now, 10.0);
      }
      if (!lines.empty()) {
        if (unnamed > 0) others += detail::concat("; ", unnamed, " more");
        if (!here.empty()) {
          std::string list;
          for (int r : here) list += (list.empty() ? "" : ",") + std::to_string(r);
          others += detail::concat(others.empty() ? "" : "; ", here.size() == 1 ? "rank " : "ranks ",
                                   list, here.size() == 1 ? " is" : " are", " in this phase too");
        }
        if (!others.empty()) message += "; the other ranks: " + others;
      }
    }
    throw Error(e.status(), message, __FILE__, __LINE__);
  }
}

}  // namespace hora
