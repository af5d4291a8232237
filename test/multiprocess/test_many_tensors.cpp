// SPDX-License-Identifier: Apache-2.0
// Hundreds of tiny tensors per step in a per-rank order: fusion and the response cache.
#include <hora/hora.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "mp_harness.h"

namespace {

using mp::DType;
using mp::HostTensor;
using mp::makeTensor;
using mp::Request;

struct Spec {
  std::string name;
  DType dt;
  int64_t count;
  hora_reduce_op_t op;
  double pre, post;
  bool inPlace;
};

// A fixed, varied population: every dtype, sizes 1..64, every op the dtype allows, three scale
// pairs on floating types, both placements. Neighbours differ in dtype, op or scale, so the
// planner has to split a ready list into many compatible groups.
std::vector<Spec> population(int count, const std::string &prefix) {
  static const double kScales[3][2] = {{1.0, 1.0}, {0.5, 2.0}, {2.0, 0.25}};
  std::vector<Spec> specs;
  for (int i = 0; i < count; ++i) {
    Spec s;
    s.name = prefix + std::to_string(i);
    s.dt = mp::allDTypes()[static_cast<size_t>((i * 3) % 8)];
    s.count = 1 + (i * 37) % 64;
    std::vector<hora_reduce_op_t> ops;
    for (hora_reduce_op_t op : mp::allOps())
      if (s.dt.floating || op != HORA_OP_AVERAGE) ops.push_back(op);
    s.op = ops[static_cast<size_t>((i / 8) % ops.size())];
    const int sc = s.dt.floating ? (i / 5) % 3 : 0;
    s.pre = kScales[sc][0];
    s.post = kScales[sc][1];
    s.inPlace = (i / 3) % 2 == 0;
    specs.push_back(s);
  }
  return specs;
}

std::vector<size_t> shuffled(size_t n, uint32_t seed) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

uint32_t seedFor(int rank, int step, int salt) {
  return static_cast<uint32_t>(1 + 7919 * rank + 104729 * step + 15485863 * salt);
}

// Runs one step over `specs` (those with active[i]) with buffers that persist across steps, as a
// training loop's gradients do.
void runStep(const std::vector<Spec> &specs, const std::vector<bool> &active,
             std::vector<std::unique_ptr<HostTensor>> &ins,
             std::vector<std::unique_ptr<HostTensor>> &outs, int step) {
  const int r = mp::rank();
  const size_t n = specs.size();
  std::vector<Request> reqs(n);
  for (size_t i = 0; i < n; ++i) {
    if (!active[i]) continue;
    if (!ins[i]) {
      ins[i] = makeTensor(specs[i].dt, {specs[i].count});
      if (!specs[i].inPlace) outs[i] = makeTensor(specs[i].dt, {specs[i].count});
    }
    mp::fillInput(*ins[i], specs[i].op, step * 1000 + static_cast<int64_t>(i));
  }
  for (size_t i : shuffled(n, seedFor(r, step, 1))) {
    if (!active[i]) continue;
    const Spec &s = specs[i];
    hora_request_t req = nullptr;
    MP_EXPECT_OK(hora_allreduce_async(s.name.c_str(), ins[i]->dl(),
                                      s.inPlace ? ins[i]->dl() : outs[i]->dl(), s.op, s.pre,
                                      s.post, 0, &req))
        << s.name;
    reqs[i].reset(req);
  }
  int wrong = 0;
  for (size_t i : shuffled(n, seedFor(r, step, 2))) {
    if (!reqs[i]) continue;
    const Spec &s = specs[i];
    const hora_status_t st = hora_wait(reqs[i].get());
    if (st != HORA_SUCCESS) {
      ADD_FAILURE() << s.name << " step " << step << ": " << mp::statusName(st) << " ("
                    << mp::lastError() << ")";
      continue;
    }
    const HostTensor &result = s.inPlace ? *ins[i] : *outs[i];
    const auto ok = mp::matchesReduction(result, s.op, step * 1000 + static_cast<int64_t>(i), s.pre, s.post);
    // Cap the report: one systematic bug would otherwise print 500 failures.
    if (!ok && ++wrong <= 5)
      ADD_FAILURE() << s.name << " (" << s.dt.name << " " << mp::opName(s.op) << " x" << s.count
                    << " pre " << s.pre << " post " << s.post << (s.inPlace ? " in" : " out")
                    << ") step " << step << ": " << ok.message();
  }
  EXPECT_EQ(0, wrong) << "tensors with wrong results in step " << step;
}

TEST(ManyTensors, FiveStepsOf500ShuffledPerRank) {
  const std::vector<Spec> specs = population(500, "many.");
  std::vector<std::unique_ptr<HostTensor>> ins(specs.size()), outs(specs.size());
  const std::vector<bool> all(specs.size(), true);
  for (int step = 0; step < 5; ++step) runStep(specs, all, ins, outs, step);
}

// Steps that leave some cached names out, then bring them back: the cache must not wait for an
// absent tensor nor confuse positions.
TEST(ManyTensors, SubsetsOfCachedNames) {
  const std::vector<Spec> specs = population(120, "subset.");
  std::vector<std::unique_ptr<HostTensor>> ins(specs.size()), outs(specs.size());
  for (int step = 0; step < 6; ++step) {
    std::vector<bool> active(specs.size());
    for (size_t i = 0; i < specs.size(); ++i)
      active[i] = step % 3 == 0 || (i % 3) != static_cast<size_t>(step % 3);
    runStep(specs, active, ins, outs, step);
  }
}

// The same names with a new shape or dtype (all ranks agree): a cached response must not be
// reused for a tensor that changed.
TEST(ManyTensors, CachedNamesChangeShapeAndDtype) {
  const int kNames = 10;
  struct Variant {
    const char *dtype;
    int64_t count;
  };
  const Variant variants[] = {{"float32", 8}, {"float32", 9}, {"int32", 9}, {"float32", 8}, {"float64", 64}};
  int step = 0;
  for (const Variant &v : variants) {
    const DType &dt = mp::dtypeNamed(v.dtype);
    std::vector<std::unique_ptr<HostTensor>> ts;
    std::vector<Request> reqs;
    for (int k = 0; k < kNames; ++k) {
      ts.push_back(makeTensor(dt, {v.count}));
      mp::fillInput(*ts.back(), HORA_OP_SUM, step * 100 + k);
      hora_request_t req = nullptr;
      const std::string name = "reshape." + std::to_string(k);
      MP_EXPECT_OK(hora_allreduce_async(name.c_str(), ts.back()->dl(), ts.back()->dl(), HORA_OP_SUM,
                                        1.0, 1.0, 0, &req));
      reqs.emplace_back(req);
    }
    for (int k = 0; k < kNames; ++k) {
      if (!reqs[k]) continue;
      MP_EXPECT_OK(hora_wait(reqs[k].get())) << "variant " << step;
      EXPECT_TRUE(mp::matchesReduction(*ts[k], HORA_OP_SUM, step * 100 + k, 1.0, 1.0))
          << "reshape." << k << " variant " << step;
    }
    ++step;
  }
}

// Tiny tensors mixed with one large one that should not be packed with them.
TEST(ManyTensors, TinyAroundALargeTensor) {
  const DType &dt = mp::dtypeNamed("float32");
  auto big = makeTensor(dt, {1 << 20});
  mp::fillInput(*big, HORA_OP_SUM, 77);
  std::vector<std::unique_ptr<HostTensor>> tiny;
  std::vector<Request> reqs;
  for (int k = 0; k < 64; ++k) {
    if (k == 32) {
      hora_request_t req = nullptr;
      MP_EXPECT_OK(hora_allreduce_async("mixed.big", big->dl(), big->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
      reqs.emplace_back(req);
    }
    tiny.push_back(makeTensor(dt, {k + 1}));
    mp::fillInput(*tiny.back(), HORA_OP_SUM, k);
    hora_request_t req = nullptr;
    const std::string name = "mixed.tiny." + std::to_string(k);
    MP_EXPECT_OK(hora_allreduce_async(name.c_str(), tiny.back()->dl(), tiny.back()->dl(),
                                      HORA_OP_SUM, 1.0, 1.0, 0, &req));
    reqs.emplace_back(req);
  }
  for (Request &q : reqs)
    if (q) {
      MP_EXPECT_OK(hora_wait(q.get()));
    }
  EXPECT_TRUE(mp::matchesReduction(*big, HORA_OP_SUM, 77, 1.0, 1.0)) << "mixed.big";
  for (int k = 0; k < 64; ++k)
    EXPECT_TRUE(mp::matchesReduction(*tiny[k], HORA_OP_SUM, k, 1.0, 1.0)) << "mixed.tiny." << k;
}

}  // namespace
