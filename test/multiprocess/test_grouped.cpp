// SPDX-License-Identifier: Apache-2.0
// Grouped allreduce: many tensors as one request, every dtype/op, past the fusion threshold, errors.
#include <hora/hora.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "mp_cases.h"
#include "mp_harness.h"
#include "mp_ops.h"

namespace {

using mp::Case;
using mp::DType;
using mp::HostTensor;
using mp::makeTensor;
using mp::Request;

// n tensors of one dtype and different shapes, reduced by one request; member i uses salt
// salt + i so that a member landing in another member's output is caught.
class GroupCase : public Case {
 public:
  GroupCase(std::string name, int32_t set, const DType &dt, std::vector<std::vector<int64_t>> shapes,
            hora_reduce_op_t op, int64_t salt, double pre = 1.0, double post = 1.0,
            bool inPlace = true, bool unnamed = false)
      : Case(std::move(name), set), dt_(dt), shapes_(std::move(shapes)), op_(op), salt_(salt),
        pre_(pre), post_(post), inPlace_(inPlace), unnamed_(unnamed) {}

 protected:
  hora_status_t doSubmit(hora_request_t *req) override {
    ins_.clear();
    outs_.clear();
    inDl_.clear();
    outDl_.clear();
    for (size_t i = 0; i < shapes_.size(); ++i) {
      ins_.push_back(makeTensor(dt_, shapes_[i]));
      mp::fillInputAs(*ins_.back(), op_, salt_ + static_cast<int64_t>(i), me_, n_);
      inDl_.push_back(*ins_.back()->dl());
      if (inPlace_) {
        outDl_.push_back(*ins_.back()->dl());
      } else {
        outs_.push_back(makeTensor(dt_, shapes_[i]));
        outs_.back()->fill([](int64_t) { return 99.0; });
        outDl_.push_back(*outs_.back()->dl());
      }
    }
    return hora_grouped_allreduce_async(unnamed_ ? nullptr : name_.c_str(),
                                        static_cast<int>(shapes_.size()), inDl_.data(),
                                        outDl_.data(), op_, pre_, post_, set_, req);
  }
  void doCheck() override {
    for (size_t i = 0; i < shapes_.size(); ++i) {
      const HostTensor &out = inPlace_ ? *ins_[i] : *outs_[i];
      EXPECT_TRUE(mp::matchesReductionOf(out, op_, salt_ + static_cast<int64_t>(i), pre_, post_, n_))
          << name_ << " member " << i << " (" << dt_.name << ", " << mp::opName(op_) << ")";
      if (!inPlace_) {
        EXPECT_TRUE(mp::matches(*ins_[i], [&](int64_t j) {
          return mp::inputValue(op_, dt_, me_, n_, j, salt_ + static_cast<int64_t>(i));
        })) << name_ << " member " << i << ": out-of-place allreduce modified its input";
      }
    }
  }

