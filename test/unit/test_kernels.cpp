// SPDX-License-Identifier: Apache-2.0
// Element kernels against scalar references: every dtype x op, vector tails, unaligned pointers.
#include <gtest/gtest.h>

#include "base/error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "base/dtype.h"
#include "core/kernels.h"

namespace hora {
namespace {

// 0 and 1 for the edges, 7 for a tail alone, 1000003 (prime) for many full vectors and blocks plus
// a ragged tail.
const int64_t kLengths[] = {0, 1, 7, 1000003};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                         ReduceOp::kProduct};
const DType kAllDTypes[] = {DType::kUInt8,   DType::kInt8,     DType::kInt32,   DType::kInt64,
                            DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64};

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- per-dtype traits ---------------------------------------------------------------------------
// Storage type S, how to draw test values, the scalar reference for each op, and what counts as a
// match. 16-bit floats go through the scalar converters of base/dtype.h, which test_dtype checks
// against an independent reference; the kernels use their own vectorisable conversions.

enum class Kind { kInt, kFloat, kHalf, kBf16 };

template <typename Storage, Kind K>
struct TraitsOf {
  using S = Storage;
  static constexpr Kind kind = K;
};
template <DType D>
struct Traits;
template <>
struct Traits<DType::kUInt8> : TraitsOf<uint8_t, Kind::kInt> {};
template <>
struct Traits<DType::kInt8> : TraitsOf<int8_t, Kind::kInt> {};
template <>
struct Traits<DType::kInt32> : TraitsOf<int32_t, Kind::kInt> {};
template <>
struct Traits<DType::kInt64> : TraitsOf<int64_t, Kind::kInt> {};
template <>
struct Traits<DType::kFloat16> : TraitsOf<uint16_t, Kind::kHalf> {};
template <>
struct Traits<DType::kBFloat16> : TraitsOf<uint16_t, Kind::kBf16> {};
template <>
struct Traits<DType::kFloat32> : TraitsOf<float, Kind::kFloat> {};
template <>
struct Traits<DType::kFloat64> : TraitsOf<double, Kind::kFloat> {};

template <DType D>
float widen(uint16_t v) {
  return Traits<D>::kind == Kind::kHalf ? halfToFloat(v) : bfloat16ToFloat(v);
}

template <DType D>
uint16_t narrow(float v) {
  return Traits<D>::kind == Kind::kHalf ? floatToHalf(v) : floatToBfloat16(v);
}

template <typename F>
F refFloatOp(ReduceOp op, F a, F b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return a + b;
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<F>::quiet_NaN();
      return op == ReduceOp::kMin ? std::min(a, b) : std::max(a, b);
  }
  return a;
}

// Integers: modular arithmetic done in uint64_t and truncated, which is the wrap-around the kernels
// promise whatever the width.
template <typename S>
S refIntOp(ReduceOp op, S a, S b) {
  const auto ua = static_cast<uint64_t>(static_cast<int64_t>(a));
  const auto ub = static_cast<uint64_t>(static_cast<int64_t>(b));
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return static_cast<S>(ua + ub);
    case ReduceOp::kProduct: return static_cast<S>(ua * ub);
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
  }
  return a;
}

template <DType D>
typename Traits<D>::S refOp(ReduceOp op, typename Traits<D>::S a, typename Traits<D>::S b) {
  constexpr Kind kind = Traits<D>::kind;
  if constexpr (kind == Kind::kInt) {
    return refIntOp(op, a, b);
  } else if constexpr (kind == Kind::kFloat) {
    return refFloatOp(op, a, b);
  } else {
    return narrow<D>(refFloatOp(op, widen<D>(a), widen<D>(b)));
  }
}

template <DType D>
bool isNanValue(typename Traits<D>::S v) {
  constexpr Kind kind = Traits<D>::kind;
  if constexpr (kind == Kind::kInt) {
    return false;
  } else if constexpr (kind == Kind::kFloat) {
    return std::isnan(v);
  } else {
    return std::isnan(widen<D>(v));
  }
}

