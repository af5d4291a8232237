// SPDX-License-Identifier: Apache-2.0
// Allreduce: every dtype x op x placement x scaling x size, unsupported combinations, edge shapes.
#include <hora/hora.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "mp_harness.h"

namespace {

using mp::DType;
using mp::HostTensor;
using mp::makeTensor;
using mp::Request;

struct Scale {
  double pre, post;
};

// Powers of two keep every scaled value exact. (2, 0.25) does not multiply to 1, so applying
// only one factor, or one of them twice, changes the result.
std::vector<Scale> scalesFor(const DType &dt) {
  if (!dt.floating) return {{1.0, 1.0}};
  return {{1.0, 1.0}, {0.5, 2.0}, {2.0, 0.25}};
}

std::vector<int64_t> shapeFor(int64_t count) {
  if (count == 1000) return {8, 125};
  if (count == 300000) return {100, 3000};
  return {count};
}

using Param = std::tuple<std::string, int64_t>;

class AllreduceMatrix : public ::testing::TestWithParam<Param> {};

// All ops and placements of one (dtype, size, scale) are in flight together, so fusion has to
// keep apart tensors whose op or scale differ.
TEST_P(AllreduceMatrix, EveryOpInPlaceAndOutOfPlace) {
  const DType &dt = mp::dtypeNamed(std::get<0>(GetParam()));
  const int64_t count = std::get<1>(GetParam());
  const std::vector<Scale> scales = scalesFor(dt);
  for (size_t si = 0; si < scales.size(); ++si) {
    const Scale sc = scales[si];
    struct Case {
      hora_reduce_op_t op;
      bool inPlace;
      int64_t salt;
      std::string name;
      std::unique_ptr<HostTensor> in, out;
      Request req;
    };
    std::vector<Case> cases;
    for (hora_reduce_op_t op : mp::allOps()) {
      if (!dt.floating && op == HORA_OP_AVERAGE) continue;  // UNSUPPORTED, tested below
      for (bool inPlace : {true, false}) {
        Case c;
        c.op = op;
        c.inPlace = inPlace;
        c.salt = static_cast<int64_t>(op) * 2 + (inPlace ? 1 : 0) + 10 * static_cast<int64_t>(si);
        c.name = std::string("ar.") + dt.name + "." + std::to_string(count) + "." + mp::opName(op) +
                 (inPlace ? ".in." : ".out.") + std::to_string(si);
        c.in = makeTensor(dt, shapeFor(count));
        mp::fillInput(*c.in, op, c.salt);
        if (!inPlace) {
          c.out = makeTensor(dt, shapeFor(count));
          c.out->fill([](int64_t) { return 7.0; });
        }
        hora_request_t req = nullptr;
        MP_EXPECT_OK(hora_allreduce_async(c.name.c_str(), c.in->dl(),
                                          inPlace ? c.in->dl() : c.out->dl(), op, sc.pre, sc.post,
                                          0, &req));
        c.req.reset(req);
        cases.push_back(std::move(c));
      }
    }
    for (Case &c : cases) {
      if (!c.req) continue;
      MP_EXPECT_OK(hora_wait(c.req.get()));
      const HostTensor &result = c.inPlace ? *c.in : *c.out;
      EXPECT_TRUE(mp::matchesReduction(result, c.op, c.salt, sc.pre, sc.post))
          << c.name << " prescale " << sc.pre << " postscale " << sc.post;
      if (!c.inPlace) {
        const int r = mp::rank(), n = mp::size();
        EXPECT_TRUE(mp::matches(*c.in, [&](int64_t j) {
          return mp::inputValue(c.op, dt, r, n, j, c.salt);
        })) << c.name << ": out-of-place allreduce modified its input";
      }
    }
  }
}

std::string paramName(const ::testing::TestParamInfo<Param> &info) {
  return std::get<0>(info.param) + "_n" + std::to_string(std::get<1>(info.param));
}

std::vector<std::string> dtypeNames() {
  std::vector<std::string> v;
  for (const DType &d : mp::allDTypes()) v.push_back(d.name);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AllreduceMatrix,
                         ::testing::Combine(::testing::ValuesIn(dtypeNames()),
                                            ::testing::Values<int64_t>(1, 17, 1000, 300000)),
                         paramName);

// AVERAGE and any scaling on an integer dtype are refused at submission, nothing enqueued.
TEST(AllreduceUnsupported, IntegerAverageAndScaling) {
  for (const DType &dt : mp::allDTypes()) {
    if (dt.floating) continue;
    auto t = makeTensor(dt, {5});
    mp::fillInput(*t, HORA_OP_SUM, 1);
    struct Bad {
      const char *what;
      hora_reduce_op_t op;
      double pre, post;
    };
    const Bad bads[] = {{"average", HORA_OP_AVERAGE, 1.0, 1.0},
                        {"prescale", HORA_OP_SUM, 0.5, 1.0},
                        {"postscale", HORA_OP_SUM, 1.0, 2.0},
                        {"both", HORA_OP_MAX, 2.0, 0.5}};
    for (const Bad &b : bads) {
      const std::string name = std::string("unsup.") + dt.name + "." + b.what;
      hora_request_t req = nullptr;
      const hora_status_t s =
          hora_allreduce_async(name.c_str(), t->dl(), t->dl(), b.op, b.pre, b.post, 0, &req);
      const std::string err = mp::lastError();
      EXPECT_EQ(mp::statusName(HORA_ERR_UNSUPPORTED), mp::statusName(s)) << name << ": " << err;
      if (s == HORA_SUCCESS) {
        hora_wait(req);  // every rank made the same mistake, so it completes
        hora_request_free(req);
      } else {
        EXPECT_FALSE(err.empty()) << name;
      }
    }
    // Nothing was enqueued: a good op on the same tensor works.
    const std::string good = std::string("unsup.after.") + dt.name;
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_allreduce_async(good.c_str(), t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
    Request guard(req);
    MP_EXPECT_OK(hora_wait(req));
    EXPECT_TRUE(mp::matchesReduction(*t, HORA_OP_SUM, 1, 1.0, 1.0)) << good;
  }
}

TEST(AllreduceEdge, ZeroElementsEveryDtype) {
  for (const DType &dt : mp::allDTypes()) {
    for (bool inPlace : {true, false}) {
      const std::string name = std::string("zero.") + dt.name + (inPlace ? ".in" : ".out");
      auto in = makeTensor(dt, {0});
      auto out = makeTensor(dt, {0});
      hora_request_t req = nullptr;
      MP_EXPECT_OK(hora_allreduce_async(name.c_str(), in->dl(), inPlace ? in->dl() : out->dl(),
                                        HORA_OP_SUM, 1.0, 1.0, 0, &req));
      Request guard(req);
      if (req) {
        MP_EXPECT_OK(hora_wait(req));
      }
    }
  }
  // A zero in a later dimension, and a floating type with scaling.
  auto t = makeTensor(mp::dtypeNamed("float32"), {3, 0, 2});
  hora_request_t req = nullptr;
  MP_EXPECT_OK(hora_allreduce_async("zero.3x0x2", t->dl(), t->dl(), HORA_OP_AVERAGE, 0.5, 2.0, 0, &req));
  Request guard(req);
  if (req) {
    MP_EXPECT_OK(hora_wait(req));
  }
}

// Frameworks hand out empty tensors with a NULL data pointer (PyTorch does): that is valid.
TEST(AllreduceEdge, ZeroElementsWithNullData) {
  auto t = makeTensor(mp::dtypeNamed("float32"), {0});
  t->dl()->data = nullptr;
  hora_request_t req = nullptr;
  MP_EXPECT_OK(hora_allreduce_async("zero.null_data", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
  Request guard(req);
  if (req) {
    MP_EXPECT_OK(hora_wait(req));
  }
}

// ndim 0 is a scalar with one element.
TEST(AllreduceEdge, ScalarTensor) {
  auto t = makeTensor(mp::dtypeNamed("int64"), {});
  ASSERT_EQ(1, t->numel());
  mp::fillInput(*t, HORA_OP_SUM, 5);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async("scalar.sum", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
  Request guard(req);
  MP_EXPECT_OK(hora_wait(req));
  EXPECT_TRUE(mp::matchesReduction(*t, HORA_OP_SUM, 5, 1.0, 1.0));
}

// DLPack places element 0 at data + byte_offset; bytes before it belong to someone else.
TEST(AllreduceEdge, ByteOffsetIsHonoured) {
  const DType &dt = mp::dtypeNamed("float32");
  const int64_t count = 100, lead = 4;
  auto storage = makeTensor(dt, {lead + count + lead});
  storage->fill([](int64_t) { return 123.0; });
  int64_t shape[1] = {count};
  DLTensor view = *storage->dl();
  view.ndim = 1;
  view.shape = shape;
  view.byte_offset = lead * sizeof(float);
  for (int64_t j = 0; j < count; ++j)
    storage->set(lead + j, mp::inputValue(HORA_OP_SUM, dt, mp::rank(), mp::size(), j, 6));

  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async("offset.sum", &view, &view, HORA_OP_SUM, 1.0, 1.0, 0, &req));
  Request guard(req);
  MP_EXPECT_OK(hora_wait(req));
  const int n = mp::size();
  EXPECT_TRUE(mp::matches(*storage, [&](int64_t i) {
    if (i < lead || i >= lead + count) return 123.0;
    return mp::expectedValue(HORA_OP_SUM, dt, n, i - lead, 6, 1.0, 1.0);
  })) << "result not at data + byte_offset, or bytes around it touched";
}

// Explicit strides that describe the compact row-major layout are accepted.
TEST(AllreduceEdge, CompactStridesAccepted) {
  const DType &dt = mp::dtypeNamed("int32");
  auto t = makeTensor(dt, {3, 4});
  int64_t strides[2] = {4, 1};
  t->dl()->strides = strides;
  mp::fillInput(*t, HORA_OP_MIN, 8);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async("strides.compact", t->dl(), t->dl(), HORA_OP_MIN, 1.0, 1.0, 0, &req));
  Request guard(req);
  MP_EXPECT_OK(hora_wait(req));
  EXPECT_TRUE(mp::matchesReduction(*t, HORA_OP_MIN, 8, 1.0, 1.0));
}

// float16/bfloat16: the contract is "widen to float32, scale and reduce there, round once". Each
// case below gives a different answer if some step runs in the narrow type instead: a float16
// intermediate overflows past 65504, or rounds an odd sum to even before the last addend.
TEST(AllreduceHalfPrecision, AccumulatesInFloat32AndRoundsOnce) {
  const int r = mp::rank(), n = mp::size();
  struct Case {
    const char *name;
    const char *dtype;
    hora_reduce_op_t op;
    double pre, post;
    std::function<double(int)> value;  // this rank's input (exact in the dtype)
    std::function<double(int)> exact;  // the exact result for n ranks, before the final rounding
  };
  const std::vector<Case> cases = {
      // n * 40000 overflows float16 for n >= 2; the average does not.
      {"f16_avg_overflow", "float16", HORA_OP_AVERAGE, 1.0, 1.0, [](int) { return 40000.0; },
       [](int) { return 40000.0; }},
      // The sum overflows float16 before the postscale brings it back.
      {"f16_sum_postscale", "float16", HORA_OP_SUM, 1.0, 0.125, [](int) { return 40000.0; },
       [](int m) { return 5000.0 * m; }},
      // The prescaled inputs overflow float16 (2048 * 64 = 131072).
      {"f16_sum_prescale", "float16", HORA_OP_SUM, 64.0, 1.0 / 256, [](int) { return 2048.0; },
       [](int m) { return 512.0 * m; }},
      {"f16_max_prescale", "float16", HORA_OP_MAX, 64.0, 1.0 / 64, [](int q) { return 1024.0 + q; },
       [](int m) { return 1024.0 + m - 1; }},
      // 2048 + 1 + 1 + 1: exact in float32, rounded once to 2052 (a tie, to even); a float16
      // accumulator that adds 1 at a time stays at 2048.
      {"f16_sum_round_once", "float16", HORA_OP_SUM, 1.0, 1.0,
       [](int q) { return q == 0 ? 2048.0 : 1.0; }, [](int m) { return 2048.0 + m - 1; }},
      {"bf16_sum_round_once", "bfloat16", HORA_OP_SUM, 1.0, 1.0,
       [](int q) { return q == 0 ? 256.0 : 1.0; }, [](int m) { return 256.0 + m - 1; }},
      {"bf16_avg_round_once", "bfloat16", HORA_OP_AVERAGE, 1.0, 1.0,
       [](int q) { return q == 0 ? 256.0 : 1.0; }, [](int m) { return (256.0 + m - 1) / m; }},
  };
  // A small tensor (fused) and a large one (possibly reduced where it lies), both placements.
  for (int64_t count : {5, 100000}) {
    for (bool inPlace : {true, false}) {
      for (const Case &c : cases) {
        const DType &dt = mp::dtypeNamed(c.dtype);
        const std::string name = std::string("half.") + c.name + "." + std::to_string(count) +
                                 (inPlace ? ".in" : ".out");
        auto in = makeTensor(dt, {count});
        auto out = makeTensor(dt, {count});
        in->fill([&](int64_t) { return c.value(r); });
        ASSERT_EQ(c.value(r), in->get(0)) << name << ": input not exact in " << dt.name;
        hora_request_t req = nullptr;
        MP_EXPECT_OK(hora_allreduce_async(name.c_str(), in->dl(), inPlace ? in->dl() : out->dl(),
                                          c.op, c.pre, c.post, 0, &req));
        Request guard(req);
        if (!req) continue;
        MP_EXPECT_OK(hora_wait(req)) << name;
        const double want = mp::roundTo(dt, c.exact(n));
        const double tol = mp::tolerance(c.op, dt, want);
        EXPECT_TRUE(mp::matches(
            inPlace ? *in : *out, [&](int64_t) { return want; }, [&](int64_t) { return tol; }))
            << name << " at " << n << " ranks";
      }
    }
  }
}

// The same buffers reduced again and again (a training loop): results do not accumulate state.
TEST(AllreduceEdge, RepeatedStepsSameName) {
  const DType &dt = mp::dtypeNamed("bfloat16");
  auto in = makeTensor(dt, {513});
  auto out = makeTensor(dt, {513});
  for (int step = 0; step < 20; ++step) {
    mp::fillInput(*in, HORA_OP_AVERAGE, step);
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_allreduce_async("repeat.avg", in->dl(), out->dl(), HORA_OP_AVERAGE, 1.0, 1.0, 0, &req));
    Request guard(req);
    MP_ASSERT_OK(hora_wait(req));
    // EXPECT, not ASSERT: leaving the loop early on one rank would hang the others.
    EXPECT_TRUE(mp::matchesReduction(*out, HORA_OP_AVERAGE, step, 1.0, 1.0)) << "step " << step;
  }
}

}  // namespace
