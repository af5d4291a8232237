// SPDX-License-Identifier: Apache-2.0
// Zero-element tensors through every collective, alone and in flight with ordinary ones.
#include <hora/hora.h>

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
using mp::DType;
using mp::ReducescatterCase;

TEST(ZeroSize, AllreduceEveryOp) {
  std::vector<std::unique_ptr<Case>> cases;
  for (hora_reduce_op_t op : mp::allOps()) {
    cases.push_back(std::make_unique<AllreduceCase>(std::string("zero.ar.f32.") + mp::opName(op), 0, mp::f32(),
                                                    std::vector<int64_t>{0, 3}, op, 1));
    if (op != HORA_OP_AVERAGE)
      cases.push_back(std::make_unique<AllreduceCase>(std::string("zero.ar.i32.") + mp::opName(op), 0, mp::i32(),
                                                      std::vector<int64_t>{0}, op, 2));
  }
  cases.push_back(std::make_unique<AllreduceCase>("zero.ar.f16.scaled", 0, mp::dtypeNamed("float16"),
                                                  std::vector<int64_t>{3, 0, 2}, HORA_OP_SUM, 3, 0.5, 2.0));
  mp::runAll(cases);
}

TEST(ZeroSize, Broadcast) {
  const int n = mp::size();
  BroadcastCase a("zero.bc", 0, mp::f32(), {0, 3}, n - 1, 1);
  a.run();
  BroadcastCase b("zero.bc.1d", 0, mp::dtypeNamed("uint8"), {0}, 0, 2);
  b.run();
}

TEST(ZeroSize, AllgatherEveryRankEmpty) {
  AllgatherCase c("zero.ag", 0, mp::f32(), [](int) { return int64_t{0}; }, {3}, 1);
  c.run();
  AllgatherCase d("zero.ag.1d", 0, mp::dtypeNamed("int64"), [](int) { return int64_t{0}; }, {}, 2);
  d.run();
  // Non-empty rows but an empty trailing dimension: zero elements, three rows per rank.
  AllgatherCase e("zero.ag.trailing", 0, mp::f32(), [](int) { return int64_t{3}; }, {0}, 3);
  e.run();
}

TEST(ZeroSize, AlltoallAllSplitsZero) {
  AlltoallCase c("zero.a2a", 0, mp::f32(), [](int, int) { return int64_t{0}; }, {3}, 1);
  c.run();
  AlltoallCase d("zero.a2a.null", 0, mp::dtypeNamed("float16"), [](int, int) { return int64_t{0}; }, {2}, 2,
                 /*nullSplits=*/true);
  d.run();
  AlltoallCase e("zero.a2a.trailing", 0, mp::f64(), [](int s, int d) { return int64_t{s + d}; }, {0}, 3);
  e.run();
}

TEST(ZeroSize, Reducescatter) {
  ReducescatterCase c("zero.rs", 0, mp::f32(), {0, 3}, HORA_OP_SUM, 1);
  c.run();
  ReducescatterCase d("zero.rs.trailing", 0, mp::dtypeNamed("bfloat16"), {2 * mp::size() + 1, 0}, HORA_OP_MAX, 2);
  d.run();
}

// Empty tensors of every collective in flight together with non-empty ones of the same dtype,
// which the planner may fuse with them.
TEST(ZeroSize, MixedWithNonEmptyInFlight) {
  const int n = mp::size();
  std::vector<std::unique_ptr<Case>> cases;
  for (int i = 0; i < 3; ++i) {
    const std::string k = std::to_string(i);
    cases.push_back(std::make_unique<AllreduceCase>("zero.mix.ar0." + k, 0, mp::f32(), std::vector<int64_t>{0},
                                                    HORA_OP_SUM, i));
    cases.push_back(std::make_unique<AllreduceCase>("zero.mix.ar." + k, 0, mp::f32(), std::vector<int64_t>{50},
                                                    HORA_OP_SUM, i));
    cases.push_back(std::make_unique<AllgatherCase>("zero.mix.ag0." + k, 0, mp::f32(),
                                                    [](int) { return int64_t{0}; }, std::vector<int64_t>{2}, i));
    cases.push_back(std::make_unique<AllgatherCase>("zero.mix.ag." + k, 0, mp::f32(),
                                                    [](int q) { return int64_t{q + 1}; }, std::vector<int64_t>{2}, i));
    cases.push_back(std::make_unique<ReducescatterCase>("zero.mix.rs0." + k, 0, mp::f32(), std::vector<int64_t>{0, 2},
                                                        HORA_OP_SUM, i));
    cases.push_back(std::make_unique<ReducescatterCase>("zero.mix.rs." + k, 0, mp::f32(),
                                                        std::vector<int64_t>{n + 1, 2}, HORA_OP_SUM, i));
    cases.push_back(std::make_unique<BroadcastCase>("zero.mix.bc0." + k, 0, mp::f32(), std::vector<int64_t>{0},
                                                    i % n, i));
    cases.push_back(std::make_unique<AlltoallCase>("zero.mix.a2a0." + k, 0, mp::f32(),
                                                   [](int, int) { return int64_t{0}; }, std::vector<int64_t>{2}, i));
  }
  mp::runAll(cases);
}

}  // namespace
