// SPDX-License-Identifier: Apache-2.0
// Join: ranks with less data join early; the others' ops complete with zeros in their place.
#include <hora/hora.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mp_cases.h"
#include "mp_harness.h"
#include "mp_ops.h"

namespace {

using mp::DType;
using mp::HostTensor;
using mp::makeTensor;
using mp::Request;

double sumInput(int q, int64_t j, int k) { return (q + 1) * static_cast<double>(j % 7 + 1) + k; }
double avgInput(int q, int64_t j, int k) { return (q + 1) * 0.5 * static_cast<double>(j % 5 + 1) + k; }
int64_t gatherRows(int q) { return q % 3 + 1; }

int64_t a2aRows(int src, int dst, int k) { return (src + dst + k) % 3 + 1; }

// Reducescatter SUM and alltoall of step k, in flight with the ops of joinStep: a joined rank
// contributes zeros to the reduction (and still owns its block), sends no rows, and the rows
// sent to it are dropped.
void joinStepScatter(const std::string &tag, int32_t set, int k, const std::vector<bool> &active) {
  const int me = hora_process_set_rank(set);
  const int n = hora_process_set_size(set);
  const int64_t rows = 2 * n + 1;
  auto rsIn = makeTensor(mp::f32(), {rows, 3});
  rsIn->fill([&](int64_t j) { return sumInput(me, j, k); });
  std::vector<int64_t> splits;
  int64_t sendRows = 0;
  for (int d = 0; d < n; ++d) {
    splits.push_back(a2aRows(me, d, k));
    sendRows += splits.back();
  }
  auto a2aIn = makeTensor(mp::f32(), {sendRows, 2});
  a2aIn->fill([&](int64_t i) { return mp::rowValue(mp::f32(), me, i / 2, i % 2, k); });

  hora_request_t rr = nullptr, ra = nullptr;
  MP_ASSERT_OK(hora_reducescatter_async((tag + ".rs").c_str(), rsIn->dl(), HORA_OP_SUM, set, &rr));
  Request gr(rr);
  MP_ASSERT_OK(hora_alltoall_async((tag + ".a2a").c_str(), a2aIn->dl(), splits.data(), set, &ra));
  Request ga(ra);
  const std::string where = tag + " step " + std::to_string(k);

  MP_EXPECT_OK(hora_wait(rr)) << where << ": reducescatter";
  const DLTensor *block = hora_request_output(rr);
  ASSERT_NE(nullptr, block) << where << ": reducescatter output";
  ASSERT_EQ(2, block->ndim) << where;
  ASSERT_EQ(mp::blockRows(rows, n, me), block->shape[0]) << where << ": reducescatter block rows";
  const int64_t offset = mp::blockStart(rows, n, me) * 3;
  EXPECT_TRUE(mp::matches(*block, [&](int64_t i) {
    double s = 0;
    for (int q = 0; q < n; ++q)
      if (active[static_cast<size_t>(q)]) s += sumInput(q, i + offset, k);
    return s;
  })) << where << ": reducescatter SUM with joined ranks as zeros";

  MP_EXPECT_OK(hora_wait(ra)) << where << ": alltoall";
  std::vector<std::pair<int, int64_t>> origin;
  for (int q = 0; q < n; ++q) {
    if (!active[static_cast<size_t>(q)]) continue;
    int64_t first = 0;
    for (int d = 0; d < me; ++d) first += a2aRows(q, d, k);
    for (int64_t r = 0; r < a2aRows(q, me, k); ++r) origin.emplace_back(q, first + r);
  }
  const DLTensor *got = hora_request_output(ra);
  ASSERT_NE(nullptr, got) << where << ": alltoall output";
  ASSERT_EQ(2, got->ndim) << where;
  ASSERT_EQ(static_cast<int64_t>(origin.size()), got->shape[0]) << where << ": joined ranks send no rows";
  const int64_t *recv = hora_request_received_splits(ra);
  ASSERT_NE(nullptr, recv) << where;
  for (int q = 0; q < n; ++q)
    EXPECT_EQ(active[static_cast<size_t>(q)] ? a2aRows(q, me, k) : 0, recv[q]) << where << ": rows from " << q;
  EXPECT_TRUE(mp::matches(*got, [&](int64_t i) {
    const auto &o = origin[static_cast<size_t>(i / 2)];
    return mp::rowValue(mp::f32(), o.first, o.second, i % 2, k);
  })) << where << ": alltoall";
}

// The allreduces and the allgather of step k (see joinStep).
void joinStepCollectives(const std::string &tag, int32_t set, int k, const std::vector<bool> &active) {
  const int me = hora_process_set_rank(set);
  const int n = hora_process_set_size(set);
  auto sum = makeTensor(mp::f32(), {4, 7});
  auto avg = makeTensor(mp::f64(), {10});
  sum->fill([&](int64_t j) { return sumInput(me, j, k); });
  avg->fill([&](int64_t j) { return avgInput(me, j, k); });
  auto gin = makeTensor(mp::i32(), {gatherRows(me), 2});
  gin->fill([&](int64_t i) { return mp::rowValue(mp::i32(), me, i / 2, i % 2, k); });

  hora_request_t rs = nullptr, ra = nullptr, rg = nullptr;
  MP_ASSERT_OK(hora_allreduce_async((tag + ".sum").c_str(), sum->dl(), sum->dl(), HORA_OP_SUM, 1.0, 1.0,
                                    set, &rs));
  Request gs(rs);
  MP_ASSERT_OK(hora_allreduce_async((tag + ".avg").c_str(), avg->dl(), avg->dl(), HORA_OP_AVERAGE, 1.0,
                                    1.0, set, &ra));
  Request ga(ra);
  MP_ASSERT_OK(hora_allgather_async((tag + ".ag").c_str(), gin->dl(), set, &rg));
  Request gg(rg);

  int contributors = 0;
  for (int q = 0; q < n; ++q) contributors += active[static_cast<size_t>(q)] ? 1 : 0;
  const std::string where = tag + " step " + std::to_string(k) + " with " +
                            std::to_string(contributors) + " of " + std::to_string(n) + " ranks";

  MP_EXPECT_OK(hora_wait(rs)) << where;
  EXPECT_TRUE(mp::matches(*sum, [&](int64_t j) {
    double s = 0;
    for (int q = 0; q < n; ++q)
      if (active[static_cast<size_t>(q)]) s += sumInput(q, j, k);
    return s;
  })) << where << ": SUM";

  MP_EXPECT_OK(hora_wait(ra)) << where;
  auto avgExpected = [&](int64_t j) {
    double s = 0;
    for (int q = 0; q < n; ++q)
      if (active[static_cast<size_t>(q)]) s += avgInput(q, j, k);
    return s / contributors;
  };
  EXPECT_TRUE(mp::matches(*avg, avgExpected, [&](int64_t j) { return 1e-12 * std::fabs(avgExpected(j)); }))
      << where << ": AVERAGE must divide by the ranks that contributed";

  MP_EXPECT_OK(hora_wait(rg)) << where;
  std::vector<std::pair<int, int64_t>> origin;
  for (int q = 0; q < n; ++q)
    if (active[static_cast<size_t>(q)])
      for (int64_t row = 0; row < gatherRows(q); ++row) origin.emplace_back(q, row);
  const DLTensor *out = hora_request_output(rg);
  ASSERT_NE(nullptr, out) << where << ": allgather output";
  ASSERT_EQ(2, out->ndim) << where;
  ASSERT_EQ(static_cast<int64_t>(origin.size()), out->shape[0])
      << where << ": joined ranks contribute zero rows";
  EXPECT_TRUE(mp::matches(*out, [&](int64_t i) {
    const auto &o = origin[static_cast<size_t>(i / 2)];
    return mp::rowValue(mp::i32(), o.first, o.second, i % 2, k);
  })) << where << ": allgather";
}

// Step k of an epoch on `set`, run by a rank that has not joined: an allreduce SUM (float32),
// an allreduce AVERAGE (float64) and an allgather (int32), all in flight together, then the
// scatter ops above and a barrier (a joined rank counts as arrived). active[q] says whether set
// rank q is still submitting at step k; joined ranks must count as zeros, zero rows, and not at
// all in AVERAGE's divisor. The names are the same every step, as in a training loop.
void joinStep(const std::string &tag, int32_t set, int k, const std::vector<bool> &active) {
  joinStepCollectives(tag, set, k, active);
  if (::testing::Test::HasFatalFailure()) return;
  joinStepScatter(tag, set, k, active);
  if (::testing::Test::HasFatalFailure()) return;
  MP_EXPECT_OK(hora_barrier(set)) << tag << " step " << k << ": barrier with joined ranks";
}

// One epoch on `set`: set rank q runs stepsOf(q) steps, then joins. Returns what hora_join said.
int runEpoch(const std::string &tag, int32_t set, const std::function<int(int)> &stepsOf) {
  const int me = hora_process_set_rank(set);
  const int n = hora_process_set_size(set);
  for (int k = 0; k < stepsOf(me); ++k) {
    std::vector<bool> active(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) active[static_cast<size_t>(q)] = stepsOf(q) > k;
    joinStep(tag, set, k, active);
    if (::testing::Test::HasFatalFailure()) break;
  }
  int last = -42;
  const hora_status_t s = hora_join(set, &last);
  EXPECT_EQ(mp::statusName(HORA_SUCCESS), mp::statusName(s)) << tag << ": hora_join: " << mp::lastError();
  return last;
}

// Every rank must have been told the same last rank.
void expectSameEverywhere(const std::string &name, int last, int32_t set = 0) {
  const auto rows = mp::allgatherRows(name, {last}, set);
  for (size_t q = 0; q < rows.size(); ++q)
    EXPECT_EQ(last, rows[q][0]) << name << ": set rank " << q << " was told another last rank";
}

// Rank r runs r + 1 steps: at step k, ranks 0..k-1 have joined. The last rank has the most data
// and is necessarily the last to join.
TEST(Join, UnevenStepsThenUsable) {
  const int n = mp::size();
  const int last = runEpoch("join.uneven", 0, [](int q) { return q + 1; });
  EXPECT_EQ(n - 1, last) << "last rank to join";
  expectSameEverywhere("join.uneven.last", last);
  // Nobody is joined any more: a normal allreduce has every rank's data.
  mp::expectGoodAllreduce("join.uneven.after", 1);
  mp::AllgatherCase ag("join.uneven.after_ag", 0, mp::f32(), [](int q) { return int64_t{q + 1}; }, {2}, 2);
  ag.run();
}

// Two epochs back to back, the second with the order reversed (rank 0 has the most data), then a
// third in which everyone joins at once.
TEST(Join, TwiceAcrossEpochs) {
  const int n = mp::size();
  const int first = runEpoch("join.epoch0", 0, [](int q) { return q + 1; });
  EXPECT_EQ(n - 1, first) << "epoch 0";
  const int second = runEpoch("join.epoch1", 0, [n](int q) { return n - q; });
  EXPECT_EQ(0, second) << "epoch 1";
  expectSameEverywhere("join.epoch1.last", second);
  const int third = runEpoch("join.epoch2", 0, [](int) { return 0; });
  EXPECT_GE(third, 0) << "epoch 2";
  EXPECT_LT(third, n) << "epoch 2";
  expectSameEverywhere("join.epoch2.last", third);
  mp::expectGoodAllreduce("join.epochs.after", 3);
}

// A broadcast whose root has joined has no data to send: INVALID_ARGUMENT on the other ranks.
// A broadcast from a rank that has not joined still works meanwhile.
TEST(Join, BroadcastFromJoinedRootFails) {
  const int me = mp::rank(), n = mp::size();
  int last = -42;
  if (me == 0) {
    MP_EXPECT_OK(hora_join(0, &last));
  } else {
    auto t = makeTensor(mp::f32(), {6});
    t->fill([](int64_t i) { return static_cast<double>(i); });
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_broadcast_async("join.bc.root0", t->dl(), 0, 0, &req));
    Request guard(req);
    const hora_status_t s = hora_wait(req);
    const std::string err = mp::lastError();
    EXPECT_EQ(mp::statusName(HORA_ERR_INVALID_ARGUMENT), mp::statusName(s)) << err;
    EXPECT_NE(std::string::npos, err.find("join.bc.root0")) << "message does not name the tensor: " << err;

    mp::BroadcastCase ok("join.bc.rootlast", 0, mp::f64(), {5}, n - 1, 4);
    ok.run();
    // The last rank holds back with one more op (which needs everyone else joined), so it is
    // the last to join.
    if (me == n - 1) {
      mp::AllreduceCase tail("join.bc.tail", 0, mp::f32(), {3}, HORA_OP_SUM, 5);
      tail.submit();
      if (tail.submitted()) {
        MP_EXPECT_OK(hora_wait(tail.request()));
      }
    }
    MP_EXPECT_OK(hora_join(0, &last));
  }
  EXPECT_EQ(n - 1, last);
  expectSameEverywhere("join.bc.last", last);
  mp::expectGoodAllreduce("join.bc.after", 6);
}

