// SPDX-License-Identifier: Apache-2.0
// Topology, init idempotence, status strings, thread-local last error, poll and request lifetime.
#include <hora/hora.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mp_harness.h"

namespace {

using mp::HostTensor;
using mp::makeTensor;
using mp::Request;

const mp::DType &f32() { return mp::dtypeNamed("float32"); }

void goodAllreduce(const std::string &name, int64_t salt) {
  auto t = makeTensor(f32(), {33});
  mp::fillInput(*t, HORA_OP_SUM, salt);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async(name.c_str(), t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
  Request guard(req);
  MP_ASSERT_OK(hora_wait(req));
  EXPECT_TRUE(mp::matchesReduction(*t, HORA_OP_SUM, salt, 1.0, 1.0)) << name;
}

TEST(Topology, RanksAreConsistent) {
  EXPECT_EQ(1, hora_is_initialized());
  const int r = hora_rank(), n = hora_size();
  ASSERT_GE(n, 1);
  ASSERT_GE(r, 0);
  ASSERT_LT(r, n);
  // Every rank of these tests runs on this one host.
  EXPECT_EQ(n, hora_local_size());
  EXPECT_EQ(r, hora_local_rank());
  EXPECT_EQ(1, hora_cross_size());
  EXPECT_EQ(0, hora_cross_rank());

  // Under Open MPI's launcher the world must be the launcher's world.
  if (const char *s = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(std::atoi(s), n);
  }
  if (const char *s = std::getenv("OMPI_COMM_WORLD_RANK")) {
    EXPECT_EQ(std::atoi(s), r);
  }
  if (const char *s = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    EXPECT_EQ(std::atoi(s), hora_local_rank());
  }
}

// Ranks are distinct and cover 0..n-1: gather every rank's view of the topology.
TEST(Topology, EveryRankSeesTheSameWorld) {
  const int r = hora_rank(), n = hora_size();
  auto t = makeTensor(mp::dtypeNamed("int32"), {1, 6});
  const int mine[6] = {r, n, hora_local_rank(), hora_local_size(), hora_cross_rank(),
                       hora_cross_size()};
  for (int c = 0; c < 6; ++c) t->set(c, mine[c]);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allgather_async("topology.gather", t->dl(), 0, &req));
  Request guard(req);
  MP_ASSERT_OK(hora_wait(req));
  const DLTensor *out = hora_request_output(req);
  ASSERT_NE(nullptr, out);
  ASSERT_EQ(2, out->ndim);
  ASSERT_EQ(n, out->shape[0]);
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(q, mp::readElement(*out, q * 6 + 0)) << "row " << q;
    EXPECT_EQ(n, mp::readElement(*out, q * 6 + 1)) << "row " << q;
    EXPECT_EQ(q, mp::readElement(*out, q * 6 + 2)) << "row " << q;
    EXPECT_EQ(n, mp::readElement(*out, q * 6 + 3)) << "row " << q;
    EXPECT_EQ(0, mp::readElement(*out, q * 6 + 4)) << "row " << q;
    EXPECT_EQ(1, mp::readElement(*out, q * 6 + 5)) << "row " << q;
  }
}

TEST(Init, SecondInitIsANoOp) {
  const int r = hora_rank(), n = hora_size();
  MP_EXPECT_OK(hora_init());
  EXPECT_EQ(1, hora_is_initialized());
  EXPECT_EQ(r, hora_rank());
  EXPECT_EQ(n, hora_size());
  goodAllreduce("init.after_second_init", 1);
}

TEST(Status, EveryStatusHasAString) {
  std::set<std::string> seen;
  for (int s = HORA_SUCCESS; s <= HORA_ERR_INTERNAL; ++s) {
    const char *str = hora_status_string(static_cast<hora_status_t>(s));
    ASSERT_NE(nullptr, str) << "status " << s;
    EXPECT_GT(std::strlen(str), 0u) << "status " << s;
    // Static storage: a second call gives the same text.
    EXPECT_STREQ(str, hora_status_string(static_cast<hora_status_t>(s)));
    seen.insert(str);
  }
  EXPECT_EQ(11u, seen.size()) << "every status names its own class";
  // A value outside the enum must not crash the caller.
  EXPECT_NE(nullptr, hora_status_string(static_cast<hora_status_t>(42)));
}