// NaN matches any NaN (payloads are the hardware's business). Min and max may return either zero
// for min(-0, +0); everything else must match bit for bit.
template <DType D>
bool matches(ReduceOp op, typename Traits<D>::S want, typename Traits<D>::S got) {
  constexpr Kind kind = Traits<D>::kind;
  if constexpr (kind == Kind::kInt) {
    return want == got;
  } else {
    if (isNanValue<D>(want) || isNanValue<D>(got)) return isNanValue<D>(want) && isNanValue<D>(got);
    if (op == ReduceOp::kMin || op == ReduceOp::kMax) {
      if constexpr (kind == Kind::kFloat) {
        return want == got;
      } else {
        return widen<D>(want) == widen<D>(got);
      }
    }
    return std::memcmp(&want, &got, sizeof want) == 0;
  }
}

template <DType D>
std::string show(typename Traits<D>::S v) {
  if constexpr (Traits<D>::kind == Kind::kInt) {
    return std::to_string(static_cast<int64_t>(v));
  } else if constexpr (Traits<D>::kind == Kind::kFloat) {
    return std::to_string(v);
  } else {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%04x", static_cast<unsigned>(v));
    return std::string(hex) + " (" + std::to_string(widen<D>(v)) + ")";
  }
}

// Values cover the interesting classes: full-range integers (so sums and products wrap), and for
// floats a mix of ordinary numbers, both zeros, subnormals, infinities and NaNs.
template <DType D>
typename Traits<D>::S randomValue(std::mt19937_64 &rng) {
  using S = typename Traits<D>::S;
  constexpr Kind kind = Traits<D>::kind;
  if constexpr (kind == Kind::kInt) {
    return static_cast<S>(rng());
  } else if constexpr (kind == Kind::kHalf || kind == Kind::kBf16) {
    // Any bit pattern is a meaningful value: every class shows up by itself.
    return static_cast<S>(rng());
  } else {
    const uint64_t r = rng();
    switch (r % 64) {
      case 0: return std::numeric_limits<S>::quiet_NaN();
      case 1: return -std::numeric_limits<S>::infinity();
      case 2: return std::numeric_limits<S>::infinity();
      case 3: return S(0);
      case 4: return -S(0);
      case 5: return std::numeric_limits<S>::denorm_min() * static_cast<S>(r >> 40);
      case 6: return std::numeric_limits<S>::max() / static_cast<S>(1 + (r >> 60));
      default: {
        std::uniform_real_distribution<S> dist(S(-4), S(4));
        return dist(rng);
      }
    }
  }
}

// A buffer with one guard element either side of the span under test, so that a kernel writing past
// either end is caught; `offset` shifts the span by one element off the allocation's alignment.
template <typename S>
struct Guarded {
  static constexpr unsigned char kGuardByte = 0xa5;

  Guarded(int64_t n, int offset) : n_(n), offset_(offset) {
    storage_.resize(static_cast<size_t>(((n + 3) * sizeof(S) + 7) / 8));
    std::memset(storage_.data(), kGuardByte, storage_.size() * 8);
  }
  S *data() { return reinterpret_cast<S *>(storage_.data()) + 1 + offset_; }
  bool guardsIntact() const {
    const auto *bytes = reinterpret_cast<const unsigned char *>(storage_.data());
    const size_t before = (1 + offset_) * sizeof(S);
    const size_t after = before + n_ * sizeof(S);
    for (size_t i = 0; i < before; ++i)
      if (bytes[i] != kGuardByte) return false;
    for (size_t i = after; i < after + sizeof(S); ++i)
      if (bytes[i] != kGuardByte) return false;
    return true;
  }

  int64_t n_;
  size_t offset_;
  std::vector<uint64_t> storage_;  // 8-byte aligned for every dtype
};

// ---- reduceInto: every dtype x every op ---------------------------------------------------------