// Join on a process set: set ranks q run q + 1 steps on the set and join it; the last rank is
// reported within the set. The world is unaffected and both stay usable.
TEST(Join, OnProcessSet) {
  const int me = mp::rank(), n = mp::size();
  const std::vector<int> ranks = n >= 3 ? std::vector<int>{0, n / 2 + 1, n - 1} : mp::evenRanks(n);
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  const int32_t id = mp::createSet(sorted);
  if (mp::contains(sorted, me)) {
    const int last = runEpoch("join.set", id, [](int q) { return q + 1; });
    EXPECT_EQ(static_cast<int>(sorted.size()) - 1, last) << "last set rank to join";
    expectSameEverywhere("join.set.last", last, id);
    mp::expectGoodAllreduceIn(id, "join.set.after", 7);
  }
  // Everyone, including members that joined the set, contributes to the world's ops.
  mp::expectGoodAllreduce("join.set.world", 8);
  // Later tests must not depend on this set; a set engine left running also outlives a world
  // stopped by a peer (see test_set_shutdown.cpp).
  if (id > 0) {
    MP_EXPECT_OK(hora_process_set_destroy(id));
  }
}

// Everyone joins while some allreduces that every rank submitted are still in flight: they
// complete normally (with every rank's data) before or with the join.
TEST(Join, JoinWithOpsInFlight) {
  const int n = mp::size();
  std::vector<std::unique_ptr<mp::Case>> cases;
  for (int i = 0; i < 6; ++i)
    cases.push_back(std::make_unique<mp::AllreduceCase>("join.inflight" + std::to_string(i), 0, mp::f32(),
                                                        std::vector<int64_t>{32}, HORA_OP_SUM, i));
  for (auto &c : cases) c->submit();
  int last = -42;
  MP_EXPECT_OK(hora_join(0, &last));
  EXPECT_GE(last, 0);
  EXPECT_LT(last, n);
  for (auto &c : cases) c->check();
}

