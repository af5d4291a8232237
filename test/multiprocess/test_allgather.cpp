// SPDX-License-Identifier: Apache-2.0
// Allgather with a first dimension that differs per rank (including zero rows), every dtype.
#include <hora/hora.h>

#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "mp_harness.h"

namespace {

using mp::DType;
using mp::makeTensor;
using mp::Request;

// Identifies (rank, row, column). float32/float64 hold the full value exactly, so every row is
// distinct there; the narrow types wrap at 100 but still catch rows out of rank order.
double agValue(const DType &dt, int r, int64_t row, int64_t col) {
  if (dt.floating && dt.bits >= 32) return r * 1000000.0 + row * 64.0 + col;
  const int64_t v = (r * 10 + row * 3 + col) % 100;
  return dt.isSigned ? static_cast<double>(v - 50) : static_cast<double>(v);
}

void runAllgather(const DType &dt, const std::function<int64_t(int)> &rowsOf,
                  const std::vector<int64_t> &trailing, const std::string &name) {
  const int r = mp::rank(), n = mp::size();
  const int64_t rowElems =
      std::accumulate(trailing.begin(), trailing.end(), int64_t{1}, std::multiplies<int64_t>());
  std::vector<int64_t> shape = {rowsOf(r)};
  shape.insert(shape.end(), trailing.begin(), trailing.end());
  auto in = makeTensor(dt, shape);
  const auto mine = [&](int64_t i) { return agValue(dt, r, i / rowElems, i % rowElems); };
  in->fill(mine);

  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allgather_async(name.c_str(), in->dl(), 0, &req));
  Request guard(req);
  MP_ASSERT_OK(hora_wait(req));
  const DLTensor *out = hora_request_output(req);
  ASSERT_NE(nullptr, out) << name;

  // Which rank and row each output row comes from, in rank order.
  std::vector<std::pair<int, int64_t>> origin;
  for (int q = 0; q < n; ++q)
    for (int64_t row = 0; row < rowsOf(q); ++row) origin.emplace_back(q, row);
  const int64_t total = static_cast<int64_t>(origin.size());

  EXPECT_EQ(dt.code, out->dtype.code) << name;
  EXPECT_EQ(dt.bits, out->dtype.bits) << name;
  EXPECT_EQ(1, out->dtype.lanes) << name;
  EXPECT_EQ(kDLCPU, out->device.device_type) << name;
  ASSERT_EQ(static_cast<int>(shape.size()), out->ndim) << name;
  ASSERT_NE(nullptr, out->shape) << name;
  EXPECT_EQ(total, out->shape[0]) << name;
  for (size_t d = 0; d < trailing.size(); ++d) {
    EXPECT_EQ(trailing[d], out->shape[d + 1]) << name;
  }
  if (out->strides) {
    int64_t expect = 1;
    for (int d = out->ndim - 1; d >= 0; --d) {
      if (out->shape[d] != 1) {
        EXPECT_EQ(expect, out->strides[d]) << name << " dim " << d;
      }
      expect *= out->shape[d];
    }
  }
  if (total > 0) {
    ASSERT_NE(nullptr, out->data) << name;
  }
  if (::testing::Test::HasFatalFailure() || out->shape[0] != total) return;
  EXPECT_TRUE(mp::matches(*out, [&](int64_t i) {
    const auto &o = origin[static_cast<size_t>(i / rowElems)];
    return agValue(dt, o.first, o.second, i % rowElems);
  })) << name;
  EXPECT_TRUE(mp::matches(*in, mine)) << name << ": allgather modified its input";
}

class AllgatherMatrix : public ::testing::TestWithParam<std::string> {};

TEST_P(AllgatherMatrix, RowsDifferPerRank) {
  const DType &dt = mp::dtypeNamed(GetParam());
  runAllgather(dt, [](int q) { return int64_t{q} + 1; }, {3}, std::string("ag.rows.") + dt.name);
}

// Rank 0 contributes nothing; at one rank the whole result is empty.
TEST_P(AllgatherMatrix, OneRankContributesZeroRows) {
  const DType &dt = mp::dtypeNamed(GetParam());
  runAllgather(dt, [](int q) { return int64_t{q}; }, {3}, std::string("ag.zero.") + dt.name);
}

std::vector<std::string> dtypeNames() {
  std::vector<std::string> v;
  for (const DType &d : mp::allDTypes()) v.push_back(d.name);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AllgatherMatrix, ::testing::ValuesIn(dtypeNames()),
                         [](const ::testing::TestParamInfo<std::string> &info) { return info.param; });

TEST(Allgather, OneDimensional) {
  runAllgather(mp::dtypeNamed("float32"), [](int q) { return int64_t{2} * q + 1; }, {}, "ag.1d");
}

TEST(Allgather, ThreeDimensional) {
  runAllgather(mp::dtypeNamed("int32"), [](int q) { return int64_t{q} + 2; }, {2, 3}, "ag.3d");
}

TEST(Allgather, LargeRowsDifferPerRank) {
  runAllgather(mp::dtypeNamed("float64"), [](int q) { return int64_t{1000} * (q + 1) + q; }, {30},
               "ag.large");
}

TEST(Allgather, SameRowsEveryRank) {
  runAllgather(mp::dtypeNamed("bfloat16"), [](int) { return int64_t{4}; }, {5}, "ag.same");
}

// Several allgathers in flight at once, submitted in a rank-dependent order.
TEST(Allgather, ManyInFlightShuffled) {
  const DType &dt = mp::dtypeNamed("float32");
  const int r = mp::rank(), n = mp::size();
  const int kCount = 20;
  std::vector<std::unique_ptr<mp::HostTensor>> ins(kCount);
  std::vector<Request> reqs(kCount);
  for (int k = 0; k < kCount; ++k) {
    const int i = (k * 7 + r * 3) % kCount;  // 7 and 3 are coprime with 20: a permutation
    ins[i] = makeTensor(dt, {(r + i) % 3, 2});
    ins[i]->fill([&](int64_t e) { return agValue(dt, r, e / 2 + 100 * i, e % 2); });
    hora_request_t req = nullptr;
    const std::string name = "ag.many." + std::to_string(i);
    MP_EXPECT_OK(hora_allgather_async(name.c_str(), ins[i]->dl(), 0, &req));
    reqs[i].reset(req);
  }
  for (int i = 0; i < kCount; ++i) {
    if (!reqs[i]) continue;
    MP_EXPECT_OK(hora_wait(reqs[i].get()));
    const DLTensor *out = hora_request_output(reqs[i].get());
    ASSERT_NE(nullptr, out) << i;
    std::vector<std::pair<int, int64_t>> origin;
    for (int q = 0; q < n; ++q)
      for (int64_t row = 0; row < (q + i) % 3; ++row) origin.emplace_back(q, row);
    ASSERT_EQ(2, out->ndim);
    ASSERT_EQ(static_cast<int64_t>(origin.size()), out->shape[0]) << i;
    EXPECT_TRUE(mp::matches(*out, [&](int64_t e) {
      const auto &o = origin[static_cast<size_t>(e / 2)];
      return agValue(dt, o.first, o.second + 100 * i, e % 2);
    })) << "tensor " << i;
  }
}

}  // namespace
