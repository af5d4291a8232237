// SPDX-License-Identifier: Apache-2.0
// StallWatch: the words ranks say on the presence channel, and which ranks a waiting rank names.
#include "core/stall_watch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hora {
namespace {

// Every rank's latest word, in memory: what the MPI and store channels carry between processes.
struct Board {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::string failed;  // the declared failure: the first declaration wins
};

class BoardPresence final : public Presence {
 public:
  BoardPresence(Board &board, int rank) : board_(board), rank_(rank) {}
  void publish(const std::string &line) override {
    std::lock_guard<std::mutex> lock(board_.mutex);
    board_.lines[static_cast<size_t>(rank_)] = line;
  }
  std::vector<std::string> collect() override {
    std::lock_guard<std::mutex> lock(board_.mutex);
    return board_.lines;
  }
  void declareFailure(const std::string &line) override {
    std::lock_guard<std::mutex> lock(board_.mutex);
    if (board_.failed.empty()) board_.failed = line;
  }
  std::string declaredFailure() override {
    std::lock_guard<std::mutex> lock(board_.mutex);
    return board_.failed;
  }

 private:
  Board &board_;
  int rank_;
};

int64_t wallMsNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST(StallWatch, WireFormRoundTripsAndRejectsGarbage) {
  StallWatch::State s;
  s.wallMs = 1234567;
  s.cycle = 42;
  s.phase = 'r';
  s.seq = 17;
  s.forS = 2.5;
  s.what = "allreduce 'a\tb'";  // a tab in a name must not split the line
  s.last = "broadcast 'w' #16";
  StallWatch::State back;
  ASSERT_TRUE(StallWatch::decode(StallWatch::encode(s), &back));
  EXPECT_EQ(back.wallMs, 1234567);
  EXPECT_EQ(back.cycle, 42);
  EXPECT_EQ(back.phase, 'r');
  EXPECT_EQ(back.seq, 17);
  EXPECT_DOUBLE_EQ(back.forS, 2.5);
  EXPECT_EQ(back.what, "allreduce 'a b'");
  EXPECT_EQ(back.last, "broadcast 'w' #16");
  s.last.clear();  // an empty last field still decodes
  ASSERT_TRUE(StallWatch::decode(StallWatch::encode(s), &back));
  EXPECT_EQ(back.last, "");
  EXPECT_FALSE(StallWatch::decode("", &back));
  EXPECT_FALSE(StallWatch::decode("1\t2\tn", &back));
  EXPECT_FALSE(StallWatch::decode("1\t2\tnn\t4\t5\t6\t7", &back));
}

TEST(StallWatch, TogetherMeansSameCycleSamePhaseSameOperation) {
  StallWatch::State mine, peer;
  mine.cycle = peer.cycle = 7;
  mine.phase = peer.phase = 'n';
  EXPECT_TRUE(StallWatch::together(peer, mine));
  peer.cycle = 6;
  EXPECT_FALSE(StallWatch::together(peer, mine));
  peer.cycle = 7;
  peer.phase = 'i';
  EXPECT_FALSE(StallWatch::together(peer, mine));
  mine.phase = peer.phase = 'r';
  mine.seq = 3;
  peer.seq = 4;
  EXPECT_FALSE(StallWatch::together(peer, mine));
  peer.seq = 3;
  EXPECT_TRUE(StallWatch::together(peer, mine));
}

TEST(StallWatch, DescribesSilentIdleBehindAndUnknownPeers) {
  const int64_t now = wallMsNow();
  StallWatch::State mine;
  mine.cycle = 10;
  mine.phase = 'n';
  StallWatch::State peer;
  peer.wallMs = now - 5000;
  peer.cycle = 9;
  peer.phase = 'n';
  peer.last = "allreduce 'g' #20";
  const std::string silent = StallWatch::describe(1, &peer, mine, now, 2.0);
  EXPECT_NE(silent.find("rank 1 (silent for 5.0 s: stopped, hung or dead"), std::string::npos) << silent;
  EXPECT_NE(silent.find("last seen negotiating cycle 9"), std::string::npos) << silent;
  EXPECT_NE(silent.find("last completed allreduce 'g' #20"), std::string::npos) << silent;
  peer.wallMs = now;
  const std::string behind = StallWatch::describe(1, &peer, mine, now, 2.0);
  EXPECT_NE(behind.find("alive, negotiating cycle 9, behind"), std::string::npos) << behind;
  peer.phase = 'i';
  const std::string idle = StallWatch::describe(2, &peer, mine, now, 2.0);
  EXPECT_NE(idle.find("rank 2 (alive, idle after cycle 9: has not submitted"), std::string::npos) << idle;
  const std::string never = StallWatch::describe(3, nullptr, mine, now, 2.0);
  EXPECT_NE(never.find("rank 3 (never heard from"), std::string::npos) << never;
}

// Ranks 0 and 2 wait in the same negotiation; rank 1 last said it was idle, long ago: only rank 1
// is named, as silent, with the last operation it completed; rank 3 never said anything.
TEST(StallWatch, MissingNamesOnlyTheRanksNotWhereThisOneWaits) {
  Board board;
  board.lines.resize(4);
  BoardPresence p0(board, 0), p2(board, 2);
  StallWatch w0(0, 0, 4, &p0, /*warnS=*/0.2, /*timeoutS=*/5);
  StallWatch w2(0, 2, 4, &p2, 0.2, 5);
  for (StallWatch *w : {&w0, &w2}) {
    w->negotiating(1);
    w->running("allreduce", "grad", 1);
    w->completed("allreduce", "grad", 1);
    w->negotiating(2);
  }
  StallWatch::State old;
  old.wallMs = wallMsNow() - 10000;
  old.cycle = 1;
  old.phase = 'i';
  old.last = "allreduce 'grad' #1";
  {
    std::lock_guard<std::mutex> lock(board.mutex);
    board.lines[1] = StallWatch::encode(old);
  }
  // Both watches say where they are within a few ticks (0.05 s each here).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    std::string said;
    {
      std::lock_guard<std::mutex> lock(board.mutex);
      said = board.lines[2];
    }
    StallWatch::State s;
    if (StallWatch::decode(said, &s) && s.cycle == 2 && s.phase == 'n') break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "rank 2 never said where it is";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string who = w0.missing();
  EXPECT_NE(who.find("rank 1 (silent for"), std::string::npos) << who;
  EXPECT_NE(who.find("last completed allreduce 'grad' #1"), std::string::npos) << who;
  EXPECT_NE(who.find("rank 3 (never heard from"), std::string::npos) << who;
  EXPECT_EQ(who.find("rank 2"), std::string::npos) << who;
  EXPECT_EQ(who.find("rank 0"), std::string::npos) << who;
}

TEST(StallWatch, AFailureIsDeclaredOnceAndEveryOtherRankHearsIt) {
  Board board;
  board.lines.resize(3);
  BoardPresence p0(board, 0), p1(board, 1), p2(board, 2);
  std::mutex mutex;  // guards heard
  std::vector<std::pair<int, std::string>> heard;  // (listener, "rank: what")
  auto listener = [&](int me) {
    return [&, me](int rank, const std::string &what) {
      std::lock_guard<std::mutex> lock(mutex);
      heard.push_back({me, std::to_string(rank) + ": " + what});
    };
  };
  StallWatch w0(0, 0, 3, &p0, 0.2, 5, listener(0));
  StallWatch w1(0, 1, 3, &p1, 0.2, 5, listener(1));
  StallWatch w2(0, 2, 3, &p2, 0.2, 5, listener(2));
  w1.failed("lost rank 3 (pid 42, exited)");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (heard.size() == 2) break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "not every rank heard of it";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // A later failure does not replace the first, and nobody hears twice.
  w2.failed("a later failure of its own");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a few more ticks
  {
    std::lock_guard<std::mutex> lock(mutex);
    ASSERT_EQ(heard.size(), 2u);
    std::sort(heard.begin(), heard.end());
    EXPECT_EQ(heard[0], std::make_pair(0, std::string("1: lost rank 3 (pid 42, exited)")));
    EXPECT_EQ(heard[1], std::make_pair(2, std::string("1: lost rank 3 (pid 42, exited)")));
  }
  {
    std::lock_guard<std::mutex> lock(board.mutex);
    EXPECT_EQ(board.failed.rfind("1\t", 0), 0u) << board.failed;
  }
  // A rank that lost a peer names the earliest failure it finds.
  const std::string first = w0.firstFailure();
  EXPECT_EQ(first.rfind("rank 1 failed first, ", 0), 0u) << first;
  EXPECT_NE(first.find(": lost rank 3 (pid 42, exited)"), std::string::npos) << first;
}

TEST(StallWatch, DescribesAFormingAndAStoppedPeer) {
  StallWatch::State mine, forming, stopped;
  mine.wallMs = forming.wallMs = stopped.wallMs = 1000000;
  forming.phase = 'f';
  forming.what = "forming process set 3: connecting the gloo mesh";
  stopped.phase = 'x';
  stopped.what = "lost rank 3";
  // A forming rank says its phase once: its age is how long it is there, not silence.
  EXPECT_EQ(StallWatch::describe(1, &forming, mine, 1000000 + 30000, 2.0),
            "rank 1 (forming process set 3: connecting the gloo mesh, entered 30.0 s ago)");
  EXPECT_EQ(StallWatch::describe(2, &stopped, mine, 1000000 + 1500, 2.0),
            "rank 2 (stopped 1.5 s ago: lost rank 3)");
}

TEST(StallWatch, NoPresenceMeansNothingToName) {
  StallWatch w(0, 0, 2, nullptr, 0.2, 5);
  w.negotiating(1);
  EXPECT_EQ(w.missing(), "");
}

}  // namespace
}  // namespace hora
