// SPDX-License-Identifier: Apache-2.0
// A thread in hora_wait runs its set's cycles itself while the engine thread is idle
// (HORA_CALLER_CYCLES=auto, sets on one host): what it leaves behind must still complete without
// another wait, the engine thread and callers must take turns on one set's cycles, and the results
// must be the same as with HORA_CALLER_CYCLES=off (meson runs this binary both ways).
#include <hora/hora.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mp_harness.h"

namespace {

using mp::DType;
using mp::HostTensor;
using mp::makeTensor;
using mp::Request;

struct Op {
  std::string name;
  int64_t salt;
  std::unique_ptr<HostTensor> t;
  Request req;
};

Op submitSum(const DType &dt, int64_t count, const std::string &name, int64_t salt) {
  Op op{name, salt, makeTensor(dt, {count}), nullptr};
  mp::fillInput(*op.t, HORA_OP_SUM, salt);
  hora_request_t req = nullptr;
  MP_EXPECT_OK(hora_allreduce_async(name.c_str(), op.t->dl(), op.t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req))
      << name;
  op.req.reset(req);
  return op;
}

// Rank 0 waits for an op every rank has submitted, while another of its ops waits for peers that
// submit it only later: the waiter's cycles complete the first and leave the second pending. No
// thread of rank 0 waits for the second (it only polls), so the engine thread has to take it over.
TEST(CallerCycles, WhatAWaiterLeavesPendingCompletesWithoutAnotherWait) {
  const DType &dt = mp::dtypeNamed("float32");
  for (int round = 0; round < 3; ++round) {
    const std::string suffix = "." + std::to_string(round);
    Op now = submitSum(dt, 1000, "cc.now" + suffix, 10 + round);
    if (mp::rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Op late = submitSum(dt, 777, "cc.late" + suffix, 20 + round);
    if (!now.req || !late.req) return;
    MP_ASSERT_OK(hora_wait(now.req.get())) << now.name;
    EXPECT_TRUE(mp::matchesReduction(*now.t, HORA_OP_SUM, now.salt, 1.0, 1.0)) << now.name;
    if (mp::rank() == 0) {
      ASSERT_TRUE(mp::completesWithin(late.req.get(), 60, std::chrono::milliseconds(1)))
          << late.name << " was left pending by a waiter and never completed";
    }
    MP_ASSERT_OK(hora_wait(late.req.get())) << late.name;
    EXPECT_TRUE(mp::matchesReduction(*late.t, HORA_OP_SUM, late.salt, 1.0, 1.0)) << late.name;
  }
}

// Batches of small ops, the pattern caller cycles are for: each batch negotiated from the response
// cache after the first, fused and run by the waiting thread.
TEST(CallerCycles, BatchesOfSmallOpsOnReusedNames) {
  for (const char *dtName : {"float32", "bfloat16", "int32"}) {
    const DType &dt = mp::dtypeNamed(dtName);
    for (int batch = 0; batch < 30; ++batch) {
      std::vector<Op> ops;
      for (int i = 0; i < 20; ++i) {
        ops.push_back(submitSum(dt, 1024 + i, std::string("cc.batch.") + dtName + "." + std::to_string(i),
                                batch * 100 + i));
      }
      for (Op &op : ops) {
        if (!op.req) continue;
        MP_EXPECT_OK(hora_wait(op.req.get())) << op.name << " batch " << batch;
        EXPECT_TRUE(mp::matchesReduction(*op.t, HORA_OP_SUM, op.salt, 1.0, 1.0)) << op.name << " batch " << batch;
      }
    }
  }
}

// Two threads wait at once on ops of one set, while the engine thread may be in a cycle too: one
// runs the cycles, the other finds them taken and waits; each op completes exactly once.
TEST(CallerCycles, TwoWaitersAndTheEngineTakeTurns) {
  const DType &dt = mp::dtypeNamed("int64");
  auto worker = [&](int thread) {
    for (int it = 0; it < 40; ++it) {
      std::vector<Op> ops;
      for (int i = 0; i < 5; ++i) {
        ops.push_back(submitSum(dt, 64 + thread, "cc.two." + std::to_string(thread) + "." + std::to_string(i),
                                thread * 1000 + it * 10 + i));
      }
      // In reverse: a waiter's own op may be the last of its cycle's.
      for (auto op = ops.rbegin(); op != ops.rend(); ++op) {
        if (!op->req) continue;
        MP_EXPECT_OK(hora_wait(op->req.get())) << op->name << " iteration " << it;
        EXPECT_TRUE(mp::matchesReduction(*op->t, HORA_OP_SUM, op->salt, 1.0, 1.0)) << op->name;
      }
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
}

}  // namespace
