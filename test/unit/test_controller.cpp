// SPDX-License-Identifier: Apache-2.0
// Negotiation across ranks (threads over an in-memory control plane): agreement, ordering,
// the response cache's steady state, invalidation, mismatches and shutdown.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "core/controller.h"
#include "thread_group.h"

namespace hora {
namespace {

using test::runRanks;
using test::ThreadControlPlane;
using test::ThreadGroup;

RequestMsg msg(const std::string &name, Shape shape, OpType op = OpType::kAllreduce) {
  RequestMsg m;
  m.name = name;
  m.op = op;
  m.shapes = {std::move(shape)};
  return m;
}

void add(PendingMap &pending, const RequestMsg &m) {
  auto request = std::make_shared<Request>(m, 0, std::vector<TensorArg>{});
  pending[request->name()] = request;  // the key views the request's own name
}

// One cycle as the engine runs it: negotiate, then retire what was answered.
Controller::Outcome cycle(Controller &c, PendingMap &pending, bool shutdown = false) {
  Controller::Outcome out = c.negotiate(pending, shutdown);
  for (const auto &r : out.responses) pending.erase(r->agreed.name);
  return out;
}

std::vector<std::string> names(const Controller::Outcome &o) {
  std::vector<std::string> out;
  for (const auto &r : o.responses) out.push_back(r->agreed.name);
  return out;
}

TEST(Controller, ShuffledSubmissionGivesOneOrderEverywhereAndTheCacheTakesOver) {
  constexpr int kRanks = 3, kTensors = 40;
  ThreadGroup group(kRanks);
  std::vector<std::vector<std::string>> order(kRanks);
  std::vector<int> rounds(kRanks, -1);
  std::vector<std::vector<std::string>> secondStep(kRanks);
  runRanks(kRanks, [&](int rank) {
    ThreadControlPlane plane(group, rank);
    Controller c(plane, 64);
    std::vector<int> ids(kTensors);
    for (int i = 0; i < kTensors; ++i) ids[static_cast<size_t>(i)] = i;
    std::mt19937 rng(static_cast<unsigned>(rank + 1));
    for (int step = 0; step < 2; ++step) {
      std::shuffle(ids.begin(), ids.end(), rng);
      PendingMap pending;
      for (int i : ids) add(pending, msg("t" + std::to_string(i), {i + 1}));
      auto out = cycle(c, pending);
      EXPECT_TRUE(pending.empty()) << "rank " << rank << " step " << step;
      for (const auto &r : out.responses) EXPECT_TRUE(r->ok()) << r->error;
      if (step == 0) order[static_cast<size_t>(rank)] = names(out);
      else {
        secondStep[static_cast<size_t>(rank)] = names(out);
        rounds[static_cast<size_t>(rank)] = out.coordinatorRounds;
      }
    }
  });
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_EQ(order[static_cast<size_t>(r)], order[0]);
    EXPECT_EQ(secondStep[static_cast<size_t>(r)], secondStep[0]);
  }
  EXPECT_EQ(order[0].size(), static_cast<size_t>(kTensors));
  EXPECT_EQ(secondStep[0].size(), static_cast<size_t>(kTensors));
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(rounds[static_cast<size_t>(r)], 0) << "rank " << r;
}

TEST(Controller, DeviceWorkIsAgreedOnlyWhenEveryRankOffers) {
  constexpr int kRanks = 3;
  ThreadGroup group(kRanks);
  std::vector<std::vector<bool>> agreed(kRanks);
  runRanks(kRanks, [&](int rank) {
    ThreadControlPlane plane(group, rank);
    Controller c(plane, 64);
    PendingMap pending;
    add(pending, msg("x", {4}));
    // Round 1: rank 2 does not hold its GPU's turn; round 2: every rank does; round 3: none.
    agreed[rank].push_back(c.negotiate(pending, false, rank != 2).deviceAgreed);
    agreed[rank].push_back(c.negotiate(pending, false, true).deviceAgreed);
    agreed[rank].push_back(c.negotiate(pending, false, false).deviceAgreed);
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(agreed[r], (std::vector<bool>{false, true, false})) << "rank " << r;
}

TEST(Controller, ATensorWaitsUntilEveryRankHasSubmittedIt) {
  ThreadGroup group(2);
  runRanks(2, [&](int rank) {
    ThreadControlPlane plane(group, rank);
    Controller c(plane, 16);
    PendingMap pending;
    add(pending, msg("a", {2}));
    if (rank == 0) add(pending, msg("late", {2}));
    auto first = cycle(c, pending);
    EXPECT_EQ(names(first), std::vector<std::string>{"a"});
    if (rank == 1) add(pending, msg("late", {2}));
    auto second = cycle(c, pending);
    EXPECT_EQ(names(second), std::vector<std::string>{"late"});
    EXPECT_TRUE(pending.empty());
  });
}

TEST(Controller, MismatchFailsOnEveryRankWithWhoSentWhat) {
  ThreadGroup group(4);
  std::vector<Response> got(4);
  runRanks(4, [&](int rank) {
    ThreadControlPlane plane(group, rank);
    Controller c(plane, 16);
    PendingMap pending;
    add(pending, msg("layer3.weight", {1024, rank == 1 ? 17 : 16}));
    auto out = cycle(c, pending);
    ASSERT_EQ(out.responses.size(), 1u);
    got[static_cast<size_t>(rank)] = *out.responses[0];
    // The runtime stays usable: the next op goes through.
    add(pending, msg("next", {3}));
    auto after = cycle(c, pending);
    ASSERT_EQ(after.responses.size(), 1u);
    EXPECT_TRUE(after.responses[0]->ok());
  });
  for (const Response &r : got) {
    EXPECT_EQ(r.status, HORA_ERR_MISMATCH);
    EXPECT_EQ(r.error,
              "allreduce 'layer3.weight': ranks disagree on shape: ranks 0,2,3 [1024,16]; rank 1 "
              "[1024,17]");
  }
}

TEST(Controller, AChangedRequestDropsTheCacheEntryOnEveryRank) {
  ThreadGroup group(3);
  runRanks(3, [&](int rank) {
    ThreadControlPlane plane(group, rank);
    Controller c(plane, 16);
    PendingMap pending;
    add(pending, msg("w", {4}));
    cycle(c, pending);
    EXPECT_EQ(c.cache().size(), 1);
    // Every rank now submits a new shape: the cached response must not be reused.
    add(pending, msg("w", {8}));
    auto out = cycle(c, pending);
    ASSERT_EQ(out.responses.size(), 1u);
    EXPECT_TRUE(out.responses[0]->ok());
    EXPECT_EQ(out.responses[0]->agreed.shapes[0], (Shape{8}));
    EXPECT_EQ(out.coordinatorRounds, 1);
    // Only rank 2 changes: that is a mismatch, not a stale cache hit on ranks 0 and 1.
    add(pending, msg("w", {rank == 2 ? 9 : 8}));
    out = cycle(c, pending);
    ASSERT_EQ(out.responses.size(), 1u);
    EXPECT_EQ(out.responses[0]->status, HORA_ERR_MISMATCH);
  });
}

TEST(Controller, EvictionWhileWaitingFallsBackToTheCoordinator) {
  // Capacity 2: rank 1 submits a cached name, then other tensors evict it before rank 0 submits.
  ThreadGroup group(2);
  runRanks(2, [&](int rank) {
    ThreadControlPlane plane(group, rank);
    Controller c(plane, 2);
    PendingMap pending;
    add(pending, msg("x", {1}));
    cycle(c, pending);  // x cached
    if (rank == 1) add(pending, msg("x", {1}));
    for (const char *n : {"y", "z"}) {
      add(pending, msg(n, {1}));
      auto out = cycle(c, pending);
      EXPECT_EQ(names(out), std::vector<std::string>{n});
    }
    if (rank == 0) add(pending, msg("x", {1}));
    auto out = cycle(c, pending);
    EXPECT_EQ(names(out), std::vector<std::string>{"x"});
    EXPECT_TRUE(pending.empty());
  });
}

TEST(Controller, ShutdownOnOneRankStopsEveryRank) {
  ThreadGroup group(3);
  runRanks(3, [&](int rank) {
    ThreadControlPlane plane(group, rank);
    Controller c(plane, 16);
    PendingMap pending;
    add(pending, msg("a", {1}));
    auto out = c.negotiate(pending, rank == 2);
    EXPECT_TRUE(out.shutdown);
    EXPECT_TRUE(out.responses.empty());
  });
}

TEST(Controller, CacheDisabledStillNegotiates) {
  ThreadGroup group(2);
  runRanks(2, [&](int rank) {
    ThreadControlPlane plane(group, rank);
    Controller c(plane, 0);
    for (int step = 0; step < 3; ++step) {
      PendingMap pending;
      add(pending, msg("a", {1}));
      add(pending, msg("b", {2}));
      auto out = cycle(c, pending);
      EXPECT_EQ(out.responses.size(), 2u);
      EXPECT_EQ(out.coordinatorRounds, 1);
    }
  });
}

TEST(Controller, JoinedRanksTakePartUntilEveryRankHasJoined) {
  // 3 ranks: rank 2 joins at once, rank 1 after one more op, rank 0 after two.
  constexpr int kRanks = 3;
  ThreadGroup group(kRanks);
  std::vector<std::vector<std::string>> seen(kRanks);
  std::vector<int64_t> lastJoined(kRanks, -2);
  runRanks(kRanks, [&](int rank) {
    ThreadControlPlane plane(group, rank);
    Controller c(plane, 16);
    PendingMap pending;
    // A cached op first, so the cache's bypass while someone is joined is exercised too.
    add(pending, msg("warm", {2}));
    cycle(c, pending);
    const int ops = 2 - rank;  // ops before joining
    for (int i = 0; i < ops; ++i) add(pending, msg(i == 0 ? "warm" : "x" + std::to_string(i), {2}));
    bool joined = false;
    // A fixed number of cycles on every rank keeps the cycles collective, as the engine does.
    for (int cycleNo = 0; cycleNo < 6; ++cycleNo) {
      if (!joined && pending.empty()) {  // hora_join comes once this rank's own ops are done
        add(pending, msg("join.noname.0", {}, OpType::kJoin));
        joined = true;
      }
      auto out = cycle(c, pending);
      for (const auto &p : out.responses) {
        const Response &r = *p;
        seen[static_cast<size_t>(rank)].push_back(r.agreed.name);
        if (r.agreed.op == OpType::kJoin) lastJoined[static_cast<size_t>(rank)] = r.firstDims.at(0);
        if (r.agreed.name == "warm") {
          EXPECT_EQ(r.joined, (std::vector<int32_t>{2}));
        }
        if (r.agreed.name == "x1") {
          EXPECT_EQ(r.joined, (std::vector<int32_t>{1, 2}));
        }
      }
    }
    EXPECT_TRUE(pending.empty()) << "rank " << rank;
  });
  for (int r = 0; r < kRanks; ++r) {
    // Every rank, joined or not, runs the same responses in the same order.
    EXPECT_EQ(seen[static_cast<size_t>(r)], (std::vector<std::string>{"warm", "x1", "join.noname.0"}))
        << "rank " << r;
    EXPECT_EQ(lastJoined[static_cast<size_t>(r)], 0);
  }
}

RequestMsg tombstone(const std::string &name, const std::string &why,
                     OpType op = OpType::kAllreduce) {
  RequestMsg m;
  m.name = name;
  m.op = op;
  m.rejected = why;
  return m;
}

// A rank refused the op before submitting it: its tombstone meets the others' requests at the
// coordinator and fails the name on every rank in that round, naming the rank and its reason.
// The name was cached (a hit on the other ranks): the tombstone drops the entry everywhere, so
// that the others' requests reach the coordinator in the same round instead of waiting as hits.
TEST(Controller, ATombstoneFailsTheNameOnEveryRankInOneRound) {
  constexpr int kRanks = 3;
  ThreadGroup group(kRanks);
  std::vector<Response> got(kRanks);
  std::vector<int> rounds(kRanks, -1);
  runRanks(kRanks, [&](int rank) {
    ThreadControlPlane plane(group, rank);
    Controller c(plane, 16);
    PendingMap pending;
    add(pending, msg("grad.w", {4}));
    cycle(c, pending);
    ASSERT_EQ(c.cache().size(), 1);
    // The next step: rank 1 refuses grad.w; the others submit it as before (cache hits).
    add(pending, rank == 1 ? tombstone("grad.w", "input: dtype (code 5) is not supported")
                           : msg("grad.w", {4}));
    auto out = cycle(c, pending);
    ASSERT_EQ(out.responses.size(), 1u) << "rank " << rank;
    got[static_cast<size_t>(rank)] = *out.responses[0];
    rounds[static_cast<size_t>(rank)] = out.coordinatorRounds;
    EXPECT_TRUE(pending.empty());
    EXPECT_EQ(c.cache().size(), 0) << "a failed name stays out of the cache";
    // The runtime goes on: the name works again, through the coordinator.
    add(pending, msg("grad.w", {4}));
    auto after = cycle(c, pending);
    ASSERT_EQ(after.responses.size(), 1u);
    EXPECT_TRUE(after.responses[0]->ok()) << after.responses[0]->error;
  });
  for (int r = 0; r < kRanks; ++r) {
    const Response &resp = got[static_cast<size_t>(r)];
    EXPECT_EQ(resp.status, HORA_ERR_MISMATCH) << "rank " << r;
    EXPECT_EQ(resp.error,
              "allreduce 'grad.w': rank 1 rejected it before submitting: input: dtype (code 5) "
              "is not supported")
        << "rank " << r;
    EXPECT_FALSE(resp.agreed.isTombstone()) << "the response describes the op the others sent";
    EXPECT_EQ(rounds[static_cast<size_t>(r)], 1) << "rank " << r;
  }
}

// Several ranks refused: every one is named with its reason; a tombstone of another op says so.
// Only tombstones: the name still fails everywhere (every rank's caller already had its error).
TEST(CheckAgreement, TombstonesDecideWhateverTheOthersSent) {
  RequestMsg a = msg("x", {4}), b = msg("x", {5}, OpType::kBroadcast);
  RequestMsg t1 = tombstone("x", "root 9 is outside", OpType::kBroadcast);
  RequestMsg t3 = tombstone("x", "data is NULL");
  Response r = checkAgreement(std::vector<const RequestMsg *>{&a, &t1, &b, &t3, nullptr});
  EXPECT_EQ(r.status, HORA_ERR_MISMATCH);
  EXPECT_EQ(r.error,
            "allreduce 'x': ranks 1,3 rejected it before submitting: rank 1: (its broadcast of "
            "that name) root 9 is outside; rank 3: data is NULL");
  EXPECT_EQ(r.joined, (std::vector<int32_t>{4}));
  EXPECT_FALSE(cacheable(r));
  r = checkAgreement(std::vector<RequestMsg>{t3, t3});
  EXPECT_EQ(r.status, HORA_ERR_MISMATCH);
  EXPECT_EQ(r.error, "allreduce 'x': ranks 0,1 rejected it before submitting: rank 0: data is "
                     "NULL; rank 1: data is NULL");
}

// HORA_JOIN_ALLREDUCE_ONLY (Horovod's join): with a rank joined, only allreduce runs. The other
// ops fail with UNSUPPORTED naming the joined ranks; without a joined rank, or in the default
// mode, they run as before.
TEST(CheckAgreement, AllreduceOnlyJoinModeRefusesTheOtherOpsWhileARankHasJoined) {
  const std::vector<std::pair<OpType, Shape>> ops = {{OpType::kAllgather, {2, 3}},
                                                     {OpType::kBroadcast, {4}},
                                                     {OpType::kAlltoall, {3, 2}},
                                                     {OpType::kReducescatter, {6}}};
  for (const auto &[op, shape] : ops) {
    RequestMsg m = msg("t", shape, op);
    if (op == OpType::kAlltoall) m.splits = {1, 1, 1, 0};
    const std::string name = opTypeName(op);
    Response zeroFill = checkAgreement(std::vector<const RequestMsg *>{&m, nullptr, &m, nullptr});
    EXPECT_TRUE(zeroFill.ok()) << name << ": " << zeroFill.error;
    RequestMsg strict = m;
    strict.joinMode = HORA_JOIN_ALLREDUCE_ONLY;
    Response r = checkAgreement(std::vector<const RequestMsg *>{&strict, nullptr, &strict, nullptr});
    EXPECT_EQ(r.status, HORA_ERR_UNSUPPORTED) << name;
    EXPECT_EQ(r.error, name + " 't': ranks 1,3 have joined (hora_join); under Horovod's join "
                              "semantics only allreduce runs while a rank has joined (join mode "
                              "HORA_JOIN_ALLREDUCE_ONLY, hora_set_join_mode)");
    r = checkAgreement(std::vector<const RequestMsg *>{&strict, &strict, nullptr});
    EXPECT_NE(r.error.find(name + " 't': rank 2 has joined"), std::string::npos) << r.error;
    // The stricter mode wins if the ranks differ.
    r = checkAgreement(std::vector<const RequestMsg *>{&m, &strict, nullptr});
    EXPECT_EQ(r.status, HORA_ERR_UNSUPPORTED) << name;
    // Nobody joined: the mode does not matter.
    r = checkAgreement(std::vector<const RequestMsg *>{&strict, &strict, &strict, &strict});
    EXPECT_TRUE(r.ok()) << name << ": " << r.error;
  }
  RequestMsg ar = msg("ar", {4});
  ar.joinMode = HORA_JOIN_ALLREDUCE_ONLY;
  Response r = checkAgreement(std::vector<const RequestMsg *>{&ar, nullptr});
  EXPECT_TRUE(r.ok()) << "allreduce runs with a rank joined: " << r.error;
  EXPECT_EQ(r.joined, (std::vector<int32_t>{1}));
}

TEST(CheckAgreement, JoinedRanksAreLeftOutAndABroadcastFromOneFails) {
  RequestMsg a = msg("t", {4}), b = msg("t", {4});
  Response r = checkAgreement(std::vector<const RequestMsg *>{&a, nullptr, &b});
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.joined, (std::vector<int32_t>{1}));
  RequestMsg bc = msg("b", {4}, OpType::kBroadcast);
  bc.root = 1;
  r = checkAgreement(std::vector<const RequestMsg *>{&bc, nullptr});
  EXPECT_EQ(r.status, HORA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.error.find("root rank 1 has joined"), std::string::npos) << r.error;
  RequestMsg g = msg("g", {3, 2}, OpType::kAllgather);
  r = checkAgreement(std::vector<const RequestMsg *>{nullptr, &g});
  EXPECT_EQ(r.firstDims, (std::vector<int64_t>{0, 3}));
}

TEST(CheckAgreement, AlltoallBuildsTheSplitMatrix) {
  RequestMsg a = msg("a2a", {3, 2}, OpType::kAlltoall), b = msg("a2a", {1, 2}, OpType::kAlltoall);
  a.splits = {1, 2};
  b.splits = {0, 1};
  Response r = checkAgreement(std::vector<RequestMsg>{a, b});
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.firstDims, (std::vector<int64_t>{1, 2, 0, 1}));
  b.shapes = {{1, 3}};
  r = checkAgreement(std::vector<RequestMsg>{a, b});
  EXPECT_EQ(r.error,
            "alltoall 'a2a': ranks disagree on rank or trailing dimensions: rank 0 [*,2]; rank 1 [*,3]");
}

TEST(CheckAgreement, ProcessSetRanksMustAgree) {
  RequestMsg a = msg("process_set_create.noname.0", {}, OpType::kProcessSetCreate);
  a.shapes.clear();
  RequestMsg b = a;
  a.splits = {0, 2};
  b.splits = {0, 1};
  Response r = checkAgreement(std::vector<RequestMsg>{a, b});
  EXPECT_EQ(r.status, HORA_ERR_MISMATCH);
  EXPECT_NE(r.error.find("disagree on ranks: rank 0 [0,2]; rank 1 [0,1]"), std::string::npos) << r.error;
}

TEST(CheckAgreement, AllgatherCollectsFirstDimsAndChecksTrailingOnes) {
  std::vector<RequestMsg> ok = {msg("g", {2, 3}, OpType::kAllgather),
                                msg("g", {0, 3}, OpType::kAllgather),
                                msg("g", {5, 3}, OpType::kAllgather)};
  Response r = checkAgreement(ok);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.firstDims, (std::vector<int64_t>{2, 0, 5}));

