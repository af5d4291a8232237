// SPDX-License-Identifier: Apache-2.0
// A process set's watchdog: says, through the group's Presence, what this rank is doing, and when
// this rank has waited in one negotiation or operation longer than HORA_STALL_WARNING_S, prints
// which ranks have not taken part and the last operation each of them completed. The same words
// name the missing ranks in a timeout's message (missing()).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/world.h"

namespace hora {

class StallWatch {
 public:
  // `presence` may be null (the group has no side channel): reports then say only how long this
  // rank has waited. warnS = 0 turns the reports off; missing() still works.
  // `peerFailed(rank, what)`: called once, from the watch's thread, when another rank of the set
  // declared that it stopped for a failure (failed() there): the set is to stop here too, at
  // once, rather than when one of its waits runs into the hole. Must not wait for the watch.
  StallWatch(int32_t set, int rank, int size, Presence *presence, double warnS, double timeoutS,
             std::function<void(int, const std::string &)> peerFailed = nullptr);
  ~StallWatch();  // stops the thread
  StallWatch(const StallWatch &) = delete;
  StallWatch &operator=(const StallWatch &) = delete;

  // Called by whichever thread runs the set's cycles. Cheap: an uncontended lock and a copy.
  void negotiating(int64_t cycle);  // entering the cycle-th negotiation (the same on every rank)
  void running(const char *op, std::string_view name, int64_t seq);  // the seq-th operation
  void completed(const char *op, std::string_view name, int64_t seq);
  void idle();  // between cycles
  // The set stopped on this rank for `why` (not a shutdown): said on the presence channel at
  // once (the thread's next turn, and before the watch is destroyed), so that a peer whose wait
  // on this rank fails next can name the first failure rather than this rank.
  void failed(const std::string &why);

  // Any thread: every live watch of this process looks for a SIGUSR1 request at once instead of
  // at its next tick (the flight recorder's signal thread calls it).
  static void wakeAll();

  // For a timeout's message: "rank 1 (silent for 4.2 s: stopped, hung or dead; last completed
  // allreduce 'grad' #20)", one entry per rank not where this one waits; empty if unknown.
  std::string missing();
  // For a wait the presence channel cannot end by itself (a device op: NCCL's kernels wait for a
  // peer on the GPU): "rank 1 (pid 4242 on this host) exited" for a peer on this host whose
  // process is gone, else "". Any thread; collects the peers' words (the channel's cost).
  std::string lostPeer();
  // For a failure's message: "rank 2 failed first, 0.3 s before this rank: lost rank 1 of 4
  // (pid 123, exited)", the earliest peer that said it failed (failed()), or "".
  std::string firstFailure();
  // Why the presence channel stopped working ("the store at ... did not answer ... (the store
  // is served by rank 0 at ...)"), or "" while it works.
  std::string presenceLost();

  // The wire form of a rank's state (tab-separated), exposed for tests.
  struct State {
    int64_t wallMs = 0;  // when it was said, wall clock (ranks on other hosts: NTP's accuracy)
    int64_t cycle = 0;
    char phase = 'i';    // 'i' idle, 'n' negotiating, 'r' running an operation, 'f' forming,
                         // 'x' stopped by a failure (what: why)
    int64_t seq = 0;     // the operation running ('r')
    double forS = 0;     // how long in this phase
    std::string what;    // the operation running, "allreduce 'grad'"
    std::string last;    // the last operation completed, "allreduce 'grad' #20", or ""
    long pid = 0;        // the rank's process and host (older peers: 0 and "")
    std::string host;
  };
  static std::string encode(const State &s);
  static bool decode(const std::string &line, State *s);
  // One peer's entry for a report, as seen by a rank in `mine`, `now` (wall ms).
  static std::string describe(int rank, const State *peer, const State &mine, int64_t nowMs,
                              double silentS);
  // Whether a peer's state is where this rank waits (so it is taking part).
  static bool together(const State &peer, const State &mine);

 private:
  using Clock = std::chrono::steady_clock;
  void loop();
  State snapshot();
  // Every rank's latest word now (true), or, when the channel is busy past kPresenceWait or
  // fails, what the thread collected last (false). Needs presence_.
  bool collectNow(std::vector<std::string> *lines);
  // The ranks not where this one waits, each described; "" if every rank is. Needs presence_.
  std::string absentees(const State &mine, std::vector<std::string> *lines);

  const int32_t set_;
  const int rank_;
  const int size_;
  Presence *const presence_;
  const double warnS_;
  const double tickS_;  // between two words on the presence channel

  std::mutex mutex_;  // guards the state below and stop_
  int64_t cycle_ = 0;
  char phase_ = 'i';
  int64_t seq_ = 0;
  std::string what_;
  std::string last_;
  Clock::time_point since_ = Clock::now();
  bool stop_ = false;
  bool failurePending_ = false;  // failed() was called and its word is not out yet
  const std::function<void(int, const std::string &)> peerFailed_;
  bool peerFailureSeen_ = false;  // the watch thread's: peerFailed_ was called
  bool woken_ = false;           // wakeAll(): look at the SIGUSR1 requests now
  uint32_t reportsSeen_ = 0;     // SIGUSR1 requests answered (stallReportRequests())
  std::string presenceLost_;     // why the presence channel stopped working (under mutex_)
  std::condition_variable wake_;

  std::vector<std::string> lastLines_;  // what the thread collected last (under mutex_)
  std::string host_;  // this host's name, as peers compare it
  // One caller of presence_ at a time (the thread, or a failure's missing()/firstFailure(), which
  // wait for the thread's word in flight at most kPresenceWait: try_lock in a loop, since
  // ThreadSanitizer does not follow std::timed_mutex's timed lock).
  std::mutex presenceMutex_;
  static constexpr std::chrono::milliseconds kPresenceWait{1000};
  // firstFailure() looks this long for a peer's word that it failed (see there).
  static constexpr std::chrono::milliseconds kFailureWait{400};
  std::thread thread_;
};

}  // namespace hora
