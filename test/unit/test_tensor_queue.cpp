// SPDX-License-Identifier: Apache-2.0
// The tensor queue: duplicate names, wake-ups (its condition variable and the backend's bell),
// batching window, flush and close.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "core/tensor_queue.h"
#include "time_scale.h"

namespace hora {
namespace {

using namespace std::chrono;

// The engine thread's step: wait for work, then take the queue.
std::vector<RequestPtr> waitAndPop(TensorQueue &q, bool busy, steady_clock::time_point busyDeadline,
                                   nanoseconds batchWindow) {
  q.waitForWork(busy, busyDeadline, batchWindow);
  std::vector<RequestPtr> out;
  q.popAll(out);
  return out;
}

RequestPtr req(const std::string &name, int32_t set = 0) {
  RequestMsg m;
  m.name = name;
  m.shapes = {{1}};
  return std::make_shared<Request>(m, set, std::vector<TensorArg>{});
}

TEST(TensorQueue, DuplicateNameInFlightIsRefusedUntilReleased) {
  TensorQueue q;
  q.push(req("a"));
  try {
    q.push(req("a"));
    FAIL() << "duplicate accepted";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_DUPLICATE_NAME);
    EXPECT_NE(e.message().find("'a'"), std::string::npos);
  }
  q.push(req("b"));
  auto got = waitAndPop(q, false, steady_clock::now(), nanoseconds(0));
  EXPECT_EQ(got.size(), 2u);
  EXPECT_THROW(q.push(req("a")), Error);  // popped but still in flight
  q.release({"a"});
  EXPECT_THROW(q.push(req("b")), Error);  // only the released name is free
  EXPECT_NO_THROW(q.push(req("a")));
}

RequestPtr tomb(const std::string &name) {
  RequestMsg m;
  m.name = name;
  m.rejected = "refused here";
  return std::make_shared<Request>(m, 0, std::vector<TensorArg>{});
}

// Behind a tombstone (this rank refused the name and told the others), later requests of the
// name wait, in order: tombstones, then one real request, which is queued once the ones ahead of
// it are released. A real request of the name ahead of them is still a duplicate.
TEST(TensorQueue, RequestsOfARefusedNameWaitBehindItInOrder) {
  TensorQueue q;
  q.push(tomb("a"));
  RequestPtr again = tomb("a"), real = req("a");
  q.push(again);
  q.push(real);
  EXPECT_THROW(q.push(req("a")), Error) << "two real requests of one name";
  try {
    q.push(tomb("a"));
    FAIL() << "a tombstone behind a real request accepted";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_DUPLICATE_NAME);
    EXPECT_NE(e.message().find("behind a refused call"), std::string::npos) << e.message();
  }
  auto got = waitAndPop(q, false, steady_clock::now(), nanoseconds(0));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0]->msg().isTombstone());
  std::thread engine([&] {  // woken by the release below, with the next one queued
    auto next = waitAndPop(q, false, steady_clock::now(), nanoseconds(0));
    ASSERT_EQ(next.size(), 1u);
    EXPECT_EQ(next[0], again);
  });
  std::this_thread::sleep_for(milliseconds(20));
  q.release({got[0]->name()});
  engine.join();
  q.release({again->name()});
  got = waitAndPop(q, false, steady_clock::now(), nanoseconds(0));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], real);
  EXPECT_THROW(q.push(req("a")), Error) << "the real one is in flight now";
  q.release({real->name()});
  EXPECT_NO_THROW(q.push(req("a")));
  // A real request ahead: the tombstone is a duplicate like any other.
  EXPECT_THROW(q.push(tomb("a")), Error);
  // Close hands back the waiting ones too.
  q.push(tomb("b"));
  q.push(req("b"));
  EXPECT_EQ(q.close(Status{HORA_ERR_SHUT_DOWN, "bye"}).size(), 3u);
}

TEST(TensorQueue, IdleWaitWakesOnPush) {
  TensorQueue q;
  std::thread producer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    q.push(req("x"));
  });
  const auto t0 = steady_clock::now();
  auto got = waitAndPop(q, false, steady_clock::now(), nanoseconds(0));
  producer.join();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_GE(steady_clock::now() - t0, milliseconds(40));
}

TEST(TensorQueue, BusyWaitEndsAtTheDeadline) {
  TensorQueue q;
  auto got = waitAndPop(q, true, steady_clock::now() + milliseconds(20), nanoseconds(0));
  EXPECT_TRUE(got.empty());
}

TEST(TensorQueue, BatchWindowCollectsLaterArrivalsAndFlushEndsIt) {
  TensorQueue q;
  q.push(req("a"));
  std::thread producer([&] {
    std::this_thread::sleep_for(milliseconds(10));
    q.push(req("b"));
  });
  auto got = waitAndPop(q, false, steady_clock::now(), hora_test::scaled(0.2));
  producer.join();
  EXPECT_EQ(got.size(), 2u);

  q.push(req("c"));
  std::thread flusher([&] {
    std::this_thread::sleep_for(milliseconds(10));
    q.requestFlush();
  });
  const auto t0 = steady_clock::now();
  got = waitAndPop(q, false, steady_clock::now(), hora_test::scaled(30));
  flusher.join();
  EXPECT_EQ(got.size(), 1u);
  EXPECT_LT(steady_clock::now() - t0, hora_test::scaled(10));
}