  std::vector<RequestMsg> bad = ok;
  bad[1].shapes[0] = {1, 4};
  r = checkAgreement(bad);
  EXPECT_EQ(r.status, HORA_ERR_MISMATCH);
  EXPECT_EQ(r.error,
            "allgather 'g': ranks disagree on rank or trailing dimensions: ranks 0,2 [*,3]; rank 1 "
            "[*,4]");
}

TEST(CheckAgreement, EveryFieldIsChecked) {
  struct Case {
    const char *field;
    std::function<void(RequestMsg &)> change;
  };
  const std::vector<Case> cases = {
      {"op", [](RequestMsg &m) { m.op = OpType::kBroadcast; }},
      {"dtype", [](RequestMsg &m) { m.dtype = DType::kFloat64; }},
      {"reduce op", [](RequestMsg &m) { m.reduceOp = ReduceOp::kMax; }},
      {"prescale", [](RequestMsg &m) { m.prescale = 2.0; }},
      {"postscale", [](RequestMsg &m) { m.postscale = 0.5; }},
      {"device type", [](RequestMsg &m) { m.device = Device{2, 0}; }},
      {"number of tensors", [](RequestMsg &m) { m.shapes.push_back({1}); }},
  };
  for (const Case &c : cases) {
    std::vector<RequestMsg> per = {msg("t", {4}), msg("t", {4}), msg("t", {4})};
    c.change(per[2]);
    Response r = checkAgreement(per);
    EXPECT_EQ(r.status, HORA_ERR_MISMATCH) << c.field;
    EXPECT_NE(r.error.find(std::string("disagree on ") + c.field), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("rank 2"), std::string::npos) << r.error;
  }
  std::vector<RequestMsg> bc = {msg("b", {4}, OpType::kBroadcast), msg("b", {4}, OpType::kBroadcast)};
  bc[1].root = 1;
  Response r = checkAgreement(bc);
  EXPECT_EQ(r.error, "broadcast 'b': ranks disagree on root: rank 0 0; rank 1 1");
  // Different GPUs per rank are expected: the device id is not compared.
  std::vector<RequestMsg> gpus = {msg("d", {4}), msg("d", {4})};
  gpus[0].device = Device{2, 0};
  gpus[1].device = Device{2, 1};
  EXPECT_TRUE(checkAgreement(gpus).ok());
}

}  // namespace
}  // namespace hora
