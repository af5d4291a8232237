// SPDX-License-Identifier: Apache-2.0
// One-sided refusals (hora_reject, and the op calls' own bad arguments) fail the other ranks' op
// of that name at once instead of leaving it waiting; join modes (hora_set_join_mode).
#include <hora/hora.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "mp_cases.h"
#include "mp_harness.h"
#include "mp_ops.h"

namespace {

using mp::HostTensor;
using mp::makeTensor;
using mp::Request;

// Well under HORA_STALL_WARNING_S (60 s): the refusal must reach the others in one negotiation,
// not by a timeout. A hang turns into this test's own failure.
constexpr double kPromptS = 10;

int refuser() { return mp::size() - 1; }  // the highest rank: not the coordinator

// "rank 1" / "ranks 1,2" / "ranks 1-3", as hora's messages list ranks.
std::string rankWords(int first, int last) {
  if (first == last) return "rank " + std::to_string(first);
  return "ranks " + std::to_string(first) + (last == first + 1 ? "," : "-") + std::to_string(last);
}

bool hasAll(const std::string &text, const std::vector<std::string> &words, std::string *missing) {
  for (const std::string &w : words) {
    if (text.find(w) == std::string::npos) {
      *missing = w;
      return false;
    }
  }
  return true;
}

// `req` (a valid op of this rank) fails promptly with MISMATCH, and the message has every word.
void expectFailsPromptly(hora_request_t req, const std::string &what,
                         const std::vector<std::string> &words) {
  const auto start = std::chrono::steady_clock::now();
  if (!mp::completesWithin(req, kPromptS)) {
    ADD_FAILURE() << what << ": still waiting after " << kPromptS
                  << " s: the refusal on another rank never reached this one";
    return;
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const hora_status_t s = hora_wait(req);
  const std::string err = mp::lastError();
  EXPECT_EQ(mp::statusName(HORA_ERR_MISMATCH), mp::statusName(s)) << what << ": '" << err << "'";
  std::string missing;
  EXPECT_TRUE(hasAll(err, words, &missing))
      << what << ": message lacks '" << missing << "': '" << err << "'";
  EXPECT_LT(took, kPromptS) << what;
}

// A refusal in flight leaks its tensor on purpose if the test fails while it hangs: the runtime
// may still write into it.
HostTensor *leaked(const mp::DType &dt, std::vector<int64_t> shape) {
  return new HostTensor(dt, std::move(shape));
}

// --- refusals by the op calls themselves --------------------------------------------------

// The highest rank passes a root outside the set; the others a good broadcast of the name.
TEST(Reject, BroadcastRootOutOfRangeOnOneRank) {
  const int me = mp::rank(), n = mp::size();
  HostTensor *t = leaked(mp::f32(), {6});
  t->fill([](int64_t j) { return static_cast<double>(j); });
  hora_request_t req = nullptr;
  if (me == refuser()) {
    mp::expectRejected("broadcast root n", HORA_ERR_INVALID_ARGUMENT,
                       hora_broadcast_async("rj.bc_root", t->dl(), n, 0, &req), req);
  } else {
    MP_ASSERT_OK(hora_broadcast_async("rj.bc_root", t->dl(), 0, 0, &req));
    Request guard(req);
    expectFailsPromptly(req, "broadcast",
                        {"broadcast 'rj.bc_root'", "rank " + std::to_string(refuser()) + " rejected",
                         "root " + std::to_string(n) + " is outside"});
  }
  mp::expectGoodAllreduce("rj.bc_root.after", 1);
  mp::expectGoodAllreduce("rj.bc_root", 2);  // the name is free again on every rank
}

// A dtype hora does not know on one rank, and at 3 ranks a second refusal with another reason
// on another rank: the message names both ranks and both reasons.
TEST(Reject, AllreduceBadDtypeOnOneOrTwoRanks) {
  const int me = mp::rank(), n = mp::size();
  HostTensor *t = leaked(mp::f32(), {4, 2});
  mp::fillInput(*t, HORA_OP_SUM, 3);
  hora_request_t req = nullptr;
  if (me == refuser()) {
    DLTensor bad = *t->dl();
    bad.dtype = DLDataType{kDLComplex, 64, 1};
    mp::expectRejected("complex64", HORA_ERR_INVALID_ARGUMENT,
                       hora_allreduce_async("rj.dtype", &bad, &bad, HORA_OP_SUM, 1.0, 1.0, 0, &req), req);
  } else if (n >= 3 && me == refuser() - 1) {
    int64_t strides[2] = {1, 4};  // column-major
    DLTensor bad = *t->dl();
    bad.strides = strides;
    mp::expectRejected("column-major", HORA_ERR_INVALID_ARGUMENT,
                       hora_allreduce_async("rj.dtype", &bad, &bad, HORA_OP_SUM, 1.0, 1.0, 0, &req), req);
  } else {
    MP_ASSERT_OK(hora_allreduce_async("rj.dtype", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
    Request guard(req);
    const std::string last = std::to_string(refuser());
    if (n >= 3) {
      const std::string before = std::to_string(refuser() - 1);
      expectFailsPromptly(req, "allreduce",
                          {"allreduce 'rj.dtype'", rankWords(refuser() - 1, refuser()) + " rejected",
                           "rank " + before + ": input: is not contiguous",
                           "rank " + last + ": input: dtype complex64 (DLPack code 5"});
    } else {
      expectFailsPromptly(req, "allreduce", {"allreduce 'rj.dtype'", "rank " + last + " rejected",
                                             "input: dtype complex64 (DLPack code 5, bits 64"});
    }
  }
  mp::expectGoodAllreduce("rj.dtype.after", 4);
}

// Unnamed calls: the refused one takes its name on the refusing rank, so the k-th unnamed
// allreduce on every rank still pairs with the k-th of the others. Each call has its own shape,
// so that a pairing off by one fails loudly (a mismatch) instead of mixing data.
TEST(Reject, UnnamedRefusalKeepsLaterCallsPaired) {
  const int me = mp::rank();
  auto submit = [](HostTensor *t, hora_request_t *req) {
    return hora_allreduce_async(nullptr, t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, req);
  };
  std::vector<HostTensor *> tensors;
  for (int k = 0; k < 5; ++k) {
    tensors.push_back(leaked(mp::f32(), {k + 2}));
    mp::fillInput(*tensors.back(), HORA_OP_SUM, 10 + k);
  }
  // Call 0: good everywhere, submitted and left in flight.
  hora_request_t first = nullptr;
  MP_ASSERT_OK(submit(tensors[0], &first));
  Request g0(first);
  // Call 1: refused on the highest rank (its output is misshapen).
  hora_request_t req1 = nullptr;
  if (me == refuser()) {
    auto wrong = makeTensor(mp::f32(), {9});
    mp::expectRejected("unnamed, misshapen output", HORA_ERR_INVALID_ARGUMENT,
                       hora_allreduce_async(nullptr, tensors[1]->dl(), wrong->dl(), HORA_OP_SUM, 1.0,
                                            1.0, 0, &req1),
                       req1);
    req1 = nullptr;
  } else {
    MP_ASSERT_OK(submit(tensors[1], &req1));
  }
  Request g1(req1);
  // Calls 2..4 on every rank, submitted at once behind it.
  std::vector<Request> later;
  for (int k = 2; k < 5; ++k) {
    hora_request_t r = nullptr;
    MP_ASSERT_OK(submit(tensors[static_cast<size_t>(k)], &r));
    later.emplace_back(r);
  }
  MP_EXPECT_OK(hora_wait(first));
  EXPECT_TRUE(mp::matchesReduction(*tensors[0], HORA_OP_SUM, 10, 1.0, 1.0)) << "call 0";
  if (req1 != nullptr) {
    expectFailsPromptly(req1, "unnamed call 1",
                        {"allreduce 'allreduce.noname.", "rank " + std::to_string(refuser()) + " rejected",
                         "output (float32[9]"});
  }
  for (int k = 2; k < 5; ++k) {
    hora_request_t r = later[static_cast<size_t>(k - 2)].get();
    if (!mp::completesWithin(r, kPromptS)) {
      ADD_FAILURE() << "unnamed call " << k << " never completed: the names were shifted";
      (void)later[static_cast<size_t>(k - 2)].release();
      continue;
    }
    MP_EXPECT_OK(hora_wait(r)) << "unnamed call " << k << " after the refusal (pairs off by one?)";
    EXPECT_TRUE(mp::matchesReduction(*tensors[static_cast<size_t>(k)], HORA_OP_SUM, 10 + k, 1.0, 1.0))
        << "unnamed call " << k;
  }
}

// The refusing rank submits the name again at once, while its refusal is still being
// negotiated: the new request waits behind the refusal and pairs with the others' second
// submission, which they make after their first failed.
TEST(Reject, ResubmittingTheNameWaitsBehindTheRefusal) {
  const int me = mp::rank();
  HostTensor *first = leaked(mp::f32(), {5});
  HostTensor *second = leaked(mp::f32(), {5});
  mp::fillInput(*first, HORA_OP_SUM, 20);
  mp::fillInput(*second, HORA_OP_SUM, 21);
  hora_request_t r1 = nullptr, r2 = nullptr;
  if (me == refuser()) {
    DLTensor bad = *first->dl();
    bad.data = nullptr;
    mp::expectRejected("NULL data", HORA_ERR_INVALID_ARGUMENT,
                       hora_allreduce_async("rj.again", &bad, &bad, HORA_OP_SUM, 1.0, 1.0, 0, &r1), r1);
    // At once, and twice: the second again is a duplicate of a real request in flight.
    MP_ASSERT_OK(hora_allreduce_async("rj.again", second->dl(), second->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &r2));
    hora_request_t dup = nullptr;
    const hora_status_t s =
        hora_allreduce_async("rj.again", first->dl(), first->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &dup);
    // Behind the refusal, or in flight: the others have not submitted theirs yet. Alone (one
    // rank), the request may have completed already.
    if (s == HORA_SUCCESS && mp::size() == 1) {
      hora_request_free(dup);
    } else {
      EXPECT_EQ(mp::statusName(HORA_ERR_DUPLICATE_NAME), mp::statusName(s)) << mp::lastError();
      if (s == HORA_SUCCESS) hora_request_free(dup);
    }
  } else {
    MP_ASSERT_OK(hora_allreduce_async("rj.again", first->dl(), first->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &r1));
    Request g1(r1);
    expectFailsPromptly(r1, "first 'rj.again'", {"rank " + std::to_string(refuser()) + " rejected",
                                                 "data is NULL"});
    MP_ASSERT_OK(hora_allreduce_async("rj.again", second->dl(), second->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &r2));
  }
  Request g2(r2);
  if (mp::size() == 1) return;  // the extra one above may have been accepted alone
  ASSERT_TRUE(mp::completesWithin(r2, kPromptS)) << "second 'rj.again' never completed";
  MP_EXPECT_OK(hora_wait(r2));
  EXPECT_TRUE(mp::matchesReduction(*second, HORA_OP_SUM, 21, 1.0, 1.0)) << "second 'rj.again'";
}

// --- hora_reject ----------------------------------------------------------------------------

TEST(Reject, DirectCallFailsTheOthersOpWithItsReason) {
  const int me = mp::rank(), n = mp::size();
  // Refused calls of its own: bad op, unknown set.
  MP_EXPECT_STATUS(HORA_ERR_INVALID_ARGUMENT, hora_reject("allreduse", "x", 0, "typo"));
  EXPECT_NE(std::string::npos, mp::lastError().find("allreduse")) << mp::lastError();
  MP_EXPECT_STATUS(HORA_ERR_INVALID_ARGUMENT, hora_reject(nullptr, "x", 0, "no op"));
  MP_EXPECT_STATUS(HORA_ERR_INVALID_ARGUMENT, hora_reject("allreduce", "x", 424242, "no set"));

  // Named: an allgather.
  HostTensor *rows = leaked(mp::f32(), {me + 1, 3});
  rows->fill([](int64_t j) { return static_cast<double>(j); });
  hora_request_t req = nullptr;
  if (me == refuser()) {
    MP_EXPECT_OK(hora_reject("allgather", "rj.direct", 0, "the binding refused it: tensor on the wrong device"));
  } else {
    MP_ASSERT_OK(hora_allgather_async("rj.direct", rows->dl(), 0, &req));
    Request guard(req);
    expectFailsPromptly(req, "allgather", {"allgather 'rj.direct'", "rank " + std::to_string(refuser()),
                                           "the binding refused it: tensor on the wrong device"});
  }
  // Unnamed, with "" for the name: a reducescatter, then the next unnamed one pairs everywhere.
  HostTensor *block = leaked(mp::f32(), {2 * n, 2});
  block->fill([me](int64_t j) { return static_cast<double>(j + me); });
  req = nullptr;
  if (me == refuser()) {
    MP_EXPECT_OK(hora_reject("reducescatter", "", 0, nullptr));
  } else {
    MP_ASSERT_OK(hora_reducescatter_async(nullptr, block->dl(), HORA_OP_SUM, 0, &req));
    Request guard(req);
    expectFailsPromptly(req, "unnamed reducescatter",
                        {"reducescatter 'reducescatter.noname.", "(no reason given)"});
  }
  req = nullptr;
  MP_ASSERT_OK(hora_reducescatter_async(nullptr, block->dl(), HORA_OP_SUM, 0, &req));
  Request guard(req);
  ASSERT_TRUE(mp::completesWithin(req, kPromptS)) << "the next unnamed reducescatter";
  MP_ASSERT_OK(hora_wait(req));
  const DLTensor *out = hora_request_output(req);
  ASSERT_NE(nullptr, out);
  ASSERT_EQ(2, out->shape[0]);
  EXPECT_TRUE(mp::matches(*out, [&](int64_t i) {
    double s = 0;
    for (int q = 0; q < n; ++q) s += static_cast<double>(me * 4 + i + q);  // rows 2*me.. of each
    return s;
  })) << "unnamed reducescatter after the refusal";

  // A real request of the name in flight here: the refusal cannot take its place.
  if (n > 1) {
    HostTensor *t = leaked(mp::f32(), {3});
    mp::fillInput(*t, HORA_OP_SUM, 30);
    hora_request_t held = nullptr;
    if (me == 0) {
      MP_ASSERT_OK(hora_allreduce_async("rj.held", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &held));
      MP_EXPECT_STATUS(HORA_ERR_DUPLICATE_NAME, hora_reject("allreduce", "rj.held", 0, "late"));
    }
    mp::expectGoodAllreduce("rj.held.gate", 31);
    if (me != 0) {
      MP_ASSERT_OK(hora_allreduce_async("rj.held", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &held));
    }
    Request g(held);
    MP_EXPECT_OK(hora_wait(held));
    EXPECT_TRUE(mp::matchesReduction(*t, HORA_OP_SUM, 30, 1.0, 1.0)) << "rj.held";
  }
  mp::expectGoodAllreduce("rj.direct.after", 5);
}

// In a process set: the refusal fails its members' op only; a rank outside has nothing to do.
TEST(Reject, InAProcessSet) {
  const int me = mp::rank(), n = mp::size();
  if (n < 3) GTEST_SKIP() << "needs a set of two ranks that is not the world";
  const std::vector<int> members = {0, n - 1};
  const int32_t id = mp::createSet(members);
  ASSERT_GT(id, 0);
  if (mp::contains(members, me)) {
    HostTensor *t = leaked(mp::f32(), {4, 1});
    t->fill([](int64_t j) { return static_cast<double>(j); });
    hora_request_t req = nullptr;
    if (me == n - 1) {
      MP_EXPECT_OK(hora_reject("alltoall", "rj.set", id, "splits refused by the caller"));
    } else {
      MP_ASSERT_OK(hora_alltoall_async("rj.set", t->dl(), nullptr, id, &req));
      Request guard(req);
      expectFailsPromptly(req, "alltoall in a set", {"alltoall 'rj.set'", "rank 1 rejected",
                                                     "splits refused by the caller"});
    }
    mp::expectGoodAllreduceIn(id, "rj.set.after", 6);
  }
  MP_EXPECT_OK(hora_process_set_destroy(id));
}

// --- join modes -------------------------------------------------------------------------------

TEST(JoinMode, InvalidModeIsRefused) {
  MP_EXPECT_STATUS(HORA_ERR_INVALID_ARGUMENT, hora_set_join_mode(2));
  EXPECT_NE(std::string::npos, mp::lastError().find("mode 2")) << mp::lastError();
  MP_EXPECT_STATUS(HORA_ERR_INVALID_ARGUMENT, hora_set_join_mode(-1));
  MP_EXPECT_OK(hora_set_join_mode(HORA_JOIN_ZERO_FILL));
}

// Horovod's join: every rank but 0 joins; rank 0's allgather, broadcast, reducescatter and
// alltoall fail (UNSUPPORTED, naming the joined ranks), its allreduce takes zeros from them, and
// every join completes.
TEST(JoinMode, AllreduceOnlyRefusesTheOthersWhileARankHasJoined) {
  const int me = mp::rank(), n = mp::size();
  if (n < 2) GTEST_SKIP() << "needs a rank that joins and one that does not";
  MP_ASSERT_OK(hora_set_join_mode(HORA_JOIN_ALLREDUCE_ONLY));
  const std::string joined = rankWords(1, n - 1) + (n == 2 ? " has joined" : " have joined");
  if (me == 0) {
    auto rows = makeTensor(mp::f32(), {2, 3});
    rows->fill([](int64_t j) { return static_cast<double>(j); });
    // `req` by address: it is read after the submission in the same call's arguments.
    auto check = [&](const std::string &what, const std::string &name, hora_status_t submitted,
                     const hora_request_t *reqp) {
      MP_ASSERT_OK(submitted) << what;
      hora_request_t req = *reqp;
      Request guard(req);
      ASSERT_TRUE(mp::completesWithin(req, kPromptS)) << what << " never completed";
      const hora_status_t s = hora_wait(req);
      const std::string err = mp::lastError();
      EXPECT_EQ(mp::statusName(HORA_ERR_UNSUPPORTED), mp::statusName(s)) << what << ": '" << err << "'";
      EXPECT_NE(std::string::npos, err.find(what + " '" + name + "'")) << err;
      EXPECT_NE(std::string::npos, err.find(joined)) << err;
      EXPECT_NE(std::string::npos, err.find("only allreduce runs")) << err;
    };
    hora_request_t req = nullptr;
    check("allgather", "jm.ag", hora_allgather_async("jm.ag", rows->dl(), 0, &req), &req);
    req = nullptr;
    check("broadcast", "jm.bc", hora_broadcast_async("jm.bc", rows->dl(), 0, 0, &req), &req);
    req = nullptr;
    check("reducescatter", "jm.rs", hora_reducescatter_async("jm.rs", rows->dl(), HORA_OP_SUM, 0, &req), &req);
    auto even = makeTensor(mp::f32(), {2 * n, 1});
    req = nullptr;
    check("alltoall", "jm.a2a", hora_alltoall_async("jm.a2a", even->dl(), nullptr, 0, &req), &req);
    // Allreduce still runs, with zeros from the joined ranks.
    auto sum = makeTensor(mp::f32(), {4});
    sum->fill([](int64_t j) { return static_cast<double>(j + 1); });
    req = nullptr;
    MP_ASSERT_OK(hora_allreduce_async("jm.ar", sum->dl(), sum->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
    Request guard(req);
    MP_ASSERT_OK(hora_wait(req));
    EXPECT_TRUE(mp::matches(*sum, [](int64_t j) { return static_cast<double>(j + 1); }))
        << "allreduce with every other rank joined";
  }
  int last = -1;
  MP_EXPECT_OK(hora_join(0, &last)) << "join under HORA_JOIN_ALLREDUCE_ONLY";
  EXPECT_EQ(0, last);
  MP_EXPECT_OK(hora_set_join_mode(HORA_JOIN_ZERO_FILL));
  mp::expectGoodAllreduce("jm.after", 7);
}

// The default mode: the same allgather succeeds with no rows from the joined rank.
TEST(JoinMode, ZeroFillStillGathers) {
  const int me = mp::rank(), n = mp::size();
  if (n < 2) GTEST_SKIP() << "needs a rank that joins and one that does not";
  MP_ASSERT_OK(hora_set_join_mode(HORA_JOIN_ZERO_FILL));
  if (me == 0) {
    auto rows = makeTensor(mp::f32(), {2, 3});
    rows->fill([](int64_t j) { return static_cast<double>(j); });
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_allgather_async("jm0.ag", rows->dl(), 0, &req));
    Request guard(req);
    MP_ASSERT_OK(hora_wait(req));
    const DLTensor *out = hora_request_output(req);
    ASSERT_NE(nullptr, out);
    EXPECT_EQ(2, out->shape[0]) << "only rank 0's rows";
    EXPECT_TRUE(mp::matches(*out, [](int64_t j) { return static_cast<double>(j); }));
  }
  int last = -1;
  MP_EXPECT_OK(hora_join(0, &last));
  EXPECT_EQ(0, last);
}

}  // namespace