// A caller thread that runs the cycle itself takes the queue while the engine thread waits out
// the batch window: the window then runs from the oldest request queued after that, and with the
// queue taken and nothing new the engine thread goes on waiting instead of running an empty cycle.
TEST(TensorQueue, WindowRestartsFromRequestsQueuedAfterACallerTookTheQueue) {
  TensorQueue q;
  std::atomic<bool> returned{false};
  steady_clock::time_point secondPushed;
  std::thread engine([&] {
    q.waitForWork(false, steady_clock::now(), milliseconds(200));
    returned = true;
  });
  q.push(req("a"));
  std::this_thread::sleep_for(milliseconds(50));
  std::vector<RequestPtr> taken;
  q.popAll(taken);  // the caller's cycle
  ASSERT_EQ(taken.size(), 1u);
  std::this_thread::sleep_for(milliseconds(250));  // past a's window
  EXPECT_FALSE(returned) << "woke for an empty queue";
  secondPushed = steady_clock::now();
  q.push(req("b"));
  engine.join();
  EXPECT_GE(steady_clock::now() - secondPushed, milliseconds(190)) << "b's window was cut short";
  q.popAll(taken);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0]->name(), "b");
}

TEST(TensorQueue, KickWakesAnIdleEngineWithNothingQueued) {
  TensorQueue q;
  std::thread kicker([&] {
    std::this_thread::sleep_for(milliseconds(20));
    q.kick();
  });
  const auto t0 = steady_clock::now();
  q.waitForWork(false, steady_clock::now(), milliseconds(200));
  kicker.join();
  EXPECT_LT(steady_clock::now() - t0, hora_test::scaled(10));
  std::vector<RequestPtr> taken;
  q.popAll(taken);
  EXPECT_TRUE(taken.empty());
  // A kick is used up by the wait it ended: the next one waits again (here until its deadline).
  const auto t1 = steady_clock::now();
  q.waitForWork(true, t1 + milliseconds(20), nanoseconds(0));
  EXPECT_GE(steady_clock::now() - t1, milliseconds(19));
}

// A bell that records what the queue does with it; sleep() blocks on a condition variable until
// rung (a ring that came after arm() ends it at once, as a futex with a stale ticket would).
class FakeBell final : public PeerBell {
 public:
  bool arm(uint32_t *ticket) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++arms;
    *ticket = rings_;
    return !peerAhead;
  }
  void sleep(uint32_t ticket, std::chrono::nanoseconds limit) override {
    std::unique_lock<std::mutex> lock(mutex_);
    ++sleeps;
    cv_.wait_for(lock, limit, [&] { return rings_ != ticket; });
  }
  void ring() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++rings_;
    }
    cv_.notify_all();
  }
  uint32_t rings() {
    std::lock_guard<std::mutex> lock(mutex_);
    return rings_;
  }
  std::atomic<int> arms{0}, sleeps{0};
  std::atomic<bool> peerAhead{false};

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  uint32_t rings_ = 0;
};

TEST(TensorQueue, ABusyEngineSleepsOnTheBellAndAPushRingsIt) {
  TensorQueue q;
  FakeBell bell;
  q.setBell(&bell);
  std::thread producer([&] {
    while (bell.sleeps.load() == 0) std::this_thread::yield();  // the engine is on the bell
    q.push(req("x"));
  });
  const auto t0 = steady_clock::now();
  auto got = waitAndPop(q, true, steady_clock::now() + hora_test::scaled(30), nanoseconds(0));
  producer.join();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_LT(steady_clock::now() - t0, hora_test::scaled(10)) << "the push did not ring the bell";
  EXPECT_EQ(bell.rings(), 1u);
  // Not sleeping on it: pushes and shutdown leave the bell alone.
  q.push(req("y"));
  q.requestShutdown();
  EXPECT_EQ(bell.rings(), 1u);
  q.setBell(nullptr);
}

TEST(TensorQueue, ShutdownRingsTheBellAndAPeerAheadMeansNoSleep) {
  TensorQueue q;
  FakeBell bell;
  q.setBell(&bell);
  std::thread stopper([&] {
    while (bell.sleeps.load() == 0) std::this_thread::yield();
    q.requestShutdown();
  });
  auto got = waitAndPop(q, true, steady_clock::now() + hora_test::scaled(30), nanoseconds(0));
  stopper.join();
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(bell.rings(), 1u);

  TensorQueue q2;
  FakeBell ahead;
  ahead.peerAhead = true;  // a peer already started the next cycle: go and join it
  q2.setBell(&ahead);
  const auto t0 = steady_clock::now();
  got = waitAndPop(q2, true, steady_clock::now() + hora_test::scaled(30), nanoseconds(0));
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(ahead.arms.load(), 1);
  EXPECT_EQ(ahead.sleeps.load(), 0);
  EXPECT_LT(steady_clock::now() - t0, hora_test::scaled(10));
  q2.setBell(nullptr);
}

TEST(TensorQueue, ShutdownWakesAndCloseRefusesWithItsStatus) {
  TensorQueue q;
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(10));
    q.requestShutdown();
  });
  auto got = waitAndPop(q, false, steady_clock::now(), nanoseconds(0));
  stopper.join();
  EXPECT_TRUE(got.empty());
  EXPECT_TRUE(q.shutdownRequested());
  q.push(req("late"));
  auto left = q.close(Status{HORA_ERR_SHUT_DOWN, "stopped"});
  EXPECT_EQ(left.size(), 1u);
  try {
    q.push(req("after"));
    FAIL() << "push after close accepted";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_SHUT_DOWN);
  }
}

}  // namespace
}  // namespace hora
