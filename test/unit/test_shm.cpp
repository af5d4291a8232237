// SPDX-License-Identifier: Apache-2.0
// The intra-host path with ranks as threads of one process: its barrier (ordering, timeout, lost
// peer), the bell that wakes an idle engine, and its allreduce against results the test
// computes itself, with every rank describing the same vector through differently cut tensors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "backends/shm/shm_backend.h"
#include "backends/shm/shm_barrier.h"
#include "base/dtype.h"
#include "base/error.h"
#include "thread_group.h"
#include "time_scale.h"

namespace hora {
namespace {

using test::runRanks;
using test::ThreadControlPlane;
using test::ThreadGroup;

class ThreadRankGroup final : public Group {
 public:
  ThreadRankGroup(ThreadGroup &group, int rank) : plane_(group, rank) {}
  ControlPlane &control() override { return plane_; }
  void poison(int, const std::string &) override {}
  bool usesSockets() const override { return false; }

 private:
  ThreadControlPlane plane_;
};

// Stands in for MPI or Gloo: counts what reaches it.
class InnerBackend final : public Backend {
 public:
  const char *name() const override { return "inner"; }
  const BackendCaps &caps() const override {
    static const BackendCaps kCaps =
        BackendCaps::plain(/*usesSockets=*/true, BackendCaps::Scope::kAnyHost);
    return kCaps;
  }
  void allreduce(const void *, void *, int64_t, DType, ReduceOp) override { ++allreduces; }
  void broadcast(void *, int64_t, int) override { ++others; }
  void allgatherv(const void *, void *, const std::vector<int64_t> &) override { ++others; }
  void alltoallv(const void *, const std::vector<int64_t> &, void *,
                 const std::vector<int64_t> &) override {
    ++others;
  }
  void reducescatter(const void *, void *, const std::vector<int64_t> &, DType, ReduceOp) override {
    ++others;
  }
  int allreduces = 0;
  int others = 0;
};

std::unique_ptr<Backend> makeShm(ThreadGroup &tg, int rank, const Knobs &knobs, std::string *why,
                                 InnerBackend **inner = nullptr) {
  ThreadRankGroup group(tg, rank);
  auto backend = std::make_unique<InnerBackend>();
  if (inner != nullptr) *inner = backend.get();  // owned by the wrapper from here on
  return wrapWithShm(std::move(backend), group, knobs, why);
}

TEST(ShmBarrier, NobodyPassesBeforeEveryoneArrives) {
  constexpr int kRanks = 4, kRounds = 3000;
  auto state = std::make_unique<ShmBarrierState>();
  std::vector<int> pids(kRanks, getpid());
  std::vector<std::atomic<int>> cell(kRanks);
  std::atomic<int> bad{0};
  runRanks(kRanks, [&](int r) {
    ShmBarrier barrier(state.get(), r, pids, 30.0, true);
    for (int round = 1; round <= kRounds; ++round) {
      cell[static_cast<size_t>(r)].store(round);
      barrier.wait("test");
      for (int q = 0; q < kRanks; ++q) {
        if (cell[static_cast<size_t>(q)].load() != round) ++bad;
      }
      barrier.wait("test");
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(ShmBarrier, TimesOutNamingTheRankThatNeverCame) {
  auto state = std::make_unique<ShmBarrierState>();
  ShmBarrier barrier(state.get(), 0, {getpid(), getpid(), getpid()}, 0.3, false);
  state->reached[2].store(1);  // rank 2 arrived, rank 1 never does
  const auto start = std::chrono::steady_clock::now();
  try {
    barrier.wait("allreduce (test)");
    FAIL() << "the barrier returned without rank 1";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_TIMEOUT);
    EXPECT_NE(e.message().find("for ranks 1"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("allreduce (test)"), std::string::npos) << e.message();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, hora_test::scaled(5));
}

TEST(ShmBarrier, ALostPeerIsReportedAsSuch) {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: its pid now names no process
  auto state = std::make_unique<ShmBarrierState>();
  ShmBarrier barrier(state.get(), 0, {getpid(), child}, 60.0, false);
  try {
    barrier.wait("allreduce (test)");
    FAIL() << "the barrier returned without rank 1";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_PEER_LOST);
    EXPECT_NE(e.message().find("rank 1"), std::string::npos) << e.message();
  }
}

// The pipeline's point-to-point waits: awaitPeers returns once every other rank's counter has
// reached the value (its own is not looked at), and not before.
TEST(ShmBarrier, AwaitPeersReturnsOnlyOnceEveryPeerPublished) {
  constexpr int kRanks = 3, kRounds = 2000;
  auto state = std::make_unique<ShmBarrierState>();
  std::vector<int> pids(kRanks, getpid());
  std::vector<std::atomic<int>> cell(kRanks);
  std::atomic<int> bad{0};
  runRanks(kRanks, [&](int r) {
    ShmBarrier barrier(state.get(), r, pids, 30.0, true);
    for (int round = 1; round <= kRounds; ++round) {
      cell[static_cast<size_t>(r)].store(round);
      barrier.publish(1, static_cast<uint64_t>(round));
      barrier.awaitPeers(1, static_cast<uint64_t>(round), "test");
      for (int q = 0; q < kRanks; ++q) {
        if (cell[static_cast<size_t>(q)].load() < round) ++bad;
      }
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(ShmBarrier, AwaitPeersTimesOutNamingTheLaggard) {
  auto state = std::make_unique<ShmBarrierState>();
  ShmBarrier barrier(state.get(), 0, {getpid(), getpid(), getpid()}, 0.3, false);
  state->progress[1].stage[2].store(7);  // rank 1 is there, rank 2 stays at 3
  state->progress[2].stage[2].store(3);
  try {
    barrier.awaitPeers(2, 7, "allreduce (gather)");
    FAIL() << "returned while rank 2 was behind";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_TIMEOUT);
    EXPECT_NE(e.message().find("for ranks 2"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("allreduce (gather)"), std::string::npos) << e.message();
  }
}

// A peer that gives up (its step across hosts failed) fails every rank waiting for it at once,
// with its status, at a barrier or a progress wait, long before the timeout; a rank it does not
// hold up is not affected.
TEST(ShmBarrier, APeerThatFailedFailsItsWaitersAtOnce) {
  auto state = std::make_unique<ShmBarrierState>();
  const std::vector<int> pids = {getpid(), getpid(), getpid()};
  ShmBarrier waiter(state.get(), 0, pids, 60.0, false);
  ShmBarrier failing(state.get(), 2, pids, 60.0, false);
  state->progress[1].stage[3].store(5);
  state->progress[2].stage[3].store(4);
  std::thread fails([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    failing.fail(HORA_ERR_PEER_LOST);
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    waiter.awaitPeers(3, 5, "hierarchical allreduce (gather)");
    FAIL() << "returned while rank 2 was behind";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_PEER_LOST) << e.message();
    EXPECT_NE(e.message().find("rank 2 of this host failed"), std::string::npos) << e.message();
  }
  fails.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  // Once rank 2 is past what rank 0 waits for, its failure holds nobody up.
  state->progress[2].stage[3].store(6);
  EXPECT_NO_THROW(waiter.awaitPeers(3, 5, "hierarchical allreduce (gather)"));
}

// Rank 0 bounces a line with each peer in turn, as the shared-memory backend's probe does; every
// call returns a plausible round trip and none is left waiting.
TEST(ShmBarrier, PingPongTimesARoundTripWithEachPeer) {
  constexpr int kRanks = 3;
  auto state = std::make_unique<ShmBarrierState>();
  std::vector<int> pids(kRanks, getpid());
  std::vector<double> seen(kRanks * 4, -1);
  runRanks(kRanks, [&](int r) {
    ShmBarrier barrier(state.get(), r, pids, 30.0, true);
    for (int probe = 0; probe < 2; ++probe) {
      for (int q = 1; q < kRanks; ++q) {
        if (r == 0 || r == q) {
          seen[static_cast<size_t>(r * 4 + (r == 0 ? probe * 2 + q - 1 : probe))] =
              barrier.pingPong(r == 0 ? q : 0, 32);
        }
      }
    }
  });
  for (int r = 0; r < kRanks; ++r) {
    for (int i = 0; i < (r == 0 ? 4 : 2); ++i) {
      const double ns = seen[static_cast<size_t>(r * 4 + i)];
      EXPECT_GT(ns, 0.0) << "rank " << r << " probe " << i;
      EXPECT_LT(ns, 1e8) << "rank " << r << " probe " << i;
    }
  }
}

// The engine's sleep between cycles: a peer starting the next cycle wakes it long before its
// limit, and so does its own rank; a peer already ahead means no sleep at all.
TEST(ShmBell, APeerArrivingAtTheNextBarrierWakesTheSleeper) {
  auto state = std::make_unique<ShmBarrierState>();
  const std::vector<int> pids{getpid(), getpid()};
  std::atomic<bool> armed{false};
  std::chrono::steady_clock::duration slept{};
  runRanks(2, [&](int r) {
    ShmBarrier barrier(state.get(), r, pids, 60.0, false);
    if (r == 0) {
      ShmBell bell(state.get(), 0, 2);
      uint32_t ticket = 0;
      ASSERT_TRUE(bell.arm(&ticket));
      armed = true;
      const auto start = std::chrono::steady_clock::now();
      bell.sleep(ticket, hora_test::scaled(10));
      slept = std::chrono::steady_clock::now() - start;
    } else {
      while (!armed) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // rank 0 is inside its sleep
    }
    barrier.wait("negotiation (test)");
  });
  EXPECT_LT(slept, hora_test::scaled(5)) << "slept out its limit: the arrival did not ring";
  EXPECT_EQ(state->bellArmed[0].load(), 0u);
}

TEST(ShmBell, ItsOwnRankRingsIt) {
  auto state = std::make_unique<ShmBarrierState>();
  ShmBell bell(state.get(), 1, 2);
  uint32_t ticket = 0;
  ASSERT_TRUE(bell.arm(&ticket));
  std::thread ringer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    bell.ring();
  });
  const auto start = std::chrono::steady_clock::now();
  bell.sleep(ticket, hora_test::scaled(10));
  ringer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, hora_test::scaled(5));
  // A ring before the sleep starts is not lost: the ticket is stale and the sleep returns.
  ASSERT_TRUE(bell.arm(&ticket));
  bell.ring();
  const auto again = std::chrono::steady_clock::now();
  bell.sleep(ticket, hora_test::scaled(10));
  EXPECT_LT(std::chrono::steady_clock::now() - again, hora_test::scaled(5));
}

TEST(ShmBell, NoSleepWhenAPeerHasAlreadyStartedTheNextCycle) {
  auto state = std::make_unique<ShmBarrierState>();
  state->reached[1].store(1);  // rank 1 waits in a barrier rank 0 has not reached
  ShmBell bell(state.get(), 0, 2);
  uint32_t ticket = 0;
  EXPECT_FALSE(bell.arm(&ticket));
  EXPECT_EQ(state->bellArmed[0].load(), 0u);
  state->reached[0].store(1);  // level again: sleeping is allowed
  EXPECT_TRUE(bell.arm(&ticket));
  bell.sleep(ticket, std::chrono::nanoseconds(0));
  EXPECT_EQ(state->bellArmed[0].load(), 0u);
}

TEST(ShmBackend, OffLeavesTheInnerBackend) {
  ThreadGroup tg(2);
  Knobs knobs;
  knobs.shm = "off";
  runRanks(2, [&](int r) {
    std::string why;
    std::unique_ptr<Backend> b = makeShm(tg, r, knobs, &why);
    EXPECT_STREQ(b->name(), "inner");
    EXPECT_EQ(why, "HORA_SHM=off");
  });
}

// Rank r's view of one logical vector of `total` elements: cut into tensors at rank-specific
// places (so share boundaries fall in different tensors on different ranks).
struct RankData {
  std::vector<std::vector<float>> in, out;
  std::vector<Backend::Span> spans;
};

RankData cutVector(int rank, int64_t total, bool inPlace, const std::vector<float> &values) {
  RankData d;
  std::mt19937 gen(static_cast<unsigned>(rank * 7 + 1));
  int64_t at = 0;
  while (at < total) {
    const int64_t n = std::min<int64_t>(total - at, 1 + static_cast<int64_t>(gen() % 50000));
    d.in.emplace_back(values.begin() + at, values.begin() + at + n);
    d.out.emplace_back(inPlace ? 0 : n, -1.0f);
    at += n;
  }
  for (size_t i = 0; i < d.in.size(); ++i) {
    d.spans.push_back({d.in[i].data(), inPlace ? d.in[i].data() : d.out[i].data(),
                       static_cast<int64_t>(d.in[i].size())});
  }
  return d;
}

// (ranks, elements, HORA_SHM): "auto" stages through the segment, "stream" stages with
// non-temporal stores (HORA_SHM_STREAM=on), "cma" reads peers' tensors directly (the ranks are
// threads of one process here, which process_vm_readv serves as well).
class ShmAllreduce : public ::testing::TestWithParam<std::tuple<int, int64_t, std::string>> {};

TEST_P(ShmAllreduce, SumAndMaxWithScalingMatchAnIndependentSum) {
  const int ranks = std::get<0>(GetParam());
  const int64_t total = std::get<1>(GetParam());
  Knobs knobs;
  knobs.shm = std::get<2>(GetParam()) == "stream" ? "auto" : std::get<2>(GetParam());
  if (std::get<2>(GetParam()) == "stream") knobs.shmStream = "on";
  ThreadGroup tg(ranks);
  std::atomic<int> wrong{0};
  runRanks(ranks, [&](int r) {
    std::string why;
    std::unique_ptr<Backend> b = makeShm(tg, r, knobs, &why);
    ASSERT_STREQ(b->name(), knobs.shm == "cma" ? "inner+shm/single-copy" : "inner+shm") << why;
    auto value = [](int q, int64_t j) { return static_cast<float>((j * 13 + q * 5) % 97 - 40); };
    for (bool inPlace : {false, true}) {
      std::vector<float> mine(static_cast<size_t>(total));
      for (int64_t j = 0; j < total; ++j) mine[static_cast<size_t>(j)] = value(r, j);
      RankData d = cutVector(r, total, inPlace, mine);
      // Sum with prescale 2 and postscale 0.25: exact in float32 for these small integers.
      b->allreduceSpans(d.spans, DType::kFloat32, ReduceOp::kSum, 2.0, 0.25);
      int64_t j = 0;
      for (const Backend::Span &s : d.spans) {
        const float *o = static_cast<const float *>(s.out);
        for (int64_t i = 0; i < s.count; ++i, ++j) {
          double expect = 0;
          for (int q = 0; q < ranks; ++q) expect += 2.0 * value(q, j);
          if (o[i] != static_cast<float>(expect * 0.25)) ++wrong;
        }
      }
      if (!inPlace) {  // out of place, the inputs stay as they were
        int64_t k = 0;
        for (const std::vector<float> &piece : d.in) {
          for (float v : piece) wrong += v != value(r, k++);
        }
      }
      d = cutVector(r, total, inPlace, mine);
      b->allreduceSpans(d.spans, DType::kFloat32, ReduceOp::kMax, 1.0, 1.0);
      j = 0;
      for (const Backend::Span &s : d.spans) {
        const float *o = static_cast<const float *>(s.out);
        for (int64_t i = 0; i < s.count; ++i, ++j) {
          float expect = value(0, j);
          for (int q = 1; q < ranks; ++q) expect = std::max(expect, value(q, j));
          if (o[i] != expect) ++wrong;
        }
      }
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

std::string shmName(const ::testing::TestParamInfo<std::tuple<int, int64_t, std::string>> &info) {
  return "ranks" + std::to_string(std::get<0>(info.param)) + "_n" +
         std::to_string(std::get<1>(info.param)) + "_" + std::get<2>(info.param);
}

// 5 and 8000 elements go through the eager staging; 8200 is one pipeline window (staged) or one
// chunk (cma); 300001 is several of either; 1500001 (12 windows) reuses every ring slot twice.
INSTANTIATE_TEST_SUITE_P(Sizes, ShmAllreduce,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values<int64_t>(5, 8000, 8200, 300001, 1500001),
                                            ::testing::Values("auto", "stream", "cma")),
                         shmName);

// More tensors in one operation than a rank's single-copy table holds (4096): every rank sees
// that after the first barrier and stages the operation instead, with the same result.
TEST(ShmBackend, MoreTensorsThanTheTableHoldsAreStaged) {
  constexpr int kRanks = 2;
  ThreadGroup tg(kRanks);
  runRanks(kRanks, [&](int r) {
    std::string why;
    Knobs knobs;
    knobs.shm = "cma";
    std::unique_ptr<Backend> b = makeShm(tg, r, knobs, &why);
    ASSERT_STREQ(b->name(), "inner+shm/single-copy") << why;
    for (size_t tensors : {size_t{4096}, size_t{4097}, size_t{6000}}) {
      std::vector<std::vector<double>> t(tensors, std::vector<double>(9));
      std::vector<Backend::Span> spans;
      for (size_t i = 0; i < tensors; ++i) {
        for (size_t k = 0; k < 9; ++k) t[i][k] = static_cast<double>(i * 9 + k) * (r + 1);
        spans.push_back({t[i].data(), t[i].data(), 9});
      }
      b->allreduceSpans(spans, DType::kFloat64, ReduceOp::kSum, 1.0, 1.0);
      for (size_t i = 0; i < tensors; ++i) {
        for (size_t k = 0; k < 9; ++k) {
          ASSERT_EQ(t[i][k], 3.0 * static_cast<double>(i * 9 + k)) << tensors << " tensors, " << i;
        }
      }
    }
  });
}

// Peers' tensors are read while this rank writes its own share, and the other way round: float16
// in place, out of place and cut at different places on each rank.
TEST(ShmBackend, SingleCopyHalfPrecisionMatchesAnIndependentSum) {
  constexpr int kRanks = 3;
  constexpr int64_t kTotal = 200003;
  ThreadGroup tg(kRanks);
  std::atomic<int> wrong{0};
  runRanks(kRanks, [&](int r) {
    std::string why;
    Knobs knobs;
    knobs.shm = "cma";
    std::unique_ptr<Backend> b = makeShm(tg, r, knobs, &why);
    ASSERT_STREQ(b->name(), "inner+shm/single-copy") << why;
    auto value = [](int q, int64_t j) { return static_cast<float>((j * 7 + q * 3) % 61 - 30); };
    for (bool inPlace : {true, false}) {
      std::vector<float> mine(static_cast<size_t>(kTotal));
      for (int64_t j = 0; j < kTotal; ++j) mine[static_cast<size_t>(j)] = value(r, j);
      RankData d = cutVector(r, kTotal, inPlace, mine);
      // The same cut, as float16 (small integers: exact in float16, their sums too).
      std::vector<std::vector<uint16_t>> in16, out16;
      std::vector<Backend::Span> spans;
      for (size_t i = 0; i < d.in.size(); ++i) {
        in16.emplace_back(d.in[i].size());
        for (size_t k = 0; k < d.in[i].size(); ++k) in16.back()[k] = floatToHalf(d.in[i][k]);
        out16.emplace_back(inPlace ? 0 : d.in[i].size(), 0);
      }
      for (size_t i = 0; i < in16.size(); ++i) {
        spans.push_back({in16[i].data(), inPlace ? in16[i].data() : out16[i].data(),
                         static_cast<int64_t>(in16[i].size())});
      }
      b->allreduceSpans(spans, DType::kFloat16, ReduceOp::kSum, 1.0, 1.0);
      int64_t j = 0;
      for (const Backend::Span &s : spans) {
        const uint16_t *got = static_cast<const uint16_t *>(s.out);
        for (int64_t i = 0; i < s.count; ++i, ++j) {
          float expect = 0;
          for (int q = 0; q < kRanks; ++q) expect += value(q, j);
          if (halfToFloat(got[i]) != expect) ++wrong;
        }
      }
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ShmBackend, NegotiationAndMatchesABitwiseAndOfEveryRank) {
  constexpr int kRanks = 3;
  ThreadGroup tg(kRanks);
  runRanks(kRanks, [&](int r) {
    std::string why;
    std::unique_ptr<Backend> b = makeShm(tg, r, Knobs{}, &why);
    for (uint64_t round = 0; round < 200; ++round) {
      // Rank r clears bit (round + r) % 64 of word 0 and every bit of word 1 but its own.
      std::vector<uint64_t> words{~(uint64_t{1} << ((round + r) % 64)), uint64_t{1} << r | 8, ~uint64_t{0}};
      ASSERT_GE(b->caps().negotiationWords, words.size());
      b->andWords(words);
      uint64_t expect0 = ~uint64_t{0};
      for (int q = 0; q < kRanks; ++q) expect0 &= ~(uint64_t{1} << ((round + q) % 64));
      ASSERT_EQ(words[0], expect0) << "round " << round;
      ASSERT_EQ(words[1], uint64_t{8});
      ASSERT_EQ(words[2], ~uint64_t{0});
    }
    // Longer than the segment's vector halves: the capabilities say so, and the engine then
    // negotiates on the group's plane; asked anyway, the backend refuses without touching it.
    std::vector<uint64_t> huge(100000, 5);
    EXPECT_LT(b->caps().negotiationWords, huge.size());
    EXPECT_THROW(b->andWords(huge), Error);
    EXPECT_EQ(huge[0], 5u);
  });
}

TEST(ShmBackend, StatesWhatItAddsToItsInnerBackend) {
  ThreadGroup tg(2);
  runRanks(2, [&](int r) {
    std::string why;
    std::unique_ptr<Backend> b = makeShm(tg, r, Knobs{}, &why);
    ASSERT_TRUE(why.empty()) << why;
    const BackendCaps &caps = b->caps();
    EXPECT_TRUE(caps.reducesSpansInPlace);
    EXPECT_EQ(caps.negotiationWords, size_t{64 << 10} / sizeof(uint64_t));
    EXPECT_EQ(caps.scope, BackendCaps::Scope::kOneHost);
    // The rest is the inner backend's: its collectives, its dtypes (reducescatter goes there),
    // and its sockets.
    EXPECT_EQ(caps.collectives, kAllDataCollectives);
    EXPECT_FALSE(caps.reduces(DType::kFloat16));
    EXPECT_TRUE(caps.reduces(DType::kFloat64));
    EXPECT_TRUE(caps.usesSockets);
  });
}

TEST(ShmBackend, OnlyAllreduceStaysOnTheSharedMemoryPath) {
  ThreadGroup tg(2);
  runRanks(2, [&](int r) {
    std::string why;
    InnerBackend *inner = nullptr;
    std::unique_ptr<Backend> b = makeShm(tg, r, Knobs{}, &why, &inner);
    char buf[8] = {};
    b->broadcast(buf, 8, 0);
    b->allgatherv(buf, buf, {4, 4});
    float x = static_cast<float>(r + 1);
    b->allreduce(&x, &x, 1, DType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(x, 3.0f);
    EXPECT_EQ(inner->others, 2);
    EXPECT_EQ(inner->allreduces, 0);
    // Thousands of one-element tensors in one operation.
    std::vector<float> many(5000);
    std::vector<Backend::Span> spans;
    for (size_t i = 0; i < many.size(); ++i) {
      many[i] = static_cast<float>(i + r);
      spans.push_back({&many[i], &many[i], 1});
    }
    b->allreduceSpans(spans, DType::kFloat32, ReduceOp::kSum, 1.0, 1.0);
    for (size_t i = 0; i < many.size(); ++i) ASSERT_EQ(many[i], static_cast<float>(2 * i + 1)) << i;
  });
}

}  // namespace
}  // namespace hora
