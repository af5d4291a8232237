// SPDX-License-Identifier: Apache-2.0
// Several user threads submitting, polling and waiting at once.
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

// Each thread owns its names; across ranks the threads interleave differently, which is exactly
// what negotiation by name must absorb.
void worker(int thread, int iterations, bool usePoll) {
  const DType dts[3] = {mp::dtypeNamed("float32"), mp::dtypeNamed("int32"), mp::dtypeNamed("bfloat16")};
  const int64_t counts[3] = {100, 7, 33};
  const hora_reduce_op_t ops[3] = {HORA_OP_SUM, HORA_OP_MAX, HORA_OP_AVERAGE};
  for (int it = 0; it < iterations; ++it) {
    std::unique_ptr<HostTensor> ts[3];
    Request reqs[3];
    for (int k = 0; k < 3; ++k) {
      const int64_t salt = thread * 10000 + it * 10 + k;
      ts[k] = makeTensor(dts[k], {counts[k]});
      mp::fillInput(*ts[k], ops[k], salt);
      const std::string name =
          "thr." + std::to_string(thread) + "." + std::to_string(it) + "." + std::to_string(k);
      hora_request_t req = nullptr;
      MP_EXPECT_OK(hora_allreduce_async(name.c_str(), ts[k]->dl(), ts[k]->dl(), ops[k], 1.0, 1.0, 0, &req))
          << name;
      reqs[k].reset(req);
    }
    for (int k = 0; k < 3; ++k) {
      if (!reqs[k]) continue;
      if (usePoll) {
        EXPECT_TRUE(mp::completesWithin(reqs[k].get(), 60, std::chrono::microseconds(0)))
            << "thread " << thread << " iteration " << it << " never done";
      }
      MP_EXPECT_OK(hora_wait(reqs[k].get())) << "thread " << thread << " iteration " << it;
      EXPECT_TRUE(mp::matchesReduction(*ts[k], ops[k], thread * 10000 + it * 10 + k, 1.0, 1.0))
          << "thread " << thread << " iteration " << it << " tensor " << k;
    }
  }
}

TEST(Threads, FourThreadsSubmitAndWait) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t, 25, false);
  for (auto &t : threads) t.join();
}

TEST(Threads, FourThreadsSubmitAndPoll) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, 10 + t, 10, true);
  for (auto &t : threads) t.join();
}

// One thread submits, another waits: requests are not tied to the submitting thread.
TEST(Threads, SubmitOnOneWaitOnAnother) {
  const int kCount = 50;
  std::vector<std::unique_ptr<HostTensor>> ts(kCount);
  std::vector<hora_request_t> reqs(kCount, nullptr);
  const DType &dt = mp::dtypeNamed("int64");
  std::thread submitter([&] {
    for (int k = 0; k < kCount; ++k) {
      ts[k] = makeTensor(dt, {k + 1});
      mp::fillInput(*ts[k], HORA_OP_PRODUCT, k);
      const std::string name = "handoff." + std::to_string(k);
      MP_EXPECT_OK(hora_allreduce_async(name.c_str(), ts[k]->dl(), ts[k]->dl(), HORA_OP_PRODUCT, 1.0, 1.0, 0, &reqs[k]));
    }
  });
  submitter.join();
  std::thread waiter([&] {
    for (int k = kCount - 1; k >= 0; --k) {
      if (!reqs[k]) continue;
      MP_EXPECT_OK(hora_wait(reqs[k])) << "handoff." << k;
      EXPECT_TRUE(mp::matchesReduction(*ts[k], HORA_OP_PRODUCT, k, 1.0, 1.0)) << "handoff." << k;
      hora_request_free(reqs[k]);
    }
  });
  waiter.join();
}

}  // namespace
