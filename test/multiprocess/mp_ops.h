// SPDX-License-Identifier: Apache-2.0
// Header-only helpers shared by the tests of alltoall, reducescatter, sets, join and friends.
#pragma once

#include <hora/hora.h>

#include <gtest/gtest.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "mp_harness.h"

namespace mp {

inline const DType &f32() { return dtypeNamed("float32"); }
inline const DType &f64() { return dtypeNamed("float64"); }
inline const DType &i32() { return dtypeNamed("int32"); }

inline std::vector<std::string> dtypeNameList() {
  std::vector<std::string> v;
  for (const DType &d : allDTypes()) v.push_back(d.name);
  return v;
}

inline int64_t product(const std::vector<int64_t> &dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<int64_t>());
}

// CLOCK_MONOTONIC is one clock for every process on the host, so timestamps taken on different
// ranks of a one-host job can be compared directly.
inline int64_t monotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Block `b` of `rows` rows split over `n` ranks as the contract says: rows/n each, the first
// rows%n ranks one more.
inline int64_t blockRows(int64_t rows, int n, int b) {
  return rows / n + (b < rows % n ? 1 : 0);
}
inline int64_t blockStart(int64_t rows, int n, int b) {
  return static_cast<int64_t>(b) * (rows / n) + std::min<int64_t>(b, rows % n);
}

// Fills `in` with inputValue as rank r of a set of n ranks.
inline void fillInputAs(HostTensor &in, hora_reduce_op_t op, int64_t salt, int r, int n) {
  in.fill([&](int64_t j) { return inputValue(op, in.dtype(), r, n, j, salt); });
}

// Checks a reduction over a set of n ranks; element i of `out` is element i + offset of the
// full (unscattered) result.
inline ::testing::AssertionResult matchesReductionOf(const HostTensor &out, hora_reduce_op_t op,
                                                     int64_t salt, double pre, double post, int n,
                                                     int64_t offset = 0) {
  const DType dt = out.dtype();
  return matches(
      out, [&](int64_t i) { return expectedValue(op, dt, n, i + offset, salt, pre, post); },
      [&](int64_t i) {
        return tolerance(op, dt, expectedValue(op, dt, n, i + offset, salt, pre, post));
      });
}

// The same for a DLTensor the runtime owns (reducescatter output).
inline ::testing::AssertionResult matchesReductionOf(const DLTensor &out, const DType &dt,
                                                     hora_reduce_op_t op, int64_t salt, int n,
                                                     int64_t offset) {
  const int64_t count = numel(out);
  int64_t bad = 0;
  std::string msg;
  for (int64_t i = 0; i < count; ++i) {
    const double want = expectedValue(op, dt, n, i + offset, salt, 1.0, 1.0);
    const double got = readElement(out, i);
    const double tol = tolerance(op, dt, want);
    if (got == want || (tol > 0 && std::abs(got - want) <= tol)) continue;
    if (bad < 5)
      msg += "\n  [" + std::to_string(i) + "] got " + std::to_string(got) + ", expected " +
             std::to_string(want);
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << count << " elements wrong" << msg;
}

// One allreduce every rank of `set` agrees on, checked; proves the runtime (and the set) still
// work after an error. Only members of `set` may call it.
inline void expectGoodAllreduceIn(int32_t set, const std::string &name, int64_t salt) {
  const int r = hora_process_set_rank(set), n = hora_process_set_size(set);
  auto t = makeTensor(f32(), {3, 7});
  fillInputAs(*t, HORA_OP_SUM, salt, r, n);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async(name.c_str(), t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, set, &req))
      << name << ": runtime unusable after an error";
  Request guard(req);
  MP_ASSERT_OK(hora_wait(req)) << name;
  EXPECT_TRUE(matchesReductionOf(*t, HORA_OP_SUM, salt, 1.0, 1.0, n)) << name;
}

inline void expectGoodAllreduce(const std::string &name, int64_t salt) {
  expectGoodAllreduceIn(0, name, salt);
}

