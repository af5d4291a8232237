// SPDX-License-Identifier: Apache-2.0
// Auto-naming: NULL names pair up by call order within (process set, op), many in flight.
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
using mp::ReducescatterCase;

// Shapes differ per call, so ops paired out of order would fail with MISMATCH (or, for shapes
// that happen to agree, with wrong values: the salt differs per call too).
TEST(AutoName, ManyUnnamedAllreducesInFlight) {
  std::vector<std::unique_ptr<Case>> cases;
  for (int i = 0; i < 40; ++i)
    cases.push_back(std::make_unique<AllreduceCase>("unnamed allreduce #" + std::to_string(i), 0, mp::f32(),
                                                    std::vector<int64_t>{i + 1, 3}, HORA_OP_SUM, i,
                                                    1.0, 1.0, /*unnamed=*/true));
  for (auto &c : cases) c->submit();
  for (auto it = cases.rbegin(); it != cases.rend(); ++it) (*it)->check();
}

TEST(AutoName, ManyUnnamedAllgathersInFlight) {
  std::vector<std::unique_ptr<Case>> cases;
  for (int i = 0; i < 30; ++i)
    cases.push_back(std::make_unique<AllgatherCase>("unnamed allgather #" + std::to_string(i), 0, mp::f64(),
                                                    [i](int q) { return int64_t{(q + i) % 3}; },
                                                    std::vector<int64_t>{i % 4 + 1}, i, /*unnamed=*/true));
  mp::runAll(cases);
}

// Counters are per op: each rank interleaves allreduces, allgathers, broadcasts, alltoalls and
// reducescatters in its own rank-dependent order, keeping only the order within each op.
TEST(AutoName, CountersArePerOp) {
  const int r = mp::rank(), n = mp::size();
  const int kPerOp = 6;
  std::vector<std::vector<std::unique_ptr<Case>>> perOp(5);
  for (int i = 0; i < kPerOp; ++i) {
    const std::string k = " #" + std::to_string(i);
    perOp[0].push_back(std::make_unique<AllreduceCase>("unnamed allreduce" + k, 0, mp::f32(),
                                                       std::vector<int64_t>{i + 2}, HORA_OP_MAX, i, 1.0,
                                                       1.0, true));
    perOp[1].push_back(std::make_unique<AllgatherCase>("unnamed allgather" + k, 0, mp::i32(),
                                                       [i](int q) { return int64_t{q + i % 2}; },
                                                       std::vector<int64_t>{i + 1}, i, true));
    perOp[2].push_back(std::make_unique<BroadcastCase>("unnamed broadcast" + k, 0, mp::f32(),
                                                       std::vector<int64_t>{i + 3}, i % n, i, true));
    perOp[3].push_back(std::make_unique<AlltoallCase>("unnamed alltoall" + k, 0, mp::f32(),
                                                      [i](int s, int d) { return int64_t{(s + d + i) % 3}; },
                                                      std::vector<int64_t>{i + 1}, i, false, true));
    perOp[4].push_back(std::make_unique<ReducescatterCase>("unnamed reducescatter" + k, 0, mp::f32(),
                                                           std::vector<int64_t>{n + i, 2}, HORA_OP_SUM, i, true));
  }
  // Round-robin over the ops starting at a rank-dependent op: the global submission order differs
  // per rank, the order within each op does not.
  for (int i = 0; i < kPerOp; ++i)
    for (int o = 0; o < 5; ++o) perOp[static_cast<size_t>((o + r) % 5)][static_cast<size_t>(i)]->submit();
  for (auto &v : perOp)
    for (auto &c : v) c->check();
}

// Counters are per process set: unnamed ops on the world and on two sets, interleaved in a
// rank-dependent way. (At small sizes a set may be the world or the other set, so sets are
// deduplicated by id: interleaving two lists on one set would legitimately mismatch.)
TEST(AutoName, CountersArePerProcessSet) {
  const int r = mp::rank(), n = mp::size();
  const int32_t evens = mp::createSet(mp::evenRanks(n));
  const int32_t ends = mp::createSet(n == 1 ? std::vector<int>{0} : std::vector<int>{0, n - 1});
  std::vector<int32_t> ids = {0};
  for (int32_t id : {evens, ends})
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  const size_t nsets = ids.size();
  std::vector<std::vector<std::unique_ptr<Case>>> perSet(nsets);
  for (size_t s = 0; s < nsets; ++s) {
    if (hora_process_set_rank(ids[s]) < 0) continue;
    for (int i = 0; i < 8; ++i)
      perSet[s].push_back(std::make_unique<AllreduceCase>(
          "unnamed allreduce #" + std::to_string(i) + " on set " + std::to_string(ids[s]), ids[s], mp::f32(),
          std::vector<int64_t>{static_cast<int64_t>(s) * 10 + i + 1}, HORA_OP_SUM,
          10 * static_cast<int64_t>(s) + i, 1.0, 1.0, true));
  }
  for (int i = 0; i < 8; ++i)
    for (size_t s = 0; s < nsets; ++s) {
      auto &v = perSet[(s + static_cast<size_t>(r)) % nsets];
      if (!v.empty()) v[static_cast<size_t>(i)]->submit();
    }
  for (auto &v : perSet)
    for (auto &c : v) c->check();
  // Later tests must not depend on these sets (collective: every rank destroys the same ids).
  for (int32_t id : ids) {
    if (id > 0) {
      MP_EXPECT_OK(hora_process_set_destroy(id));
    }
  }
}

