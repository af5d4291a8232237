// SPDX-License-Identifier: Apache-2.0
// Broadcast from every root for every dtype and size, and zero-element broadcasts.
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

// Outside the range of inputValue, so a rank whose buffer was never written is caught.
double sentinel(const DType &dt) { return dt.isSigned ? -7.0 : 99.0; }

double rootValue(const DType &dt, int root, int n, int64_t j) {
  return mp::inputValue(HORA_OP_SUM, dt, root, n, j, root + 1);
}

class BroadcastMatrix : public ::testing::TestWithParam<std::string> {};

// Every root at once, each under its own name: the engine must keep their roots apart.
TEST_P(BroadcastMatrix, FromEveryRoot) {
  const DType &dt = mp::dtypeNamed(GetParam());
  const int r = mp::rank(), n = mp::size();
  for (int64_t count : {1, 17, 1000, 300000}) {
    std::vector<std::unique_ptr<HostTensor>> tensors;
    std::vector<Request> reqs;
    for (int root = 0; root < n; ++root) {
      auto t = makeTensor(dt, {count});
      if (r == root)
        t->fill([&](int64_t j) { return rootValue(dt, root, n, j); });
      else
        t->fill([&](int64_t) { return sentinel(dt); });
      const std::string name = std::string("bc.") + dt.name + "." + std::to_string(count) +
                               ".root" + std::to_string(root);
      hora_request_t req = nullptr;
      MP_EXPECT_OK(hora_broadcast_async(name.c_str(), t->dl(), root, 0, &req));
      reqs.emplace_back(req);
      tensors.push_back(std::move(t));
    }
    for (int root = 0; root < n; ++root) {
      if (!reqs[root]) continue;
      MP_EXPECT_OK(hora_wait(reqs[root].get()));
      EXPECT_TRUE(mp::matches(*tensors[root], [&](int64_t j) { return rootValue(dt, root, n, j); }))
          << dt.name << " count " << count << " root " << root;
    }
  }
}

std::vector<std::string> dtypeNames() {
  std::vector<std::string> v;
  for (const DType &d : mp::allDTypes()) v.push_back(d.name);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BroadcastMatrix, ::testing::ValuesIn(dtypeNames()),
                         [](const ::testing::TestParamInfo<std::string> &info) { return info.param; });

// A multi-dimensional tensor from the last rank, submitted in the opposite order on odd ranks.
TEST(Broadcast, TwoDimensionalReverseOrder) {
  const DType &dt = mp::dtypeNamed("float64");
  const int r = mp::rank(), n = mp::size();
  const int kTensors = 6;
  std::vector<std::unique_ptr<HostTensor>> tensors(kTensors);
  std::vector<Request> reqs(kTensors);
  const int root = n - 1;
  for (int k = 0; k < kTensors; ++k) {
    const int i = (r % 2) ? kTensors - 1 - k : k;
    tensors[i] = makeTensor(dt, {i + 1, 5});
    if (r == root)
      tensors[i]->fill([&](int64_t j) { return rootValue(dt, root, n, j + i); });
    else
      tensors[i]->fill([&](int64_t) { return sentinel(dt); });
    hora_request_t req = nullptr;
    const std::string name = "bc2d." + std::to_string(i);
    MP_EXPECT_OK(hora_broadcast_async(name.c_str(), tensors[i]->dl(), root, 0, &req));
    reqs[i].reset(req);
  }
  for (int i = 0; i < kTensors; ++i) {
    if (!reqs[i]) continue;
    MP_EXPECT_OK(hora_wait(reqs[i].get()));
    EXPECT_TRUE(mp::matches(*tensors[i], [&](int64_t j) { return rootValue(dt, root, n, j + i); }))
        << "tensor " << i;
  }
}

TEST(BroadcastEdge, ZeroElementsEveryDtype) {
  const int n = mp::size();
  for (const DType &dt : mp::allDTypes()) {
    auto t = makeTensor(dt, {0});
    const std::string name = std::string("bczero.") + dt.name;
    hora_request_t req = nullptr;
    MP_EXPECT_OK(hora_broadcast_async(name.c_str(), t->dl(), n - 1, 0, &req));
    Request guard(req);
    if (req) {
      MP_EXPECT_OK(hora_wait(req));
    }
  }
  auto t = makeTensor(mp::dtypeNamed("int32"), {4, 0});
  hora_request_t req = nullptr;
  MP_EXPECT_OK(hora_broadcast_async("bczero.4x0", t->dl(), 0, 0, &req));
  Request guard(req);
  if (req) {
    MP_EXPECT_OK(hora_wait(req));
  }
}

TEST(BroadcastEdge, ZeroElementsWithNullData) {
  auto t = makeTensor(mp::dtypeNamed("float16"), {0});
  t->dl()->data = nullptr;
  hora_request_t req = nullptr;
  MP_EXPECT_OK(hora_broadcast_async("bczero.null_data", t->dl(), 0, 0, &req));
  Request guard(req);
  if (req) {
    MP_EXPECT_OK(hora_wait(req));
  }
}

}  // namespace