// A local failure at submission: status `want`, a message, nothing enqueued. A request that is
// wrongly accepted is freed (it completes or fails on its own without hanging anyone, because
// every rank makes the same call).
inline void expectRejected(const std::string &what, hora_status_t want, hora_status_t got,
                           hora_request_t req) {
  const std::string err = lastError();
  EXPECT_EQ(statusName(want), statusName(got)) << what << ": '" << err << "'";
  if (got != HORA_SUCCESS) {
    EXPECT_FALSE(err.empty()) << what << ": no hora_last_error()";
  } else if (req) {
    hora_request_free(req);
  }
}

// Waits for a request expected to fail with MISMATCH on this rank; the message must name the
// tensor.
inline void expectMismatchAtWait(hora_request_t req, const std::string &name) {
  const hora_status_t s = hora_wait(req);
  const std::string err = lastError();
  EXPECT_EQ(statusName(HORA_ERR_MISMATCH), statusName(s)) << name << ": '" << err << "'";
  EXPECT_NE(std::string::npos, err.find(name))
      << name << ": message does not name the tensor: '" << err << "'";
  EXPECT_EQ(nullptr, hora_request_output(req)) << name << ": output of a failed op";
}

// Allgather of one int64 row per rank of `set`; returns every rank's row in set-rank order.
inline std::vector<std::vector<int64_t>> allgatherRows(const std::string &name,
                                                        const std::vector<int64_t> &mine,
                                                        int32_t set = 0) {
  const int64_t cols = static_cast<int64_t>(mine.size());
  auto t = makeTensor(dtypeNamed("int64"), {1, cols});
  for (int64_t c = 0; c < cols; ++c) t->set(c, static_cast<double>(mine[static_cast<size_t>(c)]));
  hora_request_t req = nullptr;
  std::vector<std::vector<int64_t>> rows;
  if (hora_allgather_async(name.c_str(), t->dl(), set, &req) != HORA_SUCCESS) {
    ADD_FAILURE() << name << ": allgather refused: " << lastError();
    return rows;
  }
  Request guard(req);
  if (hora_wait(req) != HORA_SUCCESS) {
    ADD_FAILURE() << name << ": allgather failed: " << lastError();
    return rows;
  }
  const DLTensor *out = hora_request_output(req);
  if (out == nullptr || out->ndim != 2 || out->shape[1] != cols) {
    ADD_FAILURE() << name << ": allgather output missing or misshapen";
    return rows;
  }
  // int64 values as large as nanosecond timestamps do not survive a trip through double, so
  // read the raw elements.
  const int64_t *p = reinterpret_cast<const int64_t *>(static_cast<const char *>(out->data) +
                                                       out->byte_offset);
  for (int64_t r = 0; r < out->shape[0]; ++r) rows.emplace_back(p + r * cols, p + (r + 1) * cols);
  return rows;
}

// Creates a process set on every rank (collective over the world); fails the test on error.
inline int32_t createSet(const std::vector<int> &ranks) {
  int32_t id = -1;
  const hora_status_t s = hora_process_set_create(ranks.data(), static_cast<int>(ranks.size()), &id);
  EXPECT_EQ(statusName(HORA_SUCCESS), statusName(s)) << "hora_process_set_create: " << lastError();
  return s == HORA_SUCCESS ? id : -1;
}

inline std::vector<int> evenRanks(int n) {
  std::vector<int> v;
  for (int r = 0; r < n; r += 2) v.push_back(r);
  return v;
}
inline std::vector<int> oddRanks(int n) {
  std::vector<int> v;
  for (int r = 1; r < n; r += 2) v.push_back(r);
  return v;
}
inline bool contains(const std::vector<int> &ranks, int r) {
  return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
}
inline int indexIn(const std::vector<int> &ranks, int r) {
  auto it = std::find(ranks.begin(), ranks.end(), r);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

}  // namespace mp