// Unnamed and named ops mixed, over several steps: names given by the user never shift the
// counters, and steps do not collide with each other.
TEST(AutoName, MixedWithNamedAcrossSteps) {
  for (int step = 0; step < 4; ++step) {
    std::vector<std::unique_ptr<Case>> cases;
    for (int i = 0; i < 10; ++i) {
      const bool unnamed = i % 2 == 0;
      cases.push_back(std::make_unique<AllreduceCase>("mix.step" + std::to_string(step) + "." + std::to_string(i),
                                                      0, mp::f64(), std::vector<int64_t>{i + 4}, HORA_OP_SUM,
                                                      step * 10 + i, 1.0, 1.0, unnamed));
    }
    mp::runAll(cases);
  }
}

// Unnamed ops submitted from a loop of training steps keep pairing after a barrier and after a
// failed (refused) unnamed call. A refused call takes its name like the call the other ranks make
// at that point (its tombstone carries it, see docs/faults-misuse.md), so that theirs fails
// instead of pairing with this rank's next call.
TEST(AutoName, RefusedCallTakesItsName) {
  auto bad = mp::makeTensor(mp::f32(), {3});
  hora_request_t req = nullptr;
  // Refused at submission on every rank the same way: AVERAGE on int32 is UNSUPPORTED.
  auto ints = mp::makeTensor(mp::i32(), {3});
  mp::expectRejected("unnamed AVERAGE on int32", HORA_ERR_UNSUPPORTED,
                     hora_allreduce_async(nullptr, ints->dl(), ints->dl(), HORA_OP_AVERAGE, 1.0, 1.0, 0, &req), req);
  // Refused on rank 0 only (an output of the wrong size) while the others make the same call
  // correctly: theirs fails, naming rank 0. A refusal that took no name (and told nobody) would
  // leave theirs waiting, to pair with rank 0's next unnamed allreduce.
  if (mp::rank() == 0) {
    auto wrong = mp::makeTensor(mp::f32(), {4});
    req = nullptr;
    mp::expectRejected("unnamed allreduce with a mis-sized output", HORA_ERR_INVALID_ARGUMENT,
                       hora_allreduce_async(nullptr, bad->dl(), wrong->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req), req);
  } else {
    req = nullptr;
    MP_ASSERT_OK(hora_allreduce_async(nullptr, bad->dl(), bad->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
    mp::Request guard(req);
    if (!mp::completesWithin(req, 10)) {
      ADD_FAILURE() << "the unnamed allreduce that rank 0 refused is still waiting for it";
      (void)guard.release();
      (void)bad.release();  // still in flight: its tensor must outlive it
      return;
    }
    const hora_status_t s = hora_wait(req);
    EXPECT_EQ(mp::statusName(HORA_ERR_MISMATCH), mp::statusName(s)) << mp::lastError();
    EXPECT_NE(std::string::npos, mp::lastError().find("rank 0 rejected")) << mp::lastError();
  }
  MP_EXPECT_OK(hora_barrier(0));
  std::vector<std::unique_ptr<Case>> cases;
  for (int i = 0; i < 5; ++i)
    cases.push_back(std::make_unique<AllreduceCase>("unnamed after refusal #" + std::to_string(i), 0, mp::f32(),
                                                    std::vector<int64_t>{2 * i + 1}, HORA_OP_SUM, i, 1.0, 1.0,
                                                    true));
  for (auto &c : cases) c->submit();
  for (auto &c : cases) {
    if (!c->completesWithin(10)) {
      ADD_FAILURE() << c->name() << " did not complete in 10 s: the refused unnamed call on rank 0 "
                    << "left its auto-names out of step with the other ranks'";
      (void)c.release();  // still in flight: its tensor must outlive it, so leak both
      continue;
    }
    c->check();
  }
}

}  // namespace
