// SPDX-License-Identifier: Apache-2.0
// Shutdown with requests pending, then init again in the same process (its own binary).
#include <hora/hora.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mp_harness.h"

namespace {

using mp::HostTensor;
using mp::makeTensor;
using mp::Request;

const mp::DType &f32() { return mp::dtypeNamed("float32"); }

void ensureInitialized() {
  if (!hora_is_initialized()) {
    MP_ASSERT_OK(hora_init());
  }
}

void goodAllreduce(const std::string &name, int64_t salt) {
  auto t = makeTensor(f32(), {64});
  mp::fillInput(*t, HORA_OP_SUM, salt);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async(name.c_str(), t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
  Request guard(req);
  MP_ASSERT_OK(hora_wait(req)) << name;
  EXPECT_TRUE(mp::matchesReduction(*t, HORA_OP_SUM, salt, 1.0, 1.0)) << name;
}

// With one rank every op completes on its own, so "pending at shutdown" cannot be forced; a
// request that raced to completion is then fine too.
// n is the world size from before the shutdown (hora_size() is -1 now).
void expectShutDown(hora_request_t req, const std::string &name, int n) {
  const hora_status_t s = hora_wait(req);
  if (n > 1 || s != HORA_SUCCESS) {
    EXPECT_EQ(mp::statusName(HORA_ERR_SHUT_DOWN), mp::statusName(s)) << name << ": " << mp::lastError();
  }
  int done = 0;
  MP_EXPECT_OK(hora_poll(req, &done));
  EXPECT_EQ(1, done) << name;
}

TEST(Shutdown, PendingRequestCompletesWithShutDownThenReinit) {
  ensureInitialized();
  const int r = mp::rank(), n = mp::size();
  auto t = makeTensor(f32(), {64});
  mp::fillInput(*t, HORA_OP_SUM, 1);
  // Only rank 0 submits 'orphan': it can never complete (for n > 1).
  hora_request_t orphan = nullptr;
  if (r == 0) {
    MP_ASSERT_OK(hora_allreduce_async("orphan", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &orphan));
  }
  Request guard(orphan);
  // Let negotiation see it, so shutdown has to cancel a tensor the coordinator knows about.
  goodAllreduce("shutdown.gate", 2);

  MP_ASSERT_OK(hora_shutdown());
  EXPECT_EQ(0, hora_is_initialized());
  EXPECT_EQ(-1, hora_rank());
  EXPECT_EQ(-1, hora_size());
  EXPECT_EQ(-1, hora_local_rank());
  EXPECT_EQ(-1, hora_cross_size());
  if (orphan) expectShutDown(orphan, "orphan", n);

  // Not running: calls say so instead of crashing or hanging.
  hora_request_t late = nullptr;
  MP_EXPECT_STATUS(HORA_ERR_NOT_INITIALIZED,
                   hora_allreduce_async("late", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &late));
  MP_EXPECT_STATUS(HORA_ERR_NOT_INITIALIZED, hora_shutdown());

  MP_ASSERT_OK(hora_init()) << "re-init in the same process";
  EXPECT_EQ(r, mp::rank());
  EXPECT_EQ(n, mp::size());
  // The orphan's name is free in the new runtime.
  goodAllreduce("orphan", 3);
  goodAllreduce("after.reinit", 4);
  MP_EXPECT_OK(hora_shutdown());
}

// Submitted right before shutdown, with no chance to be negotiated: still completed, not lost.
TEST(Shutdown, PendingRightBeforeShutdown) {
  ensureInitialized();
  const int r = mp::rank(), n = mp::size();
  auto t = makeTensor(f32(), {8});
  hora_request_t orphan = nullptr;
  if (r == 0) {
    MP_ASSERT_OK(hora_allreduce_async("orphan2", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &orphan));
  }
  Request guard(orphan);
  MP_ASSERT_OK(hora_shutdown());
  if (orphan) expectShutDown(orphan, "orphan2", n);
  MP_ASSERT_OK(hora_init());
  goodAllreduce("after.reinit2", 5);
}

// Many pending requests, each submitted by one rank only; one thread blocked in hora_wait must
// be released by the shutdown.
TEST(Shutdown, EveryPendingRequestAndABlockedWaiter) {
  ensureInitialized();
  const int r = mp::rank(), n = mp::size();
  const int kCount = 50;
  std::vector<std::unique_ptr<HostTensor>> ts;
  std::vector<Request> reqs;
  for (int k = 0; k < kCount; ++k) {
    ts.push_back(makeTensor(f32(), {k + 1}));
    hora_request_t req = nullptr;
    const std::string name = "pending." + std::to_string(r) + "." + std::to_string(k);
    MP_ASSERT_OK(hora_allreduce_async(name.c_str(), ts.back()->dl(), ts.back()->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
    reqs.emplace_back(req);
  }
  hora_status_t blocked = HORA_SUCCESS;
  std::thread waiter([&] { blocked = hora_wait(reqs[0].get()); });
  // Gives the waiter time to block; the test is correct (only weaker) if it has not yet.
  goodAllreduce("shutdown.gate3", 6);
  MP_ASSERT_OK(hora_shutdown());
  waiter.join();
  if (n > 1 || blocked != HORA_SUCCESS) {
    EXPECT_EQ(mp::statusName(HORA_ERR_SHUT_DOWN), mp::statusName(blocked)) << "blocked waiter";
  }
  for (int k = 1; k < kCount; ++k) expectShutDown(reqs[k].get(), "pending." + std::to_string(k), n);
  MP_ASSERT_OK(hora_init());
  goodAllreduce("after.reinit3", 7);
  MP_EXPECT_OK(hora_shutdown());
}

}  // namespace
