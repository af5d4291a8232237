// SPDX-License-Identifier: Apache-2.0
// Alltoall: every dtype, uneven splits with zeros, NULL splits, 1-D and 3-D, errors, mismatches.
#include <hora/hora.h>

#include <memory>
#include <string>
#include <vector>

#include "mp_cases.h"
#include "mp_harness.h"
#include "mp_ops.h"

namespace {

using mp::AlltoallCase;
using mp::Case;
using mp::DType;
using mp::HostTensor;
using mp::makeTensor;
using mp::Request;

// 0..3 rows from src to dst; a zero appears for some pair at every size above one, and the row
// counts differ per rank, so both what a rank sends and what it receives are uneven.
int64_t unevenSplit(int src, int dst) { return (src + 2 * dst + 1) % 4; }

class AlltoallMatrix : public ::testing::TestWithParam<std::string> {};

TEST_P(AlltoallMatrix, UnevenSplitsWithZeros) {
  const DType &dt = mp::dtypeNamed(GetParam());
  AlltoallCase c(std::string("a2a.uneven.") + dt.name, 0, dt, unevenSplit, {3}, 1);
  c.run();
}

TEST_P(AlltoallMatrix, NullSplitsEven) {
  const DType &dt = mp::dtypeNamed(GetParam());
  AlltoallCase c(std::string("a2a.even.") + dt.name, 0, dt, [](int, int) { return int64_t{2}; },
                 {5}, 2, /*nullSplits=*/true);
  c.run();
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AlltoallMatrix, ::testing::ValuesIn(mp::dtypeNameList()),
                         [](const ::testing::TestParamInfo<std::string> &info) { return info.param; });

TEST(Alltoall, OneDimensional) {
  AlltoallCase c("a2a.1d", 0, mp::f32(), [](int s, int d) { return int64_t{s + d}; }, {}, 3);
  c.run();
}

TEST(Alltoall, OneDimensionalNullSplits) {
  AlltoallCase c("a2a.1d.null", 0, mp::dtypeNamed("int64"), [](int, int) { return int64_t{3}; }, {},
                 4, true);
  c.run();
}

TEST(Alltoall, ThreeDimensional) {
  AlltoallCase c("a2a.3d", 0, mp::dtypeNamed("int32"), unevenSplit, {2, 3}, 5);
  c.run();
}

TEST(Alltoall, ThreeDimensionalNullSplits) {
  AlltoallCase c("a2a.3d.null", 0, mp::dtypeNamed("bfloat16"), [](int, int) { return int64_t{1}; },
                 {4, 2}, 6, true);
  c.run();
}

// Every rank sends everything to rank 0: the others receive nothing at all.
TEST(Alltoall, EverythingToRankZero) {
  AlltoallCase c("a2a.to0", 0, mp::f64(), [](int s, int d) { return d == 0 ? int64_t{s + 1} : 0; },
                 {2}, 7);
  c.run();
}

// The last rank sends nothing (its input has zero rows) but still receives.
TEST(Alltoall, OneRankSendsNothing) {
  const int n = mp::size();
  AlltoallCase c("a2a.silent", 0, mp::f32(),
                 [n](int s, int d) { return s == n - 1 ? int64_t{0} : int64_t{d + 1}; }, {3}, 8);
  c.run();
}

// Blocks of a few hundred KiB per pair: past any eager-protocol threshold of the backend.
TEST(Alltoall, LargeUneven) {
  AlltoallCase c("a2a.large", 0, mp::f64(), [](int s, int d) { return int64_t{500} * (1 + (s + d) % 3); },
                 {40}, 9);
  c.run();
}

// Many alltoalls in flight at once, submitted in a rank-dependent order.
TEST(Alltoall, ManyInFlightShuffled) {
  const int r = mp::rank();
  const int kCount = 16;
  std::vector<std::unique_ptr<Case>> cases(kCount);
  for (int i = 0; i < kCount; ++i) {
    const DType &dt = mp::allDTypes()[static_cast<size_t>(i) % mp::allDTypes().size()];
    cases[static_cast<size_t>(i)] = std::make_unique<AlltoallCase>(
        "a2a.many." + std::to_string(i), 0, dt,
        [i](int s, int d) { return int64_t{(s * 3 + d + i) % 3}; }, std::vector<int64_t>{2}, i);
  }
  for (int k = 0; k < kCount; ++k) cases[static_cast<size_t>((k * 5 + r * 3) % kCount)]->submit();
  for (auto &c : cases) c->check();
}

// The same name every step, as a training loop does: the response cache must not replay one
// step's splits for the next step's.
TEST(Alltoall, SameNameDifferentSplitsEachStep) {
  for (int step = 0; step < 6; ++step) {
    AlltoallCase c("a2a.step", 0, mp::f32(),
                   [step](int s, int d) { return int64_t{(s + d * step + step) % 3}; }, {4}, step);
    c.run();
  }
}

// --- errors ------------------------------------------------------------------------------

TEST(AlltoallErrors, BadSplitsRejectedAtSubmissionThenGoodOp) {
  const int n = mp::size();
  auto t = makeTensor(mp::f32(), {2 * n + 1, 3});
  hora_request_t req = nullptr;
  std::vector<int64_t> splits(static_cast<size_t>(n), 2);
  splits[0] = 3;  // sums to 2n+1: valid, as a baseline for the variants below

  std::vector<int64_t> negative = splits;
  if (n > 1) {
    negative[static_cast<size_t>(n - 1)] = -1;
    negative[0] += 3;  // still sums to the first dimension: only the sign is wrong
  } else {
    negative[0] = -1;
  }
  req = nullptr;
  mp::expectRejected("negative split", HORA_ERR_INVALID_ARGUMENT,
                     hora_alltoall_async("a2a.bad.neg", t->dl(), negative.data(), 0, &req), req);

  std::vector<int64_t> tooMany = splits;
  tooMany[0] += 1;
  req = nullptr;
  mp::expectRejected("splits sum past the first dimension", HORA_ERR_INVALID_ARGUMENT,
                     hora_alltoall_async("a2a.bad.sum_hi", t->dl(), tooMany.data(), 0, &req), req);

  std::vector<int64_t> tooFew = splits;
  tooFew[0] -= 1;
  req = nullptr;
  mp::expectRejected("splits sum short of the first dimension", HORA_ERR_INVALID_ARGUMENT,
                     hora_alltoall_async("a2a.bad.sum_lo", t->dl(), tooFew.data(), 0, &req), req);

  if (n > 1) {
    // 2n+1 rows cannot be split evenly over n > 1 ranks.
    req = nullptr;
    mp::expectRejected("NULL splits with indivisible rows", HORA_ERR_INVALID_ARGUMENT,
                       hora_alltoall_async("a2a.bad.even", t->dl(), nullptr, 0, &req), req);
  }
  {
    DLTensor scalar = *t->dl();
    scalar.ndim = 0;
    int64_t one = 1;
    req = nullptr;
    mp::expectRejected("scalar input", HORA_ERR_INVALID_ARGUMENT,
                       hora_alltoall_async("a2a.bad.scalar", &scalar, &one, 0, &req), req);
  }
  req = nullptr;
  mp::expectRejected("NULL input", HORA_ERR_INVALID_ARGUMENT,
                     hora_alltoall_async("a2a.bad.null", nullptr, splits.data(), 0, &req), req);
  mp::expectRejected("NULL request_p", HORA_ERR_INVALID_ARGUMENT,
                     hora_alltoall_async("a2a.bad.req", t->dl(), splits.data(), 0, nullptr), nullptr);
  req = nullptr;
  mp::expectRejected("unknown process set", HORA_ERR_INVALID_ARGUMENT,
                     hora_alltoall_async("a2a.bad.set", t->dl(), splits.data(), 4242, &req), req);

  // The names of the refused calls were never taken: a good alltoall under one of them works.
  AlltoallCase good("a2a.bad.neg", 0, mp::f32(), unevenSplit, {3}, 10);
  good.run();
  mp::expectGoodAllreduce("a2a.bad.after", 11);
}

// Rank 1 disagrees about the trailing dimensions (or the dtype): the op fails with MISMATCH on
// every rank, the message names the tensor, and the runtime stays usable.
void expectAlltoallMismatch(const std::string &name, const DType &oddType,
                            std::vector<int64_t> oddTrailing) {
  const int r = mp::rank(), n = mp::size();
  if (n > 1) {
    const bool odd = r == 1;
    std::vector<int64_t> shape = {n};
    const std::vector<int64_t> trailing = odd ? oddTrailing : std::vector<int64_t>{3};
    shape.insert(shape.end(), trailing.begin(), trailing.end());
    auto t = makeTensor(odd ? oddType : mp::f32(), shape);
    t->fill([](int64_t i) { return static_cast<double>(i % 50); });
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_alltoall_async(name.c_str(), t->dl(), nullptr, 0, &req));
    Request guard(req);
    mp::expectMismatchAtWait(req, name);
  }
  AlltoallCase good(name, 0, mp::f32(), unevenSplit, {3}, 12);
  good.run();
  mp::expectGoodAllreduce(name + ".after", 13);
}

TEST(AlltoallErrors, TrailingDimsMismatch) {
  expectAlltoallMismatch("a2a.mm.trailing", mp::f32(), {4});
}

TEST(AlltoallErrors, NumberOfDimsMismatch) {
  expectAlltoallMismatch("a2a.mm.ndim", mp::f32(), {3, 1});
}

TEST(AlltoallErrors, DtypeMismatch) {
  expectAlltoallMismatch("a2a.mm.dtype", mp::i32(), {3});
}

}  // namespace
