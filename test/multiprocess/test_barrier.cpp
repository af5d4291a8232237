// SPDX-License-Identifier: Apache-2.0
// Barrier: nobody leaves before the slowest rank arrived, checked on one shared monotonic clock.
#include <hora/hora.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mp_cases.h"
#include "mp_harness.h"
#include "mp_ops.h"

namespace {

using mp::Request;

// Ranks arrive at staggered times (rank r sleeps r * stepMs, in a rotating order so the last to
// arrive is not always the same rank), each records the monotonic time just before calling
// hora_barrier and just after it returns; every arrival must precede every departure.
void checkedBarrier(int32_t set, const std::string &tag, int round, int stepMs) {
  const int me = hora_process_set_rank(set), n = hora_process_set_size(set);
  const int delayRank = (me + round) % n;
  std::this_thread::sleep_for(std::chrono::milliseconds(delayRank * stepMs));
  const int64_t before = mp::monotonicNs();
  MP_ASSERT_OK(hora_barrier(set)) << tag;
  const int64_t after = mp::monotonicNs();
  const auto rows = mp::allgatherRows(tag + ".times." + std::to_string(round), {before, after}, set);
  ASSERT_EQ(static_cast<size_t>(n), rows.size()) << tag;
  int64_t lastArrival = rows[0][0], firstDeparture = rows[0][1];
  int lastRank = 0, firstRank = 0;
  for (int q = 0; q < n; ++q) {
    if (rows[static_cast<size_t>(q)][0] > lastArrival) {
      lastArrival = rows[static_cast<size_t>(q)][0];
      lastRank = q;
    }
    if (rows[static_cast<size_t>(q)][1] < firstDeparture) {
      firstDeparture = rows[static_cast<size_t>(q)][1];
      firstRank = q;
    }
  }
  EXPECT_LE(lastArrival, firstDeparture)
      << tag << " round " << round << ": set rank " << firstRank << " left the barrier "
      << (lastArrival - firstDeparture) / 1000 << " us before set rank " << lastRank << " arrived";
}

TEST(Barrier, NoRankLeavesBeforeTheSlowestArrives) {
  for (int round = 0; round < 3; ++round) checkedBarrier(0, "barrier.world", round, 60);
}

// Back-to-back barriers: each is its own (auto-named) op, so a fast rank must not pass two
// barriers while a slow one is in the first.
TEST(Barrier, ManyInARow) {
  for (int i = 0; i < 30; ++i) MP_ASSERT_OK(hora_barrier(0)) << "barrier " << i;
  checkedBarrier(0, "barrier.after_many", 0, 20);
}

// Barriers while collectives are in flight: the barrier neither waits for them nor breaks them.
TEST(Barrier, WithCollectivesInFlight) {
  std::vector<std::unique_ptr<mp::Case>> cases;
  for (int i = 0; i < 6; ++i) {
    cases.push_back(std::make_unique<mp::AllreduceCase>("barrier.inflight.ar" + std::to_string(i), 0,
                                                        mp::f32(), std::vector<int64_t>{64 + i},
                                                        HORA_OP_SUM, i));
    cases.push_back(std::make_unique<mp::AllgatherCase>(
        "barrier.inflight.ag" + std::to_string(i), 0, mp::f64(),
        [i](int q) { return int64_t{(q + i) % 3}; }, std::vector<int64_t>{2}, i));
  }
  for (auto &c : cases) c->submit();
  MP_EXPECT_OK(hora_barrier(0));
  for (auto &c : cases) c->check();
  checkedBarrier(0, "barrier.inflight", 1, 30);
}

// Evens and odds (disjoint) each run checked barriers at the same time; then the first and last
// rank.
TEST(Barrier, OnProcessSets) {
  const int me = mp::rank(), n = mp::size();
  const int32_t evens = mp::createSet(mp::evenRanks(n));
  const int32_t odds = n >= 2 ? mp::createSet(mp::oddRanks(n)) : -1;
  const int32_t ends = mp::createSet(n == 1 ? std::vector<int>{0} : std::vector<int>{0, n - 1});
  const int32_t mine = me % 2 == 0 ? evens : odds;
  for (int round = 0; round < 2; ++round) checkedBarrier(mine, "barrier.parity", round, 50);
  if (hora_process_set_rank(ends) >= 0) checkedBarrier(ends, "barrier.ends", 0, 50);
  checkedBarrier(0, "barrier.after_sets", 0, 10);
  // Collective: every rank destroys the same distinct ids; later tests must not depend on them.
  std::vector<int32_t> ids;
  for (int32_t id : {evens, odds, ends})
    if (id > 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  for (int32_t id : ids) MP_EXPECT_OK(hora_process_set_destroy(id));
}

TEST(Barrier, UnknownSetRejected) {
  mp::expectRejected("barrier on set 999", HORA_ERR_INVALID_ARGUMENT, hora_barrier(999), nullptr);
  mp::expectRejected("barrier on set -1", HORA_ERR_INVALID_ARGUMENT, hora_barrier(-1), nullptr);
  MP_EXPECT_OK(hora_barrier(0));
}

}  // namespace
