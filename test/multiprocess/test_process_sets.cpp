// SPDX-License-Identifier: Apache-2.0
// Process sets: create/destroy rules, every collective on non-contiguous sets, concurrency, stalls.
#include <hora/hora.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "mp_cases.h"
#include "mp_harness.h"
#include "mp_ops.h"

namespace {

using mp::AllgatherCase;
using mp::AllreduceCase;
using mp::AlltoallCase;
using mp::BroadcastCase;
using mp::Case;
using mp::DType;
using mp::makeTensor;
using mp::ReducescatterCase;
using mp::Request;

std::vector<int> allRanks(int n) {
  std::vector<int> v;
  for (int r = 0; r < n; ++r) v.push_back(r);
  return v;
}

std::vector<int> endRanks(int n) { return n == 1 ? std::vector<int>{0} : std::vector<int>{0, n - 1}; }

// Expects `id` to describe the set `ranks` as seen from this rank.
void expectDescribes(int32_t id, const std::vector<int> &ranks, const std::string &what) {
  const int me = mp::rank();
  EXPECT_EQ(static_cast<int>(ranks.size()), hora_process_set_size(id)) << what;
  EXPECT_EQ(mp::indexIn(ranks, me), hora_process_set_rank(id)) << what << " (rank within the set)";
}

// Adds one of every collective on `set` (set-relative roots, splits and blocks), all to be in
// flight together.
void addEveryCollective(std::vector<std::unique_ptr<Case>> &cases, int32_t set, const std::string &p,
                        int64_t salt) {
  const int n = hora_process_set_size(set);
  cases.push_back(std::make_unique<AllreduceCase>(p + ".ar.sum", set, mp::f32(), std::vector<int64_t>{17, 3},
                                                  HORA_OP_SUM, salt));
  cases.push_back(std::make_unique<AllreduceCase>(p + ".ar.max", set, mp::i32(), std::vector<int64_t>{9},
                                                  HORA_OP_MAX, salt + 1));
  cases.push_back(std::make_unique<AllreduceCase>(p + ".ar.avg", set, mp::f64(), std::vector<int64_t>{5, 5},
                                                  HORA_OP_AVERAGE, salt + 2, 0.5, 2.0));
  cases.push_back(std::make_unique<AllreduceCase>(p + ".ar.prod", set, mp::dtypeNamed("int8"),
                                                  std::vector<int64_t>{11}, HORA_OP_PRODUCT, salt + 3));
  cases.push_back(std::make_unique<AllreduceCase>(p + ".ar.min.f16", set, mp::dtypeNamed("float16"),
                                                  std::vector<int64_t>{6}, HORA_OP_MIN, salt + 4));
  // Roots are ranks of the set: the last set rank is a world rank > set size for these sets.
  cases.push_back(std::make_unique<BroadcastCase>(p + ".bc.last", set, mp::f32(), std::vector<int64_t>{33},
                                                  n - 1, salt + 5));
  cases.push_back(std::make_unique<BroadcastCase>(p + ".bc.first", set, mp::dtypeNamed("uint8"),
                                                  std::vector<int64_t>{2, 7}, 0, salt + 6));
  cases.push_back(std::make_unique<AllgatherCase>(p + ".ag", set, mp::f64(),
                                                  [](int q) { return int64_t{q + 1}; },
                                                  std::vector<int64_t>{3}, salt + 7));
  cases.push_back(std::make_unique<AllgatherCase>(p + ".ag.zero0", set, mp::dtypeNamed("bfloat16"),
                                                  [](int q) { return int64_t{q}; },
                                                  std::vector<int64_t>{2}, salt + 8));
  cases.push_back(std::make_unique<AlltoallCase>(p + ".a2a", set, mp::dtypeNamed("int64"),
                                                 [](int s, int d) { return int64_t{(s + 2 * d + 1) % 4}; },
                                                 std::vector<int64_t>{2}, salt + 9));
  cases.push_back(std::make_unique<AlltoallCase>(p + ".a2a.even", set, mp::f32(),
                                                 [](int, int) { return int64_t{2}; },
                                                 std::vector<int64_t>{}, salt + 10, true));
  cases.push_back(std::make_unique<ReducescatterCase>(p + ".rs.sum", set, mp::f32(),
                                                      std::vector<int64_t>{2 * n + 1, 3}, HORA_OP_SUM,
                                                      salt + 11));
  cases.push_back(std::make_unique<ReducescatterCase>(p + ".rs.max.f16", set, mp::dtypeNamed("float16"),
                                                      std::vector<int64_t>{n + 2, 2}, HORA_OP_MAX, salt + 12));
}

// --- create / query ----------------------------------------------------------------------

TEST(ProcessSets, CreateQueryAndIdempotence) {
  const int me = mp::rank(), n = mp::size();
  expectDescribes(0, allRanks(n), "world");

  const std::vector<int> evens = mp::evenRanks(n);
  const int32_t id = mp::createSet(evens);
  if (static_cast<int>(evens.size()) == n) {
    EXPECT_EQ(0, id) << "a set of every rank is the world";
  } else {
    EXPECT_GT(id, 0);
  }
  expectDescribes(id, evens, "evens");

  // Same ranks again, and in another order: the same set.
  EXPECT_EQ(id, mp::createSet(evens)) << "creating an existing set";
  std::vector<int> reversed(evens.rbegin(), evens.rend());
  EXPECT_EQ(id, mp::createSet(reversed)) << "ranks are sorted";

  std::vector<int> everyone = allRanks(n);
  std::reverse(everyone.begin(), everyone.end());
  EXPECT_EQ(0, mp::createSet(everyone)) << "every rank, in any order, is the world (id 0)";

  if (n >= 2) {
    const std::vector<int> odds = mp::oddRanks(n);
    const int32_t oddId = mp::createSet(odds);
    EXPECT_NE(id, oddId);
    EXPECT_NE(0, oddId);
    expectDescribes(oddId, odds, "odds");
    // Non-members see the size but no rank.
    if (!mp::contains(odds, me)) {
      EXPECT_EQ(-1, hora_process_set_rank(oddId));
    }
  }
  EXPECT_EQ(-1, hora_process_set_size(987654));
  EXPECT_EQ(-1, hora_process_set_rank(987654));
  EXPECT_EQ(-1, hora_process_set_size(-1));
}

TEST(ProcessSets, CreateRejectsBadRanksThenWorks) {
  const int n = mp::size();
  int32_t id = -7;
  auto rejected = [&](const std::string &what, std::vector<int> ranks, int nranks) {
    id = -7;
    mp::expectRejected(what, HORA_ERR_INVALID_ARGUMENT, hora_process_set_create(ranks.data(), nranks, &id),
                       nullptr);
    EXPECT_EQ(-7, id) << what << ": id written on failure";
  };
  rejected("duplicate rank", {0, 0}, 2);
  rejected("rank -1", {-1}, 1);
  rejected("rank = world size", {0, n}, 2);
  rejected("nranks 0", {0}, 0);
  rejected("nranks -1", {0}, -1);
  mp::expectRejected("NULL ranks", HORA_ERR_INVALID_ARGUMENT, hora_process_set_create(nullptr, 1, &id), nullptr);
  const int zero = 0;
  mp::expectRejected("NULL id_p", HORA_ERR_INVALID_ARGUMENT, hora_process_set_create(&zero, 1, nullptr), nullptr);

  // Nothing was enqueued, so the next collective create still pairs up across ranks.
  const std::vector<int> ends = endRanks(n);
  const int32_t good = mp::createSet(ends);
  expectDescribes(good, ends, "ends after refused creates");
  mp::expectGoodAllreduce("ps.bad_create.after", 1);
}

// --- membership --------------------------------------------------------------------------

TEST(ProcessSets, OpsOnSetWithoutCallerRejected) {
  const int me = mp::rank(), n = mp::size();
  if (n < 2) GTEST_SKIP() << "every set contains the only rank";
  const int32_t evens = mp::createSet(mp::evenRanks(n));
  const int32_t odds = mp::createSet(mp::oddRanks(n));
  const int32_t other = me % 2 == 0 ? odds : evens;  // the set this rank is not in
  const int32_t mine = me % 2 == 0 ? evens : odds;
  ASSERT_EQ(-1, hora_process_set_rank(other));

  auto t = makeTensor(mp::f32(), {4, 3});
  hora_request_t req = nullptr;
  auto check = [&](const std::string &what, hora_status_t s) {
    mp::expectRejected(what + " on a set without this rank", HORA_ERR_INVALID_ARGUMENT, s, req);
    req = nullptr;
  };
  check("allreduce", hora_allreduce_async("ps.nm.ar", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, other, &req));
  check("unnamed allreduce", hora_allreduce_async(nullptr, t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, other, &req));
  DLTensor group[2] = {*t->dl(), *t->dl()};
  check("grouped allreduce",
        hora_grouped_allreduce_async("ps.nm.grp", 2, group, group, HORA_OP_SUM, 1.0, 1.0, other, &req));
  check("broadcast", hora_broadcast_async("ps.nm.bc", t->dl(), 0, other, &req));
  check("allgather", hora_allgather_async("ps.nm.ag", t->dl(), other, &req));
  // Splits valid for the other set's size, so only membership is wrong.
  std::vector<int64_t> splits(static_cast<size_t>(hora_process_set_size(other)), 0);
  splits[0] = 4;
  check("alltoall", hora_alltoall_async("ps.nm.a2a", t->dl(), splits.data(), other, &req));
  check("reducescatter", hora_reducescatter_async("ps.nm.rs", t->dl(), HORA_OP_SUM, other, &req));
  check("barrier", hora_barrier(other));
  int last = -5;
  check("join", hora_join(other, &last));

  // Both the world and the caller's own set still work, and the auto-name counter of the set
  // this rank is not in was not advanced by the refused unnamed call.
  mp::expectGoodAllreduceIn(mine, "ps.nm.mine", 2);
  mp::expectGoodAllreduce("ps.nm.world", 3);
}

// --- every collective on subsets ---------------------------------------------------------

void everyCollectiveOn(const std::vector<int> &ranks, const std::string &prefix) {
  const int32_t id = mp::createSet(ranks);
  ASSERT_GE(id, 0);
  if (!mp::contains(ranks, mp::rank())) return;  // non-members only take part in the create
  std::vector<std::unique_ptr<Case>> cases;
  addEveryCollective(cases, id, prefix, 1);
  mp::runAll(cases);
  MP_EXPECT_OK(hora_barrier(id)) << prefix;
  mp::expectGoodAllreduceIn(id, prefix + ".after", 50);
}

TEST(ProcessSets, EveryCollectiveOnEvenRanks) { everyCollectiveOn(mp::evenRanks(mp::size()), "ps.even"); }

TEST(ProcessSets, EveryCollectiveOnOddRanks) {
  if (mp::size() < 2) GTEST_SKIP() << "no odd ranks";
  everyCollectiveOn(mp::oddRanks(mp::size()), "ps.odd");
}

TEST(ProcessSets, EveryCollectiveOnFirstAndLastRank) {
  everyCollectiveOn(endRanks(mp::size()), "ps.ends");
}

// A set of ranks listed out of order: ranks within it follow the sorted order.
TEST(ProcessSets, EveryCollectiveOnReversedList) {
  const int n = mp::size();
  std::vector<int> ranks;
  for (int r = n - 1; r >= 0; r -= 3) ranks.push_back(r);
  const int32_t id = mp::createSet(ranks);
  std::sort(ranks.begin(), ranks.end());
  expectDescribes(id, ranks, "ranks given in descending order");
  everyCollectiveOn(ranks, "ps.rev");
}

// World, evens, odds and ends all with collectives in flight together on every rank, submitted
// interleaved, then waited for.
TEST(ProcessSets, ConcurrentWithWorld) {
  const int me = mp::rank(), n = mp::size();
  struct Named {
    std::vector<int> ranks;
    const char *prefix;
  };
  std::vector<Named> sets = {{allRanks(n), "ps.cc.world"}, {mp::evenRanks(n), "ps.cc.even"},
                             {endRanks(n), "ps.cc.ends"}};
  if (n >= 2) sets.push_back({mp::oddRanks(n), "ps.cc.odd"});
  std::vector<std::vector<std::unique_ptr<Case>>> perSet;
  int64_t salt = 0;
  for (const Named &s : sets) {
    const int32_t id = mp::createSet(s.ranks);
    perSet.emplace_back();
    if (mp::contains(s.ranks, me)) addEveryCollective(perSet.back(), id, s.prefix, salt);
    salt += 20;
  }
  // Round-robin over the sets so that every set has work queued before any is waited for.
  size_t longest = 0;
  for (const auto &v : perSet) longest = std::max(longest, v.size());
  for (size_t i = 0; i < longest; ++i)
    for (auto &v : perSet)
      if (i < v.size()) v[i]->submit();
  // Wait in the reverse order of the sets.
  for (auto it = perSet.rbegin(); it != perSet.rend(); ++it)
    for (auto &c : *it) c->check();
}

// Evens and odds (disjoint) each run a stream of collectives at the same time.
TEST(ProcessSets, TwoDisjointSetsAtOnce) {
  const int me = mp::rank(), n = mp::size();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  const int32_t evens = mp::createSet(mp::evenRanks(n));
  const int32_t odds = mp::createSet(mp::oddRanks(n));
  const int32_t mine = me % 2 == 0 ? evens : odds;
  const std::string p = me % 2 == 0 ? "ps.dj.even" : "ps.dj.odd";
  std::vector<std::unique_ptr<Case>> cases;
  for (int i = 0; i < 12; ++i) {
    cases.push_back(std::make_unique<AllreduceCase>(p + ".ar" + std::to_string(i), mine, mp::f32(),
                                                    std::vector<int64_t>{100 + 7 * i}, HORA_OP_SUM, i));
    cases.push_back(std::make_unique<AllgatherCase>(p + ".ag" + std::to_string(i), mine, mp::i32(),
                                                    [i](int q) { return int64_t{(q + i) % 3}; },
                                                    std::vector<int64_t>{4}, i));
  }
  mp::runAll(cases);
  mp::expectGoodAllreduce("ps.dj.world", 4);
}

// --- independence ------------------------------------------------------------------------

// A = {0, 1} and B = {1, n-1}: rank 1 has an op pending on B that rank n-1 submits only after
// a world gate, and the gate needs ranks 0 and 1 to have finished a stream of ops on A first.
// If B's pending op blocked A (or the world), this would deadlock and the watchdog would name it.
TEST(ProcessSets, StalledSetDoesNotBlockOverlappingSet) {
  const int me = mp::rank(), n = mp::size();
  if (n < 3) GTEST_SKIP() << "needs three ranks";
  const int32_t a = mp::createSet({0, 1});
  const int32_t b = mp::createSet({1, n - 1});
  std::unique_ptr<Case> late;
  if (me == 1) {
    late = std::make_unique<AllreduceCase>("ps.stall.b", b, mp::f32(), std::vector<int64_t>{8},
                                           HORA_OP_SUM, 5);
    late->submit();
  }
  if (me == 0 || me == 1) {
    std::vector<std::unique_ptr<Case>> cases;
    for (int i = 0; i < 20; ++i)
      cases.push_back(std::make_unique<AllreduceCase>("ps.stall.a" + std::to_string(i), a, mp::f32(),
                                                      std::vector<int64_t>{16}, HORA_OP_SUM, i));
    cases.push_back(std::make_unique<AlltoallCase>("ps.stall.a2a", a, mp::f32(),
                                                   [](int s, int d) { return int64_t{s + d}; },
                                                   std::vector<int64_t>{2}, 3));
    mp::runAll(cases);
    MP_EXPECT_OK(hora_barrier(a));
  }
  if (me == 1) {
    int done = -1;
    MP_EXPECT_OK(hora_poll(late->request(), &done));
    EXPECT_EQ(0, done) << "B's op completed before its other member submitted it";
  }
  mp::expectGoodAllreduce("ps.stall.gate", 6);
  if (me == n - 1) {
    late = std::make_unique<AllreduceCase>("ps.stall.b", b, mp::f32(), std::vector<int64_t>{8},
                                           HORA_OP_SUM, 5);
    late->submit();
  }
  if (late) late->check();
}

// The same with disjoint sets A = {0, 1} and B = {2, 3}.
TEST(ProcessSets, StalledSetDoesNotBlockDisjointSet) {
  const int me = mp::rank(), n = mp::size();
  if (n < 4) GTEST_SKIP() << "needs four ranks";
  const int32_t a = mp::createSet({0, 1});
  const int32_t b = mp::createSet({2, 3});
  std::unique_ptr<Case> late;
  auto makeLate = [&] {
    return std::make_unique<AllgatherCase>("ps.stall2.b", b, mp::f64(), [](int q) { return int64_t{q + 2}; },
                                           std::vector<int64_t>{3}, 7);
  };
  if (me == 2) {
    late = makeLate();
    late->submit();
  }
  if (me == 0 || me == 1) {
    std::vector<std::unique_ptr<Case>> cases;
    for (int i = 0; i < 20; ++i)
      cases.push_back(std::make_unique<ReducescatterCase>("ps.stall2.a" + std::to_string(i), a, mp::f32(),
                                                          std::vector<int64_t>{5, 2}, HORA_OP_SUM, i));
    mp::runAll(cases);
  }
  // Polled before the gate: rank 3 submits right after it, and the op may then complete at once.
  if (me == 2) {
    int done = -1;
    MP_EXPECT_OK(hora_poll(late->request(), &done));
    EXPECT_EQ(0, done) << "B's op completed before its other member submitted it";
  }
  mp::expectGoodAllreduce("ps.stall2.gate", 8);
  if (me == 3) {
    late = makeLate();
    late->submit();
  }
  if (late) late->check();
}

// The world has a tensor pending (rank n-1 submits it last) while a set without n-1 runs a
// stream of ops: a stalled world does not block a set either.
TEST(ProcessSets, StalledWorldDoesNotBlockSet) {
  const int me = mp::rank(), n = mp::size();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<int> ranks = allRanks(n - 1);
  const int32_t s = mp::createSet(ranks);
  std::unique_ptr<Case> pending;
  auto makePending = [] {
    return std::make_unique<AllreduceCase>("ps.wstall.w", 0, mp::f64(), std::vector<int64_t>{12},
                                           HORA_OP_MAX, 9);
  };
  if (me < n - 1) {
    pending = makePending();
    pending->submit();
    std::vector<std::unique_ptr<Case>> cases;
    for (int i = 0; i < 15; ++i)
      cases.push_back(std::make_unique<AllreduceCase>("ps.wstall.s" + std::to_string(i), s, mp::f32(),
                                                      std::vector<int64_t>{32}, HORA_OP_SUM, i));
    mp::runAll(cases);
    int done = -1;
    MP_EXPECT_OK(hora_poll(pending->request(), &done));
    EXPECT_EQ(0, done) << "world op completed before rank " << n - 1 << " submitted it";
  }
  mp::expectGoodAllreduce("ps.wstall.gate", 10);
  if (me == n - 1) {
    pending = makePending();
    pending->submit();
  }
  pending->check();
}

// --- set-relative arguments --------------------------------------------------------------

TEST(ProcessSets, BroadcastRootOutsideSetRejected) {
  const int n = mp::size();
  const std::vector<int> ends = endRanks(n);
  const int32_t id = mp::createSet(ends);
  if (!mp::contains(ends, mp::rank())) return;
  const int size = hora_process_set_size(id);
  auto t = makeTensor(mp::f32(), {5});
  for (int root : {-1, size, size + 1}) {
    hora_request_t req = nullptr;
    // root = size is a valid world rank for n > 2, but not a rank of this two-rank set.
    mp::expectRejected("broadcast root " + std::to_string(root) + " on a set of " + std::to_string(size),
                       HORA_ERR_INVALID_ARGUMENT, hora_broadcast_async("ps.bc.badroot", t->dl(), root, id, &req),
                       req);
  }
  BroadcastCase good("ps.bc.badroot", id, mp::f32(), {5}, size - 1, 11);
  good.run();
}

// NULL splits divide the first dimension by the set's size, not the world's: 4 rows over the
// two ranks {0, n-1} divide evenly, over a world of 3 or 5 they would not.
TEST(ProcessSets, AlltoallEvenSplitUsesSetSize) {
  const std::vector<int> ends = endRanks(mp::size());
  const int32_t id = mp::createSet(ends);
  if (!mp::contains(ends, mp::rank())) return;
  AlltoallCase even("ps.a2a.setsize", id, mp::f32(),
                    [](int, int) { return int64_t{2}; }, {3}, 12, true);
  even.run();
}

// --- destroy -----------------------------------------------------------------------------

TEST(ProcessSets, DestroyThenOpsRejected) {
  const int me = mp::rank(), n = mp::size();
  mp::expectRejected("destroy set 0", HORA_ERR_INVALID_ARGUMENT, hora_process_set_destroy(0), nullptr);
  mp::expectRejected("destroy unknown set", HORA_ERR_INVALID_ARGUMENT, hora_process_set_destroy(424242),
                     nullptr);
  if (n < 2) GTEST_SKIP() << "every set of one rank is the world";
  // Not the world: {0, n-1} for n >= 3, {1} for n = 2.
  const std::vector<int> ranks = n >= 3 ? endRanks(n) : std::vector<int>{1};
  const int32_t id = mp::createSet(ranks);
  ASSERT_GT(id, 0);
  if (mp::contains(ranks, me)) {
    mp::expectGoodAllreduceIn(id, "ps.destroy.before", 13);
  }
  MP_ASSERT_OK(hora_process_set_destroy(id));
  EXPECT_EQ(-1, hora_process_set_size(id)) << "destroyed set still has a size";
  EXPECT_EQ(-1, hora_process_set_rank(id)) << "destroyed set still has a rank";

  auto t = makeTensor(mp::f32(), {4});
  hora_request_t req = nullptr;
  mp::expectRejected("allreduce on a destroyed set", HORA_ERR_INVALID_ARGUMENT,
                     hora_allreduce_async("ps.destroyed.ar", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, id, &req), req);
  req = nullptr;
  mp::expectRejected("allgather on a destroyed set", HORA_ERR_INVALID_ARGUMENT,
                     hora_allgather_async("ps.destroyed.ag", t->dl(), id, &req), req);
  mp::expectRejected("barrier on a destroyed set", HORA_ERR_INVALID_ARGUMENT, hora_barrier(id), nullptr);
  mp::expectRejected("destroy twice", HORA_ERR_INVALID_ARGUMENT, hora_process_set_destroy(id), nullptr);

  // The ranks can form a set again, and it works.
  const int32_t again = mp::createSet(ranks);
  ASSERT_GT(again, 0);
  expectDescribes(again, ranks, "re-created set");
  if (mp::contains(ranks, me)) {
    mp::expectGoodAllreduceIn(again, "ps.destroy.recreated", 14);
  }
  MP_EXPECT_OK(hora_process_set_destroy(again));
  mp::expectGoodAllreduce("ps.destroy.world_after", 15);
}

// Sets created and destroyed over and over while the world keeps working.
TEST(ProcessSets, CreateDestroyCycles) {
  const int me = mp::rank(), n = mp::size();
  if (n < 2) GTEST_SKIP() << "every set of one rank is the world";
  for (int cycle = 0; cycle < 5; ++cycle) {
    std::vector<int> ranks;
    for (int r = cycle % 2; r < n; r += 2) ranks.push_back(r);
    if (static_cast<int>(ranks.size()) == n) continue;
    const int32_t id = mp::createSet(ranks);
    ASSERT_GT(id, 0) << "cycle " << cycle;
    if (mp::contains(ranks, me)) {
      std::vector<std::unique_ptr<Case>> cases;
      addEveryCollective(cases, id, "ps.cycle" + std::to_string(cycle), cycle);
      mp::runAll(cases);
    }
    mp::expectGoodAllreduce("ps.cycle.world" + std::to_string(cycle), cycle);
    MP_ASSERT_OK(hora_process_set_destroy(id)) << "cycle " << cycle;
  }
}

// Destroying a set leaves other sets (and their ids) alone.
TEST(ProcessSets, DestroyLeavesOtherSetsAlone) {
  const int me = mp::rank(), n = mp::size();
  if (n < 3) GTEST_SKIP() << "needs three ranks for two distinct non-world sets";
  const std::vector<int> first = {0, 1}, second = {1, 2};
  const int32_t x = mp::createSet(first);
  const int32_t y = mp::createSet(second);
  ASSERT_NE(x, y);
  MP_ASSERT_OK(hora_process_set_destroy(x));
  expectDescribes(y, second, "surviving set");
  if (mp::contains(second, me)) mp::expectGoodAllreduceIn(y, "ps.survivor", 16);
  MP_EXPECT_OK(hora_process_set_destroy(y));
}

}  // namespace