// A failure on one thread must not be visible on another (NCCL's global buffer races).
TEST(LastError, IsThreadLocal) {
  auto t = makeTensor(f32(), {4});
  hora_request_t req = nullptr;
  MP_EXPECT_STATUS(HORA_ERR_INVALID_ARGUMENT,
                   hora_allreduce_async("lasterror.main", nullptr, t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
  const std::string mainError = mp::lastError();
  EXPECT_FALSE(mainError.empty());

  std::string freshOnOther = "unset", afterFailOnOther;
  std::thread other([&] {
    freshOnOther = mp::lastError();
    hora_request_t r2 = nullptr;
    // root -1 is out of range: a different failure with a different name.
    const hora_status_t s = hora_broadcast_async("lasterror.other", t->dl(), -1, 0, &r2);
    EXPECT_EQ(mp::statusName(HORA_ERR_INVALID_ARGUMENT), mp::statusName(s));
    afterFailOnOther = mp::lastError();
  });
  other.join();
  EXPECT_EQ("", freshOnOther) << "a new thread has no last error";
  EXPECT_FALSE(afterFailOnOther.empty());
  EXPECT_EQ(mainError, mp::lastError()) << "the other thread's failure leaked into this one";
}

// Two threads failing at the same time each read their own message.
TEST(LastError, ConcurrentFailuresStayApart) {
  std::atomic<int> crossTalk{0}, missing{0};
  auto worker = [&](const std::string &tag) {
    auto t = makeTensor(f32(), {4});
    for (int i = 0; i < 500; ++i) {
      const std::string name = tag + "." + std::to_string(i);
      hora_request_t req = nullptr;
      // Unknown process set: INVALID_ARGUMENT, and the message names the tensor.
      const hora_status_t s =
          hora_allreduce_async(name.c_str(), t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 12345, &req);
      if (s != HORA_ERR_INVALID_ARGUMENT) {
        ++missing;
        if (s == HORA_SUCCESS) hora_request_free(req);
        continue;
      }
      const std::string e = mp::lastError();
      if (e.empty()) ++missing;
      const std::string other = tag == "threadA" ? "threadB." : "threadA.";
      if (e.find(other) != std::string::npos) ++crossTalk;
    }
  };
  std::thread a(worker, "threadA"), b(worker, "threadB");
  a.join();
  b.join();
  EXPECT_EQ(0, crossTalk.load()) << "a thread read the other thread's error";
  EXPECT_EQ(0, missing.load()) << "a failed call left no error (or did not fail)";
}

TEST(Completion, PollReportsDoneWithoutWaiting) {
  auto t = makeTensor(f32(), {1000});
  mp::fillInput(*t, HORA_OP_SUM, 3);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async("poll.a", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
  Request guard(req);
  ASSERT_TRUE(mp::completesWithin(req, 60, std::chrono::microseconds(100))) << "poll.a never done";
  MP_EXPECT_OK(hora_wait(req));
  EXPECT_TRUE(mp::matchesReduction(*t, HORA_OP_SUM, 3, 1.0, 1.0));
  int again = 0;
  MP_EXPECT_OK(hora_poll(req, &again));
  EXPECT_EQ(1, again) << "a completed request stays done";
}

TEST(Completion, WaitOnAnotherThread) {
  auto t = makeTensor(mp::dtypeNamed("float64"), {257});
  mp::fillInput(*t, HORA_OP_MAX, 4);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async("wait.other_thread", t->dl(), t->dl(), HORA_OP_MAX, 1.0, 1.0, 0, &req));
  Request guard(req);
  hora_status_t s = HORA_ERR_INTERNAL;
  std::thread waiter([&] { s = hora_wait(req); });
  waiter.join();
  EXPECT_EQ(mp::statusName(HORA_SUCCESS), mp::statusName(s));
  EXPECT_TRUE(mp::matchesReduction(*t, HORA_OP_MAX, 4, 1.0, 1.0));
}

// Freeing a request still in flight is allowed; the op completes and later ops are unaffected.
TEST(Completion, FreeWhileInFlight) {
  // Leaked on purpose: the runtime may touch it until the freed request completes, which this
  // test cannot observe.
  static HostTensor *const orphanBuffer = new HostTensor(f32(), {4096});
  mp::fillInput(*orphanBuffer, HORA_OP_SUM, 9);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async("free.in_flight", orphanBuffer->dl(), orphanBuffer->dl(),
                                    HORA_OP_SUM, 1.0, 1.0, 0, &req));
  hora_request_free(req);
  goodAllreduce("free.after", 10);
}

TEST(Completion, NullRequestHandles) {
  hora_request_free(nullptr);  // documented as ignored
  MP_EXPECT_STATUS(HORA_ERR_INVALID_ARGUMENT, hora_wait(nullptr));
  int done = 0;
  MP_EXPECT_STATUS(HORA_ERR_INVALID_ARGUMENT, hora_poll(nullptr, &done));
  EXPECT_EQ(nullptr, hora_request_output(nullptr));

  auto t = makeTensor(f32(), {8});
  mp::fillInput(*t, HORA_OP_SUM, 2);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async("poll.null_done", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
  Request guard(req);
  MP_EXPECT_STATUS(HORA_ERR_INVALID_ARGUMENT, hora_poll(req, nullptr));
  MP_EXPECT_OK(hora_wait(req));
  EXPECT_TRUE(mp::matchesReduction(*t, HORA_OP_SUM, 2, 1.0, 1.0));
}

}  // namespace
