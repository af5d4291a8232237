// SPDX-License-Identifier: Apache-2.0
// The intra-host allreduce path's own edges: sizes on both sides of the eager limit and of window
// and share boundaries, fused tensors that straddle shares, thousands of tiny tensors, and eager
// and windowed operations back to back (staging and result areas alternate). Under a launcher that
// puts every rank on one host this exercises lib/backends/shm; with HORA_SHM=off (or across
// hosts) the same checks hold for the MPI or Gloo path.
#include <hora/hora.h>

#include <memory>
#include <string>
#include <vector>

#include "mp_harness.h"

namespace {

using mp::DType;
using mp::HostTensor;
using mp::makeTensor;
using mp::Request;

constexpr int64_t kEagerBytes = 32 << 10;  // lib/backends/shm: the staging limit

struct Item {
  std::string name;
  hora_reduce_op_t op;
  int64_t salt;
  double pre, post;
  bool inPlace;
  std::unique_ptr<HostTensor> in, out;
  Request req;
};

Item submit(const DType &dt, int64_t count, hora_reduce_op_t op, bool inPlace, double pre,
            double post, const std::string &name, int64_t salt) {
  Item it{name, op, salt, pre, post, inPlace, makeTensor(dt, {count}), nullptr, nullptr};
  mp::fillInput(*it.in, op, salt);
  if (!inPlace) {
    it.out = makeTensor(dt, {count});
    it.out->fill([](int64_t) { return -3.0; });
  }
  hora_request_t req = nullptr;
  MP_EXPECT_OK(hora_allreduce_async(name.c_str(), it.in->dl(), inPlace ? it.in->dl() : it.out->dl(),
                                    op, pre, post, 0, &req))
      << name;
  it.req.reset(req);
  return it;
}

void finish(std::vector<Item> &items) {
  for (Item &it : items) {
    if (!it.req) continue;
    MP_EXPECT_OK(hora_wait(it.req.get())) << it.name;
    EXPECT_TRUE(mp::matchesReduction(it.inPlace ? *it.in : *it.out, it.op, it.salt, it.pre, it.post))
        << it.name;
  }
  items.clear();
}

// One at a time, so each is its own operation and its size decides the path.
TEST(ShmPath, SizesAroundTheEagerLimitAndShareBoundaries) {
  for (const char *dtName : {"float32", "float16", "bfloat16", "int8", "float64"}) {
    const DType &dt = mp::dtypeNamed(dtName);
    const int64_t eager = kEagerBytes / static_cast<int64_t>(dt.bytes());
    for (int64_t count : {int64_t{1}, int64_t{3}, eager - 1, eager, eager + 1, int64_t{65537},
                          int64_t{262147}}) {
      for (hora_reduce_op_t op : {HORA_OP_SUM, HORA_OP_MAX, HORA_OP_PRODUCT}) {
        for (bool inPlace : {true, false}) {
          const double pre = dt.floating ? 2.0 : 1.0, post = dt.floating ? 0.25 : 1.0;
          const std::string name = std::string("shm.") + dtName + "." + std::to_string(count) + "." +
                                   mp::opName(op) + (inPlace ? ".in" : ".out");
          std::vector<Item> one;
          one.push_back(submit(dt, count, op, inPlace, pre, post, name, count % 11));
          finish(one);
        }
      }
    }
  }
}

// Odd-sized tensors in flight together, fused into one operation whose share boundaries fall
// inside tensors.
TEST(ShmPath, FusedTensorsStraddleShares) {
  for (const char *dtName : {"float32", "bfloat16"}) {
    const DType &dt = mp::dtypeNamed(dtName);
    for (int round = 0; round < 3; ++round) {
      std::vector<Item> items;
      for (int i = 0; i < 97; ++i) {
        const int64_t count = (i * 7919 + round * 31) % 20011 + 1;
        items.push_back(submit(dt, count, HORA_OP_SUM, i % 3 == 0, 1.0, 1.0,
                               std::string("straddle.") + dtName + "." + std::to_string(i), i + round));
      }
      finish(items);
    }
  }
}

// Thousands of tiny tensors in flight, fused into few operations of many pieces each.
TEST(ShmPath, ThousandsOfTinyTensors) {
  const DType &dt = mp::dtypeNamed("float32");
  std::vector<Item> items;
  for (int i = 0; i < 5000; ++i) {
    items.push_back(submit(dt, 3, HORA_OP_SUM, i % 2 == 0, 1.0, 1.0, "many." + std::to_string(i), i));
  }
  finish(items);
}

// Eager and large operations alternate, on the same names, with and without waiting in between.
TEST(ShmPath, EagerAndLargeBackToBack) {
  const DType &dt = mp::dtypeNamed("float32");
  for (int step = 0; step < 40; ++step) {
    std::vector<Item> items;
    items.push_back(submit(dt, step % 2 ? 100 : 100000, HORA_OP_SUM, true, 1.0, 1.0, "alt.a", step));
    if (step % 3 == 0) finish(items);
    items.push_back(submit(dt, step % 2 ? 70000 : 7, HORA_OP_MIN, false, 1.0, 1.0, "alt.b", step + 1));
    finish(items);
  }
}

}  // namespace
