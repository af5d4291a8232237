// SPDX-License-Identifier: Apache-2.0
// Reducescatter: every dtype x op, uneven and empty blocks, 1-D/3-D, fusion, errors, mismatches.
#include <hora/hora.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "mp_cases.h"
#include "mp_harness.h"
#include "mp_ops.h"

namespace {

using mp::Case;
using mp::DType;
using mp::makeTensor;
using mp::ReducescatterCase;
using mp::Request;

using Param = std::tuple<std::string, hora_reduce_op_t>;

class ReducescatterMatrix : public ::testing::TestWithParam<Param> {};

std::string caseName(const char *what, const DType &dt, hora_reduce_op_t op) {
  return std::string("rs.") + what + "." + dt.name + "." + mp::opName(op);
}

// 2n+1 rows: not divisible by n (n > 1), so rank 0 gets one row more than the others.
TEST_P(ReducescatterMatrix, UnevenRows) {
  const DType &dt = mp::dtypeNamed(std::get<0>(GetParam()));
  const hora_reduce_op_t op = std::get<1>(GetParam());
  const int n = mp::size();
  if (!dt.floating && op == HORA_OP_AVERAGE) {
    // An integer average would be truncated: refused at submission, nothing enqueued.
    auto t = makeTensor(dt, {2 * n + 1, 3});
    hora_request_t req = nullptr;
    mp::expectRejected(caseName("uneven", dt, op), HORA_ERR_UNSUPPORTED,
                       hora_reducescatter_async(caseName("uneven", dt, op).c_str(), t->dl(), op, 0, &req),
                       req);
    mp::expectGoodAllreduce(caseName("uneven", dt, op), 1);
    return;
  }
  ReducescatterCase c(caseName("uneven", dt, op), 0, dt, {2 * n + 1, 3}, op, 2);
  c.run();
}

// Fewer rows than ranks: the last ranks get empty blocks (shape [0, 4]).
TEST_P(ReducescatterMatrix, FewerRowsThanRanks) {
  const DType &dt = mp::dtypeNamed(std::get<0>(GetParam()));
  const hora_reduce_op_t op = std::get<1>(GetParam());
  if (!dt.floating && op == HORA_OP_AVERAGE) GTEST_SKIP() << "UNSUPPORTED, tested in UnevenRows";
  const int n = mp::size();
  ReducescatterCase c(caseName("few", dt, op), 0, dt, {n > 1 ? n - 1 : 1, 4}, op, 3);
  c.run();
}

std::vector<Param> matrixParams() {
  std::vector<Param> v;
  for (const DType &d : mp::allDTypes())
    for (hora_reduce_op_t op : mp::allOps()) v.emplace_back(d.name, op);
  return v;
}

INSTANTIATE_TEST_SUITE_P(DtypesOps, ReducescatterMatrix, ::testing::ValuesIn(matrixParams()),
                         [](const ::testing::TestParamInfo<Param> &info) {
                           return std::get<0>(info.param) + "_" + mp::opName(std::get<1>(info.param));
                         });

TEST(Reducescatter, EvenRows) {
  ReducescatterCase c("rs.even", 0, mp::f32(), {3 * mp::size(), 2}, HORA_OP_SUM, 4);
  c.run();
}

// One row: only rank 0 receives anything.
TEST(Reducescatter, SingleRow) {
  ReducescatterCase c("rs.onerow", 0, mp::f64(), {1, 5}, HORA_OP_MAX, 5);
  c.run();
}

TEST(Reducescatter, OneDimensional) {
  ReducescatterCase c("rs.1d", 0, mp::dtypeNamed("int64"), {2 * mp::size() + 3}, HORA_OP_SUM, 6);
  c.run();
}

TEST(Reducescatter, ThreeDimensional) {
  ReducescatterCase c("rs.3d", 0, mp::dtypeNamed("float16"), {mp::size() + 2, 2, 3}, HORA_OP_AVERAGE, 7);
  c.run();
}

TEST(Reducescatter, Large) {
  ReducescatterCase c("rs.large", 0, mp::f32(), {1000 * mp::size() + 7, 50}, HORA_OP_SUM, 8);
  c.run();
}

// Many reducescatters in flight, submitted in a rank-dependent order; several share dtype and
// op, so the planner may fuse them and the rank-major packing must keep blocks apart.
TEST(Reducescatter, ManyInFlightShuffled) {
  const int r = mp::rank(), n = mp::size();
  struct Spec {
    const char *dtype;
    hora_reduce_op_t op;
    std::vector<int64_t> shape;
  };
  const std::vector<Spec> specs = {
      {"float32", HORA_OP_SUM, {2 * n + 1, 3}}, {"float32", HORA_OP_SUM, {n, 7}},
      {"float32", HORA_OP_SUM, {1, 2}},         {"float32", HORA_OP_SUM, {5 * n - 1}},
      {"float16", HORA_OP_SUM, {n + 1, 4}},     {"float16", HORA_OP_SUM, {3, 3}},
      {"bfloat16", HORA_OP_MAX, {2 * n, 2}},    {"bfloat16", HORA_OP_MAX, {n + 3, 1}},
      {"int32", HORA_OP_MIN, {n + 2, 5}},       {"int32", HORA_OP_MIN, {4 * n + 1, 2}},
      {"float64", HORA_OP_AVERAGE, {3 * n + 2, 3}}, {"float64", HORA_OP_AVERAGE, {n, 1}},
      {"int8", HORA_OP_PRODUCT, {n + 1, 3}},    {"uint8", HORA_OP_SUM, {2 * n + 1, 2}},
      {"float32", HORA_OP_SUM, {0, 3}},         {"float32", HORA_OP_SUM, {3 * n + 1, 6}},
  };
  const int count = static_cast<int>(specs.size());
  std::vector<std::unique_ptr<Case>> cases;
  for (int i = 0; i < count; ++i) {
    const Spec &s = specs[static_cast<size_t>(i)];
    cases.push_back(std::make_unique<ReducescatterCase>("rs.many." + std::to_string(i), 0,
                                                        mp::dtypeNamed(s.dtype), s.shape, s.op, 20 + i));
  }
  for (int k = 0; k < count; ++k) cases[static_cast<size_t>((k * 5 + r * 3) % count)]->submit();
  for (auto &c : cases) c->check();
}

// The same name every step with a different op each time: a cached response must not replay.
TEST(Reducescatter, SameNameEveryStep) {
  const hora_reduce_op_t ops[] = {HORA_OP_SUM, HORA_OP_MIN, HORA_OP_MAX, HORA_OP_SUM, HORA_OP_PRODUCT};
  int step = 0;
  for (hora_reduce_op_t op : ops) {
    ReducescatterCase c("rs.step", 0, mp::f32(), {2 * mp::size() + 1, 2}, op, 30 + step++);
    c.run();
  }
}

// --- errors ------------------------------------------------------------------------------

TEST(ReducescatterErrors, RejectedAtSubmissionThenGoodOp) {
  auto t = makeTensor(mp::f32(), {4, 3});
  hora_request_t req = nullptr;
  for (const char *name : {"int8", "uint8", "int32", "int64"}) {
    auto it = makeTensor(mp::dtypeNamed(name), {4, 3});
    req = nullptr;
    mp::expectRejected(std::string("AVERAGE on ") + name, HORA_ERR_UNSUPPORTED,
                       hora_reducescatter_async("rs.bad.avg", it->dl(), HORA_OP_AVERAGE, 0, &req), req);
  }
  {
    DLTensor scalar = *t->dl();
    scalar.ndim = 0;
    req = nullptr;
    mp::expectRejected("scalar input", HORA_ERR_INVALID_ARGUMENT,
                       hora_reducescatter_async("rs.bad.scalar", &scalar, HORA_OP_SUM, 0, &req), req);
  }
  req = nullptr;
  mp::expectRejected("reduce op 17", HORA_ERR_INVALID_ARGUMENT,
                     hora_reducescatter_async("rs.bad.op", t->dl(), static_cast<hora_reduce_op_t>(17), 0, &req),
                     req);
  req = nullptr;
  mp::expectRejected("NULL input", HORA_ERR_INVALID_ARGUMENT,
                     hora_reducescatter_async("rs.bad.null", nullptr, HORA_OP_SUM, 0, &req), req);
  mp::expectRejected("NULL request_p", HORA_ERR_INVALID_ARGUMENT,
                     hora_reducescatter_async("rs.bad.req", t->dl(), HORA_OP_SUM, 0, nullptr), nullptr);
  req = nullptr;
  mp::expectRejected("unknown process set", HORA_ERR_INVALID_ARGUMENT,
                     hora_reducescatter_async("rs.bad.set", t->dl(), HORA_OP_SUM, 777, &req), req);
  ReducescatterCase good("rs.bad.avg", 0, mp::f32(), {mp::size() + 1, 3}, HORA_OP_AVERAGE, 40);
  good.run();
}

// Rank 1 submits a different shape (or op): MISMATCH on every rank, then the name works.
void expectReducescatterMismatch(const std::string &name, std::vector<int64_t> oddShape,
                                 hora_reduce_op_t oddOp) {
  const int r = mp::rank(), n = mp::size();
  if (n > 1) {
    const bool odd = r == 1;
    auto t = makeTensor(mp::f32(), odd ? oddShape : std::vector<int64_t>{2 * n, 3});
    mp::fillInputAs(*t, HORA_OP_SUM, 1, r, n);
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_reducescatter_async(name.c_str(), t->dl(), odd ? oddOp : HORA_OP_SUM, 0, &req));
    Request guard(req);
    mp::expectMismatchAtWait(req, name);
  }
  ReducescatterCase good(name, 0, mp::f32(), {2 * n + 1, 3}, HORA_OP_SUM, 41);
  good.run();
  mp::expectGoodAllreduce(name + ".after", 42);
}

TEST(ReducescatterErrors, FirstDimMismatch) {
  const int n = mp::size();
  expectReducescatterMismatch("rs.mm.rows", {2 * n + 1, 3}, HORA_OP_SUM);
}

TEST(ReducescatterErrors, TrailingDimMismatch) {
  const int n = mp::size();
  expectReducescatterMismatch("rs.mm.trailing", {2 * n, 4}, HORA_OP_SUM);
}

TEST(ReducescatterErrors, ReduceOpMismatch) {
  const int n = mp::size();
  expectReducescatterMismatch("rs.mm.op", {2 * n, 3}, HORA_OP_MAX);
}

}  // namespace
