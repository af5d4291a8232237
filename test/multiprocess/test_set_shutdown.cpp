// SPDX-License-Identifier: Apache-2.0
// Process sets across shutdown, re-init and destroy with requests pending (its own binary).
#include <hora/hora.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mp_cases.h"
#include "mp_harness.h"
#include "mp_ops.h"
#include "time_scale.h"

namespace {

using mp::makeTensor;
using mp::Request;

void ensureInitialized() {
  if (!hora_is_initialized()) {
    MP_ASSERT_OK(hora_init());
  }
}

std::vector<int> endRanks(int n) { return n == 1 ? std::vector<int>{0} : std::vector<int>{0, n - 1}; }

// An op on a set pending at hora_shutdown completes with SHUT_DOWN; after hora_init the old
// set ids are gone and sets can be created again.
TEST(SetShutdown, PendingSetOpAtShutdownThenReinit) {
  ensureInitialized();
  const int me = mp::rank(), n = mp::size();
  const std::vector<int> ranks = endRanks(n);
  const int32_t id = mp::createSet(ranks);
  auto t = makeTensor(mp::f32(), {8});
  hora_request_t orphan = nullptr;
  if (mp::contains(ranks, me)) {
    mp::expectGoodAllreduceIn(id, "ss.before", 1);
    // Only set rank 0 submits it: it cannot complete while the set has another member.
    if (hora_process_set_rank(id) == 0) {
      MP_ASSERT_OK(hora_allreduce_async("ss.orphan", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, id, &orphan));
    }
  }
  Request guard(orphan);
  mp::expectGoodAllreduce("ss.gate", 2);
  MP_ASSERT_OK(hora_shutdown());
  if (orphan) {
    const hora_status_t s = hora_wait(orphan);
    if (ranks.size() > 1 || s != HORA_SUCCESS) {
      EXPECT_EQ(mp::statusName(HORA_ERR_SHUT_DOWN), mp::statusName(s)) << mp::lastError();
    }
  }
  MP_ASSERT_OK(hora_init());
  if (id != 0) {
    EXPECT_EQ(-1, hora_process_set_size(id)) << "a set of the previous runtime survived re-init";
    hora_request_t req = nullptr;
    mp::expectRejected("allreduce on a set of the previous runtime", HORA_ERR_INVALID_ARGUMENT,
                       hora_allreduce_async("ss.stale", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, id, &req), req);
  }
  const int32_t again = mp::createSet(ranks);
  if (mp::contains(ranks, me)) mp::expectGoodAllreduceIn(again, "ss.after", 3);
  mp::expectGoodAllreduce("ss.world_after", 4);
}

// Destroying a set while one member has an op pending on it: the op completes with SHUT_DOWN
// (README: requests still pending in the set), nothing hangs, and the world goes on.
TEST(SetShutdown, DestroyWithPendingOp) {
  ensureInitialized();
  const int n = mp::size();
  if (n < 2) GTEST_SKIP() << "needs a set that is not the world";
  const std::vector<int> ranks = n >= 3 ? endRanks(n) : std::vector<int>{1};
  const int32_t id = mp::createSet(ranks);
  ASSERT_GT(id, 0);
  auto t = makeTensor(mp::f32(), {8});
  hora_request_t orphan = nullptr;
  if (hora_process_set_rank(id) == 0) {
    MP_ASSERT_OK(hora_allreduce_async("ss.destroy.orphan", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, id, &orphan));
  }
  Request guard(orphan);
  mp::expectGoodAllreduce("ss.destroy.gate", 5);
  MP_ASSERT_OK(hora_process_set_destroy(id));
  if (orphan && ranks.size() > 1) {
    const hora_status_t s = hora_wait(orphan);
    EXPECT_EQ(mp::statusName(HORA_ERR_SHUT_DOWN), mp::statusName(s)) << "an op pending in a destroyed set: "
                                                                     << mp::lastError();
  }
  mp::expectGoodAllreduce("ss.destroy.after", 6);
}

// Rank 1 (in no set) calls hora_shutdown while every other rank has world work pending, so
// the whole world stops: the others' pending ops complete with SHUT_DOWN and
// hora_is_initialized() drops to 0 there. The process sets of those ranks must stop with it: a
// rank that is told the runtime is down must not still be running a set's engine (at process exit
// that thread would keep its set's peers waiting, and MPI would be finalized under it).
TEST(SetShutdown, PeerShutdownStopsProcessSetsToo) {
  ensureInitialized();
  const int me = mp::rank(), n = mp::size();
  if (n < 3) GTEST_SKIP() << "needs a set {0, n-1} and a rank outside it";
  const std::vector<int> ranks = endRanks(n);
  const int32_t id = mp::createSet(ranks);
  const bool member = mp::contains(ranks, me);
  if (member) mp::expectGoodAllreduceIn(id, "ss.peer.before", 7);
  mp::expectGoodAllreduce("ss.peer.gate", 8);

  if (me == 1) {
    MP_EXPECT_OK(hora_shutdown());
  } else {
    // Pending world work keeps this rank's engine negotiating, so it sees rank 1's shutdown.
    auto t = makeTensor(mp::f32(), {4});
    hora_request_t orphan = nullptr;
    const std::string name = "ss.peer.orphan." + std::to_string(me);
    MP_ASSERT_OK(hora_allreduce_async(name.c_str(), t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &orphan));
    Request guard(orphan);
    const hora_status_t s = hora_wait(orphan);
    EXPECT_EQ(mp::statusName(HORA_ERR_SHUT_DOWN), mp::statusName(s)) << mp::lastError();
    EXPECT_EQ(0, hora_is_initialized()) << "the world stopped, yet the runtime reports it runs";
    if (member) {
      // Set rank 0 and set rank 1 both try an op on the set. If the set's engines still run,
      // the op succeeds; it must not.
      hora_request_t req = nullptr;
      auto u = makeTensor(mp::f32(), {4});
      const hora_status_t submitted =
          hora_allreduce_async("ss.peer.set_after", u->dl(), u->dl(), HORA_OP_SUM, 1.0, 1.0, id, &req);
      Request g2(submitted == HORA_SUCCESS ? req : nullptr);
      hora_status_t result = submitted;
      if (submitted == HORA_SUCCESS) {
        // Bounded: if only one side's set engine survived, the op would wait forever.
        // A failing poll is an answer too (the set is gone): not a test failure here.
        int done = 0;
        const auto deadline = std::chrono::steady_clock::now() + hora_test::scaled(10);
        while (!done && std::chrono::steady_clock::now() < deadline) {
          if (hora_poll(req, &done) != HORA_SUCCESS) done = 1;
          if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        result = done ? hora_wait(req) : HORA_ERR_TIMEOUT;
        if (!done) (void)g2.release();  // still in flight: keep its tensor alive
        if (!done) (void)u.release();
      }
      EXPECT_NE(mp::statusName(HORA_SUCCESS), mp::statusName(result))
          << "an allreduce on process set " << id << " succeeded after a peer's hora_shutdown stopped "
          << "the world on this rank (hora_is_initialized() = " << hora_is_initialized()
          << "): the set's engine outlived the runtime";
    }
    // Every rank should call hora_shutdown; on a runtime stopped by a peer it must not hang.
    const hora_status_t sd = hora_shutdown();
    EXPECT_TRUE(sd == HORA_SUCCESS || sd == HORA_ERR_NOT_INITIALIZED) << mp::statusName(sd) << ": " << mp::lastError();
  }
  MP_ASSERT_OK(hora_init());
  mp::expectGoodAllreduce("ss.peer.reinit", 10);
  const int32_t again = mp::createSet(ranks);
  if (member) mp::expectGoodAllreduceIn(again, "ss.peer.set_reinit", 11);
}

}  // namespace