template <DType D>
void checkReduce(ReduceOp op) {
  using S = typename Traits<D>::S;
  std::mt19937_64 rng(1000 + 10 * static_cast<int>(D) + static_cast<int>(op));
  for (const int64_t n : kLengths) {
    for (const int offset : {0, 1}) {
      Guarded<S> dst(n, offset);
      Guarded<S> src(n, 1 - offset);  // the two pointers misaligned relative to each other too
      std::vector<S> want(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        dst.data()[i] = randomValue<D>(rng);
        src.data()[i] = randomValue<D>(rng);
        want[i] = refOp<D>(op, dst.data()[i], src.data()[i]);
      }
      reduceInto(dst.data(), src.data(), n, D, op);
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (!matches<D>(op, want[i], dst.data()[i]) && bad++ < 5) {
          ADD_FAILURE() << dtypeName(D) << " " << reduceOpName(op) << " n=" << n
                        << " offset=" << offset << " i=" << i << ": want " << show<D>(want[i])
                        << ", got " << show<D>(dst.data()[i]);
        }
      }
      EXPECT_EQ(bad, 0) << dtypeName(D) << " " << reduceOpName(op) << " n=" << n;
      EXPECT_TRUE(dst.guardsIntact()) << dtypeName(D) << " " << reduceOpName(op) << " n=" << n;
      EXPECT_TRUE(src.guardsIntact()) << dtypeName(D) << " " << reduceOpName(op) << " n=" << n;
    }
  }
}

template <template <DType> class Fn, typename... Args>
void dispatch(DType t, Args... args) {
  switch (t) {
    case DType::kUInt8: return Fn<DType::kUInt8>::run(args...);
    case DType::kInt8: return Fn<DType::kInt8>::run(args...);
    case DType::kInt32: return Fn<DType::kInt32>::run(args...);
    case DType::kInt64: return Fn<DType::kInt64>::run(args...);
    case DType::kFloat16: return Fn<DType::kFloat16>::run(args...);
    case DType::kBFloat16: return Fn<DType::kBFloat16>::run(args...);
    case DType::kFloat32: return Fn<DType::kFloat32>::run(args...);
    case DType::kFloat64: return Fn<DType::kFloat64>::run(args...);
  }
  FAIL() << "bad dtype";
}

template <DType D>
struct CheckReduce {
  static void run(ReduceOp op) { checkReduce<D>(op); }
};

class ReduceIntoTest : public ::testing::TestWithParam<std::tuple<DType, ReduceOp>> {};

TEST_P(ReduceIntoTest, MatchesScalarReference) {
  dispatch<CheckReduce>(std::get<0>(GetParam()), std::get<1>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAllOps, ReduceIntoTest,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes),
                                            ::testing::ValuesIn(kOps)),
                         [](const ::testing::TestParamInfo<ReduceIntoTest::ParamType> &p) {
                           return std::string(dtypeName(std::get<0>(p.param))) + "_" +
                                  reduceOpName(std::get<1>(p.param));
                         });

// ---- hand-picked reduce cases -------------------------------------------------------------------

