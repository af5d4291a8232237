// SPDX-License-Identifier: Apache-2.0
// Shared helpers of the multi-process tests: dtypes, host tensors, expected values, checks.
#pragma once

#include <hora/hora.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mp {

// The eight element types of the contract, described from the test's side only: the tests
// never include lib/ headers, so a bug shared by the library's tables cannot hide here.
struct DType {
  const char *name;
  uint8_t code;  // DLDataTypeCode
  uint8_t bits;
  bool floating;
  bool isSigned;  // floating types are signed

  size_t bytes() const { return bits / 8; }
  DLDataType dl() const { return DLDataType{code, bits, 1}; }
};

const std::vector<DType> &allDTypes();
const std::vector<DType> &floatDTypes();
const DType &dtypeNamed(const std::string &name);

const std::vector<hora_reduce_op_t> &allOps();
const char *opName(hora_reduce_op_t op);

// float16 / bfloat16 conversions written for the tests (round to nearest even), independent of
// the library's own.
uint16_t floatToHalf(float f);
float halfToFloat(uint16_t h);
uint16_t floatToBf16(float f);
float bf16ToFloat(uint16_t b);

// What the dtype stores for v (v rounded to the dtype), as a double.
double roundTo(const DType &dt, double v);
// Size of one unit in the last place of v in the dtype (0 for integer dtypes).
double ulp(const DType &dt, double v);

// Element i of a CPU DLTensor (honours byte_offset), converted to double.
double readElement(const DLTensor &t, int64_t i);
int64_t numel(const DLTensor &t);

// A contiguous CPU tensor over owned storage (strides NULL). Neither copyable nor movable: its
// DLTensor points into it, and the runtime keeps that pointer while a request is in flight.
class HostTensor {
 public:
  HostTensor(const DType &dt, std::vector<int64_t> shape);
  HostTensor(const HostTensor &) = delete;
  HostTensor &operator=(const HostTensor &) = delete;

  DLTensor *dl() { return &dl_; }
  const DLTensor *dl() const { return &dl_; }
  const DType &dtype() const { return dt_; }
  int64_t numel() const { return numel_; }

  double get(int64_t i) const;
  void set(int64_t i, double v);
  void fill(const std::function<double(int64_t)> &f);

 private:
  DType dt_;
  std::vector<int64_t> shape_;
  std::vector<uint64_t> storage_;  // uint64_t: 8-byte aligned for every dtype
  int64_t numel_;
  DLTensor dl_;
};

std::unique_ptr<HostTensor> makeTensor(const DType &dt, std::vector<int64_t> shape);

// Owns a request; frees it on scope exit (hora_request_free also copes with in-flight ones).
struct RequestDeleter {
  void operator()(hora_request *r) const { hora_request_free(r); }
};
using Request = std::unique_ptr<hora_request, RequestDeleter>;

// Identity as the runtime reports it (tests never ask MPI).
int rank();
int size();

// Values for allreduce: small integers chosen per op so that every result is exact in every
// dtype at up to 4 ranks (PRODUCT stays in [-16, 81]; AVERAGE inputs cancel across ranks so the
// sum is size * base). salt varies the data between tensors and steps.
double inputValue(hora_reduce_op_t op, const DType &dt, int r, int n, int64_t j, int64_t salt);
// postscale * reduce_r(prescale * x_r), AVERAGE = SUM / n, rounded once to the dtype.
double expectedValue(hora_reduce_op_t op, const DType &dt, int n, int64_t j, int64_t salt,
                     double prescale, double postscale);
// AVERAGE may divide by multiplying with 1/n, which is one ulp off for n = 3; everything else
// must be bit-exact.
double tolerance(hora_reduce_op_t op, const DType &dt, double expected);

// Compares every element against expected(i) within tol(i); reports the first few mismatches.
::testing::AssertionResult matches(const HostTensor &t,
                                   const std::function<double(int64_t)> &expected,
                                   const std::function<double(int64_t)> &tol = nullptr);
::testing::AssertionResult matches(const DLTensor &t,
                                   const std::function<double(int64_t)> &expected);

// Fills `in` with inputValue for this rank.
void fillInput(HostTensor &in, hora_reduce_op_t op, int64_t salt);
// Checks `out` against expectedValue.
::testing::AssertionResult matchesReduction(const HostTensor &out, hora_reduce_op_t op,
                                            int64_t salt, double prescale, double postscale);

std::string statusName(hora_status_t s);

// The last error of this thread, never NULL in the message even if the runtime returns NULL.
std::string lastError();

// Polls `req` until it is done or `seconds` pass (a quiet machine's limit, stretched by
// HORA_TEST_TIME_SCALE), pausing `pause` between polls (zero: yield). For a test that suspects a
// hang, so that it fails with its own message instead of tripping the watchdog. A poll that
// returns an error fails the test (naming it) and ends the wait as done: hora_wait reports why.
bool completesWithin(hora_request_t req, double seconds,
                     std::chrono::microseconds pause = std::chrono::milliseconds(5));

// gtest predicate-formatter behind MP_EXPECT_STATUS.
::testing::AssertionResult statusIs(const char *expectedExpr, const char *actualExpr,
                                    hora_status_t expected, hora_status_t actual);

}  // namespace mp

// Status checks whose failure message carries the status names and hora_last_error(), which is
// thread-local, so the formatter reads it right after the call, on the same thread. They accept
// `<< context` like any gtest assertion.
#define MP_EXPECT_STATUS(expected, expr) EXPECT_PRED_FORMAT2(::mp::statusIs, expected, expr)
#define MP_ASSERT_STATUS(expected, expr) ASSERT_PRED_FORMAT2(::mp::statusIs, expected, expr)
#define MP_EXPECT_OK(expr) MP_EXPECT_STATUS(HORA_SUCCESS, expr)
#define MP_ASSERT_OK(expr) MP_ASSERT_STATUS(HORA_SUCCESS, expr)