 private:
  DType dt_;
  std::vector<std::vector<int64_t>> shapes_;
  hora_reduce_op_t op_;
  int64_t salt_;
  double pre_, post_;
  bool inPlace_, unnamed_;
  std::vector<std::unique_ptr<HostTensor>> ins_, outs_;
  std::vector<DLTensor> inDl_, outDl_;
};

const std::vector<std::vector<int64_t>> kShapes = {{7}, {3, 5}, {2, 3, 4}, {1}, {64, 33}};

class GroupedMatrix : public ::testing::TestWithParam<std::string> {};

// Every op at once (in flight together), in place and out of place; floats also scaled.
TEST_P(GroupedMatrix, EveryOpAndPlacement) {
  const DType &dt = mp::dtypeNamed(GetParam());
  std::vector<std::unique_ptr<Case>> cases;
  int salt = 0;
  for (hora_reduce_op_t op : mp::allOps()) {
    if (!dt.floating && op == HORA_OP_AVERAGE) continue;
    for (bool inPlace : {true, false}) {
      const std::string name = std::string("grp.") + dt.name + "." + mp::opName(op) +
                               (inPlace ? ".in" : ".out");
      cases.push_back(std::make_unique<GroupCase>(name, 0, dt, kShapes, op, salt, 1.0, 1.0, inPlace));
      salt += 10;
    }
    if (dt.floating && op != HORA_OP_PRODUCT) {
      cases.push_back(std::make_unique<GroupCase>(std::string("grp.") + dt.name + "." +
                                                      mp::opName(op) + ".scaled",
                                                  0, dt, kShapes, op, salt, 0.5, 2.0));
      salt += 10;
    }
  }
  mp::runAll(cases);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GroupedMatrix, ::testing::ValuesIn(mp::dtypeNameList()),
                         [](const ::testing::TestParamInfo<std::string> &info) { return info.param; });

TEST(Grouped, SingleMember) {
  GroupCase c("grp.single", 0, mp::f32(), {{5, 5}}, HORA_OP_SUM, 1);
  c.run();
}

TEST(Grouped, WithZeroSizeMembers) {
  GroupCase c("grp.zeros", 0, mp::f32(), {{0}, {4, 3}, {0, 7}, {2}}, HORA_OP_SUM, 2);
  c.run();
}

// Groups and single allreduces of the same dtype in flight together, in a rank-dependent
// order: the planner may fuse singles together but must keep each group whole and correct.
TEST(Grouped, ManyGroupsAndSinglesShuffled) {
  const int r = mp::rank();
  std::vector<std::unique_ptr<Case>> cases;
  for (int i = 0; i < 12; ++i) {
    const std::string name = "grp.mix." + std::to_string(i);
    if (i % 3 == 0)
      cases.push_back(std::make_unique<mp::AllreduceCase>(name, 0, mp::f32(), std::vector<int64_t>{10 + i},
                                                          HORA_OP_SUM, 100 + i));
    else
      cases.push_back(std::make_unique<GroupCase>(
          name, 0, mp::f32(), std::vector<std::vector<int64_t>>{{i + 1}, {3, i + 2}, {2}},
          HORA_OP_SUM, 10 * i));
  }
  const size_t count = cases.size();
  for (size_t k = 0; k < count; ++k) cases[(k * 5 + static_cast<size_t>(r) * 7) % count]->submit();
  for (auto &c : cases) c->check();
}

// The same group name every step, as a training loop does.
TEST(Grouped, SameNameEveryStep) {
  for (int step = 0; step < 5; ++step) {
    GroupCase c("grp.step", 0, mp::f32(), kShapes, step % 2 ? HORA_OP_MAX : HORA_OP_SUM, step);
    c.run();
  }
}

// A group larger than HORA_FUSION_THRESHOLD is still negotiated and completed as one unit. The
// runtime restarts (collectively) with a 4 KiB threshold, and restarts again with the default.
TEST(Grouped, LargerThanFusionThreshold) {
  MP_ASSERT_OK(hora_shutdown());
  setenv("HORA_FUSION_THRESHOLD", "4K", 1);
  const hora_status_t s = hora_init();
  unsetenv("HORA_FUSION_THRESHOLD");
  MP_ASSERT_OK(s) << "init with HORA_FUSION_THRESHOLD=4K";
  {
    std::vector<std::unique_ptr<Case>> cases;
    // 6 x 8000 bytes: each member alone is past the threshold.
    cases.push_back(std::make_unique<GroupCase>(
        "grp.big.a", 0, mp::f32(), std::vector<std::vector<int64_t>>(6, std::vector<int64_t>{2000}),
        HORA_OP_SUM, 1));
    // Small members whose sum (12 KiB) is past it.
    std::vector<std::vector<int64_t>> small;
    for (int i = 0; i < 24; ++i) small.push_back({128});
    cases.push_back(std::make_unique<GroupCase>("grp.big.b", 0, mp::f64(), small, HORA_OP_MAX, 2));
    cases.push_back(std::make_unique<GroupCase>("grp.big.c", 0, mp::dtypeNamed("float16"),
                                                std::vector<std::vector<int64_t>>{{3000}, {1500, 2}},
                                                HORA_OP_AVERAGE, 3));
    for (int i = 0; i < 8; ++i)
      cases.push_back(std::make_unique<mp::AllreduceCase>("grp.big.single" + std::to_string(i), 0,
                                                          mp::f32(), std::vector<int64_t>{700},
                                                          HORA_OP_SUM, 10 + i));
    mp::runAll(cases);
  }
  MP_ASSERT_OK(hora_shutdown());
  MP_ASSERT_OK(hora_init());
  GroupCase after("grp.big.after", 0, mp::f32(), kShapes, HORA_OP_SUM, 4);
  after.run();
}

// --- errors ------------------------------------------------------------------------------

TEST(GroupedErrors, RejectedAtSubmissionThenGoodOp) {
  auto a = makeTensor(mp::f32(), {4});
  auto b = makeTensor(mp::f64(), {4});
  auto c = makeTensor(mp::f32(), {5});
  hora_request_t req = nullptr;
  {
    // Members of one group share one dtype.
    DLTensor ins[2] = {*a->dl(), *b->dl()};
    req = nullptr;
    mp::expectRejected("members float32 and float64", HORA_ERR_INVALID_ARGUMENT,
                       hora_grouped_allreduce_async("grp.bad.dtypes", 2, ins, ins, HORA_OP_SUM, 1.0, 1.0, 0, &req),
                       req);
  }
  {
    DLTensor ins[2] = {*a->dl(), *a->dl()};
    DLTensor outs[2] = {*a->dl(), *c->dl()};
    req = nullptr;
    mp::expectRejected("output 1 shaped unlike input 1", HORA_ERR_INVALID_ARGUMENT,
                       hora_grouped_allreduce_async("grp.bad.out", 2, ins, outs, HORA_OP_SUM, 1.0, 1.0, 0, &req),
                       req);
  }
  {
    DLTensor ins[1] = {*a->dl()};
    for (int n : {0, -1}) {
      req = nullptr;
      mp::expectRejected("n = " + std::to_string(n), HORA_ERR_INVALID_ARGUMENT,
                         hora_grouped_allreduce_async("grp.bad.n", n, ins, ins, HORA_OP_SUM, 1.0, 1.0, 0, &req),
                         req);
    }
    req = nullptr;
    mp::expectRejected("NULL inputs", HORA_ERR_INVALID_ARGUMENT,
                       hora_grouped_allreduce_async("grp.bad.null", 1, nullptr, ins, HORA_OP_SUM, 1.0, 1.0, 0, &req),
                       req);
    auto ia = makeTensor(mp::i32(), {4});
    DLTensor ints[1] = {*ia->dl()};
    req = nullptr;
    mp::expectRejected("AVERAGE on int32", HORA_ERR_UNSUPPORTED,
                       hora_grouped_allreduce_async("grp.bad.avg", 1, ints, ints, HORA_OP_AVERAGE, 1.0, 1.0, 0, &req),
                       req);
  }
  GroupCase good("grp.bad.dtypes", 0, mp::f32(), kShapes, HORA_OP_SUM, 5);
  good.run();
}

// Rank 1's group differs (as `vary` says): MISMATCH on every rank, the message names the group,
// and the same name then works.
void expectGroupMismatch(const std::string &name,
                         const std::function<void(std::vector<std::vector<int64_t>> &, DType &,
                                                  hora_reduce_op_t &)> &vary) {
  const int r = mp::rank(), n = mp::size();
  if (n > 1) {
    std::vector<std::vector<int64_t>> shapes = {{4}, {2, 3}};
    DType dt = mp::f32();
    hora_reduce_op_t op = HORA_OP_SUM;
    if (r == 1) vary(shapes, dt, op);
    std::vector<std::unique_ptr<HostTensor>> ts;
    std::vector<DLTensor> dls;
    for (const auto &s : shapes) {
      ts.push_back(makeTensor(dt, s));
      mp::fillInputAs(*ts.back(), HORA_OP_SUM, 1, r, n);
      dls.push_back(*ts.back()->dl());
    }
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_grouped_allreduce_async(name.c_str(), static_cast<int>(dls.size()), dls.data(),
                                              dls.data(), op, 1.0, 1.0, 0, &req));
    Request guard(req);
    mp::expectMismatchAtWait(req, name);
  }
  GroupCase good(name, 0, mp::f32(), {{4}, {2, 3}}, HORA_OP_SUM, 6);
  good.run();
  mp::expectGoodAllreduce(name + ".after", 7);
}

TEST(GroupedErrors, MemberCountMismatch) {
  expectGroupMismatch("grp.mm.count", [](auto &shapes, auto &, auto &) { shapes.push_back({3}); });
}

TEST(GroupedErrors, MemberShapeMismatch) {
  expectGroupMismatch("grp.mm.shape", [](auto &shapes, auto &, auto &) { shapes[1] = {3, 2}; });
}

TEST(GroupedErrors, MemberDtypeMismatch) {
  expectGroupMismatch("grp.mm.dtype", [](auto &, DType &dt, auto &) { dt = mp::f64(); });
}

TEST(GroupedErrors, ReduceOpMismatch) {
  expectGroupMismatch("grp.mm.op", [](auto &, auto &, hora_reduce_op_t &op) { op = HORA_OP_MIN; });
}

}  // namespace