TEST(ReduceInto, IntegersWrap) {
  int8_t a8[] = {127, -128, 100, -1};
  const int8_t b8[] = {1, -1, 100, -1};
  reduceInto(a8, b8, 4, DType::kInt8, ReduceOp::kSum);
  EXPECT_EQ(a8[0], -128);
  EXPECT_EQ(a8[1], 127);
  EXPECT_EQ(a8[2], -56);
  EXPECT_EQ(a8[3], -2);

  uint8_t u8[] = {200, 16};
  const uint8_t v8[] = {100, 16};
  reduceInto(u8, v8, 2, DType::kUInt8, ReduceOp::kProduct);
  EXPECT_EQ(u8[0], static_cast<uint8_t>(20000 % 256));
  EXPECT_EQ(u8[1], 0);

  int32_t a32[] = {std::numeric_limits<int32_t>::max(), 65536, -3};
  const int32_t b32[] = {1, 65536, 5};
  reduceInto(a32, b32, 3, DType::kInt32, ReduceOp::kProduct);
  EXPECT_EQ(a32[0], std::numeric_limits<int32_t>::max());
  EXPECT_EQ(a32[1], 0);
  EXPECT_EQ(a32[2], -15);
  reduceInto(a32, b32, 1, DType::kInt32, ReduceOp::kSum);
  EXPECT_EQ(a32[0], std::numeric_limits<int32_t>::min());

  int64_t a64[] = {std::numeric_limits<int64_t>::min(), 3, -7};
  const int64_t b64[] = {-1, std::numeric_limits<int64_t>::max(), 9};
  reduceInto(a64, b64, 3, DType::kInt64, ReduceOp::kSum);
  EXPECT_EQ(a64[0], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(a64[1], std::numeric_limits<int64_t>::min() + 2);
  EXPECT_EQ(a64[2], 2);
}

TEST(ReduceInto, AverageReducesAsSum) {
  float a[] = {1.5f, -2.0f, 3.0f};
  const float b[] = {2.5f, 4.0f, 0.25f};
  reduceInto(a, b, 3, DType::kFloat32, ReduceOp::kAverage);
  EXPECT_EQ(a[0], 4.0f);
  EXPECT_EQ(a[1], 2.0f);
  EXPECT_EQ(a[2], 3.25f);
}

TEST(ReduceInto, HalfSumRoundsOnceInFloat32) {
  // Each element is one exact float32 sum rounded once to float16, ties to even.
  uint16_t a[] = {floatToHalf(2048.0f), floatToHalf(2049.0f - 1.0f), floatToHalf(1.0f)};
  const uint16_t b[] = {floatToHalf(1.0f), floatToHalf(3.0f), floatToHalf(std::ldexp(1.0f, -11))};
  reduceInto(a, b, 3, DType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(halfToFloat(a[0]), 2048.0f);  // 2049 is a tie between 2048 (even) and 2050
  EXPECT_EQ(halfToFloat(a[1]), 2052.0f);  // 2051 is a tie between 2050 (odd) and 2052 (even)
  EXPECT_EQ(halfToFloat(a[2]), 1.0f);     // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even is 1
}

// NaN anywhere in either operand must survive min/max, whichever lane or tail position it is in.
template <DType D>
struct CheckNanMinMax {
  static void run() {
    if constexpr (Traits<D>::kind == Kind::kInt) {
      FAIL() << "floating dtypes only";
    } else {
      using S = typename Traits<D>::S;
      S nan, one, two;
      if constexpr (Traits<D>::kind == Kind::kFloat) {
        nan = std::numeric_limits<S>::quiet_NaN();
        one = S(1);
        two = S(2);
      } else {
        nan = narrow<D>(std::numeric_limits<float>::quiet_NaN());
        one = narrow<D>(1.0f);
        two = narrow<D>(2.0f);
      }
      const int64_t n = 67;  // one full 64-element block and a tail of 3
      for (const ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
        for (const int64_t pos : {0, 1, 3, 7, 15, 16, 31, 63, 64, 65, 66}) {
          for (int which = 0; which < 3; ++which) {  // NaN in dst, in src, in both
            std::vector<S> dst(n + 1, one), src(n + 1, two);
            S *d = dst.data() + 1;  // unaligned
            S *s = src.data() + 1;
            if (which != 1) d[pos] = nan;
            if (which != 0) s[pos] = nan;
            reduceInto(d, s, n, D, op);
            for (int64_t i = 0; i < n; ++i) {
              if (i == pos) {
                EXPECT_TRUE(isNanValue<D>(d[i])) << dtypeName(D) << " " << reduceOpName(op)
                                                 << " pos=" << pos << " which=" << which;
              } else {
                EXPECT_TRUE(matches<D>(op, op == ReduceOp::kMin ? one : two, d[i]))
                    << dtypeName(D) << " " << reduceOpName(op) << " i=" << i;
              }
            }
          }
        }
      }
    }
  }
};

TEST(ReduceInto, MinMaxPropagateNaN) {
  for (const DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    dispatch<CheckNanMinMax>(t);
  }
}

TEST(ReduceInto, InfinitiesInMinMax) {
  const float inf = std::numeric_limits<float>::infinity();
  float a[] = {inf, -inf, 0.0f, -inf};
  const float b[] = {1.0f, 1.0f, -inf, inf};
  float c[4];
  std::memcpy(c, a, sizeof a);
  reduceInto(a, b, 4, DType::kFloat32, ReduceOp::kMin);
  reduceInto(c, b, 4, DType::kFloat32, ReduceOp::kMax);
  EXPECT_EQ(a[0], 1.0f);
  EXPECT_EQ(a[1], -inf);
  EXPECT_EQ(a[2], -inf);
  EXPECT_EQ(a[3], -inf);
  EXPECT_EQ(c[0], inf);
  EXPECT_EQ(c[1], 1.0f);
  EXPECT_EQ(c[2], 0.0f);
  EXPECT_EQ(c[3], inf);
}

// ---- scale, widen, narrow -----------------------------------------------------------------------

const double kFactors[] = {1.0, 0.5, 3.0};

template <DType D>
struct CheckScale {
  static void run() {
    if constexpr (Traits<D>::kind == Kind::kInt) {
      FAIL() << "floating dtypes only";
    } else {
      using S = typename Traits<D>::S;
      std::mt19937_64 rng(77 + static_cast<int>(D));
      for (const double factor : kFactors) {
        for (const int64_t n : kLengths) {
          for (const int offset : {0, 1}) {
            Guarded<S> buf(n, offset);
            std::vector<S> want(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) {
              const S v = randomValue<D>(rng);
              buf.data()[i] = v;
              if constexpr (Traits<D>::kind == Kind::kFloat) {
                want[i] = v * static_cast<S>(factor);  // float32 scales in float32
              } else {
                want[i] = narrow<D>(widen<D>(v) * static_cast<float>(factor));
              }
            }
            scaleInPlace(buf.data(), n, D, factor);
            int64_t bad = 0;
            for (int64_t i = 0; i < n; ++i) {
              if (!matches<D>(ReduceOp::kProduct, want[i], buf.data()[i]) && bad++ < 5) {
                ADD_FAILURE() << dtypeName(D) << " x" << factor << " n=" << n << " i=" << i
                              << ": want " << show<D>(want[i]) << ", got "
                              << show<D>(buf.data()[i]);
              }
            }
            EXPECT_EQ(bad, 0);
            EXPECT_TRUE(buf.guardsIntact()) << dtypeName(D) << " n=" << n;
          }
        }
      }
    }
  }
};

template <DType D>
struct CheckWidenNarrow {
  static void run() {
    if constexpr (Traits<D>::kind == Kind::kInt) {
      FAIL() << "floating dtypes only";
    } else {
      std::mt19937_64 rng(99 + static_cast<int>(D));
      for (const double factor : kFactors) {
        const auto f = static_cast<float>(factor);
        for (const int64_t n : kLengths) {
          for (const int offset : {0, 1}) {
            Guarded<uint16_t> half(n, offset);
            Guarded<float> wide(n, 1 - offset);
            for (int64_t i = 0; i < n; ++i) half.data()[i] = static_cast<uint16_t>(rng());
            widenToFloat(half.data(), wide.data(), n, D, factor);
            int64_t bad = 0;
            for (int64_t i = 0; i < n; ++i) {
              const float want = widen<D>(half.data()[i]) * f;
              const float got = wide.data()[i];
              const bool ok = std::isnan(want) ? std::isnan(got) : bitsOf(want) == bitsOf(got);
              if (!ok && bad++ < 5) {
                ADD_FAILURE() << "widen " << dtypeName(D) << " x" << factor << " i=" << i
                              << ": want " << want << ", got " << got;
              }
            }
            EXPECT_EQ(bad, 0);
            EXPECT_TRUE(wide.guardsIntact());

            // Narrow random float bit patterns: every class, and ties wherever they happen to fall.
            for (int64_t i = 0; i < n; ++i) wide.data()[i] = floatOf(static_cast<uint32_t>(rng()));
            narrowFromFloat(wide.data(), half.data(), n, D, factor);
            bad = 0;
            for (int64_t i = 0; i < n; ++i) {
              const uint16_t want = narrow<D>(wide.data()[i] * f);
              const uint16_t got = half.data()[i];
              if (!matches<D>(ReduceOp::kSum, want, got) && bad++ < 5) {
                ADD_FAILURE() << "narrow " << dtypeName(D) << " x" << factor << " i=" << i
                              << " from bits " << bitsOf(wide.data()[i]) << ": want "
                              << show<D>(want) << ", got " << show<D>(got);
              }
            }
            EXPECT_EQ(bad, 0);
            EXPECT_TRUE(half.guardsIntact());
          }
        }
      }
    }
  }
};

TEST(Scale, FloatingDTypes) {
  for (const DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    dispatch<CheckScale>(t);
  }
}

// A factor that is not a float32 value is rounded to float32 first for float32 data (and for the
// 16-bit formats), and used as is for float64.
TEST(Scale, FactorPrecisionFollowsTheDType) {
  std::vector<float> f(1000);
  std::vector<double> d(1000);
  for (size_t i = 0; i < f.size(); ++i) {
    f[i] = 1.0f + static_cast<float>(i) / 7.0f;
    d[i] = 1.0 + static_cast<double>(i) / 7.0;
  }
  const std::vector<float> f0 = f;
  const std::vector<double> d0 = d;
  scaleInPlace(f.data(), static_cast<int64_t>(f.size()), DType::kFloat32, 0.1);
  scaleInPlace(d.data(), static_cast<int64_t>(d.size()), DType::kFloat64, 0.1);
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_EQ(bitsOf(f[i]), bitsOf(f0[i] * 0.1f)) << i;
    EXPECT_EQ(d[i], d0[i] * 0.1) << i;
  }
}

TEST(Scale, IntegerDTypes) {
  int32_t v[] = {1, 2, 3};
  // The default factor of 1 is a no-op whatever the dtype; a real scale of integers is refused.
  EXPECT_NO_THROW(scaleInPlace(v, 3, DType::kInt32, 1.0));
  EXPECT_EQ(v[2], 3);
  for (const DType t : {DType::kUInt8, DType::kInt8, DType::kInt32, DType::kInt64}) {
    EXPECT_THROW(scaleInPlace(v, 1, t, 0.5), hora::Error) << dtypeName(t);
  }
  EXPECT_EQ(v[0], 1);
}

TEST(WidenNarrow, Float16AndBFloat16) {
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) dispatch<CheckWidenNarrow>(t);
}