// Unnamed ops around a join: ranks call different numbers of unnamed allreduces before joining
// (that is the point of join), so per-rank call-order counters differ afterwards. Unnamed ops
// after the join must still pair up. Polls with a deadline instead of waiting, so a
// mismatch of auto-names shows up as a failure here rather than as a hang.
TEST(Join, UnnamedOpsAfterUnevenJoin) {
  const int me = mp::rank(), n = mp::size();
  for (int k = 0; k <= me; ++k) {
    std::vector<bool> active(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) active[static_cast<size_t>(q)] = q >= k;
    auto t = makeTensor(mp::f32(), {5});
    t->fill([&](int64_t j) { return sumInput(me, j, k); });
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_allreduce_async(nullptr, t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
    Request guard(req);
    MP_ASSERT_OK(hora_wait(req)) << "unnamed step " << k;
    EXPECT_TRUE(mp::matches(*t, [&](int64_t j) {
      double s = 0;
      for (int q = k; q < n; ++q) s += sumInput(q, j, k);
      return s;
    })) << "unnamed step " << k;
  }
  int last = -42;
  MP_ASSERT_OK(hora_join(0, &last));
  EXPECT_EQ(n - 1, last);

  auto t = makeTensor(mp::f32(), {9});
  mp::fillInputAs(*t, HORA_OP_SUM, 9, me, n);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async(nullptr, t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
  if (!mp::completesWithin(req, 10)) {
    // Left in flight on purpose: freeing it is safe (released on completion or at shutdown).
    hora_request_free(req);
    FAIL() << "an unnamed allreduce after an uneven join did not complete in 10 s: the ranks' "
              "auto-name counters disagree after join (rank "
           << me << " made " << me + 1 << " unnamed allreduces before joining)";
  }
  Request guard(req);
  MP_EXPECT_OK(hora_wait(req));
  EXPECT_TRUE(mp::matchesReductionOf(*t, HORA_OP_SUM, 9, 1.0, 1.0, n)) << "unnamed allreduce after join";
}

}  // namespace