TEST(WidenNarrow, OnlySixteenBitFloats) {
  float wide[2] = {};
  uint16_t half[2] = {};
  for (const DType t : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kUInt8}) {
    for (const double factor : kFactors) {
      EXPECT_THROW(widenToFloat(half, wide, 2, t, factor), hora::Error) << dtypeName(t);
      EXPECT_THROW(narrowFromFloat(wide, half, 2, t, factor), hora::Error)
          << dtypeName(t);
    }
  }
}

// The kernels' branch-free conversions against the scalar ones, on every 16-bit pattern.
TEST(WidenNarrow, EveryPatternWidensLikeScalar) {
  std::vector<uint16_t> all(0x10000);
  for (uint32_t v = 0; v < 0x10000u; ++v) all[v] = static_cast<uint16_t>(v);
  std::vector<float> wide(all.size());
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
    widenToFloat(all.data(), wide.data(), static_cast<int64_t>(all.size()), t, 1.0);
    for (uint32_t v = 0; v < 0x10000u; ++v) {
      const auto p = static_cast<uint16_t>(v);
      const float want = t == DType::kFloat16 ? halfToFloat(p) : bfloat16ToFloat(p);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(wide[v])) << dtypeName(t) << " " << v;
      } else {
        ASSERT_EQ(bitsOf(wide[v]), bitsOf(want)) << dtypeName(t) << " " << v;
      }
    }
  }
}

// Narrowing checked on every float whose low 13 bits are one of the patterns around a rounding
// decision (0, 1, just below and at the float16 tie, just above it, all ones): with the upper 19
// bits enumerated, that puts a tie and both its neighbours at every rounding position, including
// the deeper ones of float16 subnormals and the 16-bit one of bfloat16.
TEST(WidenNarrow, StructuredFloatsNarrowLikeScalar) {
  const uint32_t lows[] = {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu};
  std::vector<float> src;
  src.reserve((1u << 19) * 6);
  for (uint32_t hi = 0; hi < (1u << 19); ++hi)
    for (const uint32_t lo : lows) src.push_back(floatOf((hi << 13) | lo));
  std::vector<uint16_t> out(src.size());
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
    narrowFromFloat(src.data(), out.data(), static_cast<int64_t>(src.size()), t, 1.0);
    for (size_t i = 0; i < src.size(); ++i) {
      const float x = src[i];
      if (std::isnan(x)) {
        const bool nanOut = t == DType::kFloat16 ? std::isnan(halfToFloat(out[i]))
                                                 : std::isnan(bfloat16ToFloat(out[i]));
        ASSERT_TRUE(nanOut) << dtypeName(t) << " bits " << bitsOf(x);
      } else {
        const uint16_t want = t == DType::kFloat16 ? floatToHalf(x) : floatToBfloat16(x);
        ASSERT_EQ(out[i], want) << dtypeName(t) << " bits " << bitsOf(x);
      }
    }
  }
}

// ---- errors and names ---------------------------------------------------------------------------

TEST(Kernels, ReduceOpNames) {
  EXPECT_STREQ(reduceOpName(ReduceOp::kSum), "sum");
  EXPECT_STREQ(reduceOpName(ReduceOp::kAverage), "average");
  EXPECT_STREQ(reduceOpName(ReduceOp::kMin), "min");
  EXPECT_STREQ(reduceOpName(ReduceOp::kMax), "max");
  EXPECT_STREQ(reduceOpName(ReduceOp::kProduct), "product");
  EXPECT_STREQ(reduceOpName(static_cast<ReduceOp>(kNumReduceOps)), "invalid");
}

// The message must say which function refused which dtype.
template <typename Fn>
void expectInvalid(Fn fn, const std::string &function, const std::string &detail) {
  try {
    fn();
    ADD_FAILURE() << function << ": no exception";
  } catch (const hora::Error &e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(function), std::string::npos) << what;
    EXPECT_NE(what.find(detail), std::string::npos) << what;
  }
}

TEST(Kernels, InvalidArgumentsThrow) {
  float a[4] = {}, b[4] = {};
  const auto bad = static_cast<DType>(8);
  expectInvalid([&] { reduceInto(a, b, 4, bad, ReduceOp::kSum); }, "reduceInto", "8");
  expectInvalid([&] { reduceInto(a, b, 4, static_cast<DType>(255), ReduceOp::kMax); }, "reduceInto",
                "255");
  expectInvalid([&] { reduceInto(a, b, 4, DType::kFloat32, static_cast<ReduceOp>(9)); },
                "reduceInto", "9");
  expectInvalid([&] { reduceInto(a, b, -1, DType::kFloat32, ReduceOp::kSum); }, "reduceInto", "-1");
  expectInvalid([&] { scaleInPlace(a, 4, bad, 2.0); }, "scaleInPlace", "8");
  expectInvalid([&] { scaleInPlace(a, 4, bad, 1.0); }, "scaleInPlace", "8");
  expectInvalid([&] { scaleInPlace(a, 4, DType::kInt64, 2.0); }, "scaleInPlace", "int64");
  expectInvalid([&] { widenToFloat(a, b, 4, DType::kFloat32, 1.0); }, "widenToFloat", "float32");
  expectInvalid([&] { narrowFromFloat(a, b, 4, bad, 1.0); }, "narrowFromFloat", "8");
}

TEST(Kernels, ZeroCountTouchesNothing) {
  for (const DType t : kAllDTypes) {
    for (const ReduceOp op : kOps) EXPECT_NO_THROW(reduceInto(nullptr, nullptr, 0, t, op));
  }
  EXPECT_NO_THROW(scaleInPlace(nullptr, 0, DType::kFloat16, 2.0));
  EXPECT_NO_THROW(widenToFloat(nullptr, nullptr, 0, DType::kBFloat16, 2.0));
  EXPECT_NO_THROW(narrowFromFloat(nullptr, nullptr, 0, DType::kFloat16, 2.0));
}

}  // namespace
}  // namespace hora
