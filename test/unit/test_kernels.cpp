// SPDX-License-Identifier: Apache-2.0
// Element kernels against scalar references: every dtype x op, vector tails, unaligned pointers, on
// every instruction set the kernels have (scalar, AVX2, AVX-512: the ones this CPU lacks are
// skipped), and each vector one against the scalar one bit for bit.
#include <gtest/gtest.h>

#include "base/error.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "base/dtype.h"
#include "core/kernels.h"

// The references below round every product before the add, as the kernels do: no FMA contraction
// even where the build targets a CPU with FMA (-march=native).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace hora {
namespace {

// 0 and 1 for the edges, 7 for a tail alone, 1000003 (prime) for many full vectors and blocks plus
// a ragged tail.
const int64_t kLengths[] = {0, 1, 7, 1000003};
// The same for the kernels that the bitwise comparison with the scalar ones covers at length too.
const int64_t kShortLengths[] = {0, 1, 7, 100003};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                         ReduceOp::kProduct};
const DType kAllDTypes[] = {DType::kUInt8,    DType::kInt8,    DType::kInt16,
                            DType::kInt32,    DType::kInt64,   DType::kFloat16,
                            DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                            DType::kBool};

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

enum class Kind { kInt, kFloat, kHalf, kBf16, kBool };

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
struct Traits<DType::kInt16> : TraitsOf<int16_t, Kind::kInt> {};
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
template <>
struct Traits<DType::kBool> : TraitsOf<uint8_t, Kind::kBool> {};

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

// bool: a byte is true when it is not zero; sum and max are "any", min and product "all"; the
// result is the byte 1 or 0.
uint8_t refBoolOp(ReduceOp op, uint8_t a, uint8_t b) {
  const bool x = a != 0, y = b != 0;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
    case ReduceOp::kMax: return (x || y) ? 1 : 0;
    case ReduceOp::kMin:
    case ReduceOp::kProduct: return (x && y) ? 1 : 0;
  }
  return 0xee;
}

template <DType D>
typename Traits<D>::S refOp(ReduceOp op, typename Traits<D>::S a, typename Traits<D>::S b) {
  constexpr Kind kind = Traits<D>::kind;
  if constexpr (kind == Kind::kBool) {
    return refBoolOp(op, a, b);
  } else if constexpr (kind == Kind::kInt) {
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
  if constexpr (kind == Kind::kInt || kind == Kind::kBool) {
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
  if constexpr (kind == Kind::kInt || kind == Kind::kBool) {
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
  if constexpr (Traits<D>::kind == Kind::kInt || Traits<D>::kind == Kind::kBool) {
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
  } else if constexpr (kind == Kind::kBool) {
    // Half false; the true ones mostly 1, the rest any other nonzero byte (what a caller's
    // uint8 view of its flags may hold), which must read as true and come out as 1.
    const uint64_t r = rng();
    if (r % 4 < 2) return 0;
    if (r % 4 == 2) return 1;
    return static_cast<S>(2 + (r >> 8) % 254);
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
// either end is caught; `offset` shifts the span by that many elements off the allocation's
// (64-byte) alignment.
template <typename S>
struct Guarded {
  static constexpr unsigned char kGuardByte = 0xa5;

  Guarded(int64_t n, int offset) : n_(n), offset_(offset) {
    // 8 spare words: the span starts at a 64-byte boundary plus `offset` elements.
    storage_.resize(static_cast<size_t>(((n + 2 + offset) * sizeof(S) + 7) / 8) + 8);
    std::memset(storage_.data(), kGuardByte, storage_.size() * 8);
    const auto address = reinterpret_cast<uintptr_t>(storage_.data());
    start_ = static_cast<size_t>((64 - (address + sizeof(S)) % 64) % 64);
  }
  S *data() {
    return reinterpret_cast<S *>(reinterpret_cast<unsigned char *>(storage_.data()) + start_) + 1 +
           offset_;
  }
  bool guardsIntact() const {
    const auto *bytes = reinterpret_cast<const unsigned char *>(storage_.data()) + start_;
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
  size_t start_ = 0;               // bytes, a multiple of sizeof(S) where sizeof(S) divides 64
  std::vector<uint64_t> storage_;  // 8-byte aligned for every dtype
};

// NaN test on raw bytes of a floating element of `size` bytes (2: the 16-bit dtype t).
bool isNanBits(DType t, size_t size, const unsigned char *p) {
  if (!isFloating(t)) return false;
  if (size == 2) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return std::isnan(t == DType::kFloat16 ? halfToFloat(h) : bfloat16ToFloat(h));
  }
  if (size == 4) {
    float f;
    std::memcpy(&f, p, 4);
    return std::isnan(f);
  }
  double d;
  std::memcpy(&d, p, 8);
  return std::isnan(d);
}

// The NaN in p (`size` bytes, a 16-bit one being of dtype t) as a quiet NaN of `outSize` bytes:
// what an arithmetic op returns when it passes that operand through.
std::vector<unsigned char> quietNan(DType t, size_t size, const unsigned char *p, size_t outSize) {
  std::vector<unsigned char> out(outSize);
  if (size == outSize) {
    std::memcpy(out.data(), p, size);
    if (size == 2) {
      uint16_t h;
      std::memcpy(&h, p, 2);
      h = static_cast<uint16_t>(h | (t == DType::kFloat16 ? 0x0200u : 0x0040u));
      std::memcpy(out.data(), &h, 2);
    } else {
      out[size - 2] = static_cast<unsigned char>(out[size - 2] | (size == 4 ? 0x40 : 0x08));
    }
    return out;
  }
  uint16_t h;  // a 16-bit NaN into a float32
  std::memcpy(&h, p, 2);
  const float f = t == DType::kFloat16 ? halfToFloat(h) : bfloat16ToFloat(h);
  const uint32_t bits = bitsOf(f) | 0x00400000u;
  std::memcpy(out.data(), &bits, 4);
  return out;
}

std::string hexBytes(const unsigned char *p, size_t size) {
  std::string out = "0x";
  char byte[3];
  for (size_t i = size; i-- > 0;) {  // little-endian: most significant first
    std::snprintf(byte, sizeof byte, "%02x", static_cast<unsigned>(p[i]));
    out += byte;
  }
  return out;
}

// ---- instruction sets ---------------------------------------------------------------------------
// Every kernel test runs once per instruction set; one the CPU (or the build) lacks is skipped.

using kernels_detail::Isa;
const Isa kIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

Isa isaOf(Isa isa) { return isa; }
template <typename... Rest>
Isa isaOf(const std::tuple<Isa, Rest...> &param) {
  return std::get<0>(param);
}

template <typename Param>
class IsaTestBase : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const Isa isa = isaOf(this->GetParam());
    if (!kernels_detail::isaSupported(isa))
      GTEST_SKIP() << kernels_detail::isaName(isa) << " is not available here";
    kernels_detail::setIsaForTesting(isa);
  }
  void TearDown() override { kernels_detail::setIsaForTesting(kernels_detail::bestIsa()); }
};

class KernelIsaTest : public IsaTestBase<Isa> {};

std::string isaParamName(const ::testing::TestParamInfo<Isa> &p) {
  return kernels_detail::isaName(p.param);
}

// Runs fn with the scalar kernels, then goes back to the instruction set under test.
template <typename Fn>
void withScalarIsa(Fn fn) {
  const Isa was = kernels_detail::activeIsa();
  kernels_detail::setIsaForTesting(Isa::kScalar);
  fn();
  kernels_detail::setIsaForTesting(was);
}

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
    case DType::kInt16: return Fn<DType::kInt16>::run(args...);
    case DType::kInt32: return Fn<DType::kInt32>::run(args...);
    case DType::kInt64: return Fn<DType::kInt64>::run(args...);
    case DType::kFloat16: return Fn<DType::kFloat16>::run(args...);
    case DType::kBFloat16: return Fn<DType::kBFloat16>::run(args...);
    case DType::kFloat32: return Fn<DType::kFloat32>::run(args...);
    case DType::kFloat64: return Fn<DType::kFloat64>::run(args...);
    case DType::kBool: return Fn<DType::kBool>::run(args...);
  }
  FAIL() << "bad dtype";
}

template <DType D>
struct CheckReduce {
  static void run(ReduceOp op) { checkReduce<D>(op); }
};

class ReduceIntoTest : public IsaTestBase<std::tuple<Isa, DType, ReduceOp>> {};

TEST_P(ReduceIntoTest, MatchesScalarReference) {
  dispatch<CheckReduce>(std::get<1>(GetParam()), std::get<2>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAllOps, ReduceIntoTest,
                         ::testing::Combine(::testing::ValuesIn(kIsas),
                                            ::testing::ValuesIn(kAllDTypes),
                                            ::testing::ValuesIn(kOps)),
                         [](const ::testing::TestParamInfo<ReduceIntoTest::ParamType> &p) {
                           return std::string(kernels_detail::isaName(std::get<0>(p.param))) + "_" +
                                  dtypeName(std::get<1>(p.param)) + "_" +
                                  reduceOpName(std::get<2>(p.param));
                         });

// ---- hand-picked reduce cases -------------------------------------------------------------------

TEST_P(KernelIsaTest, IntegersWrap) {
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

// int16: values past int8's range, and the wrap at its own.
TEST_P(KernelIsaTest, Int16ReducesAndWraps) {
  int16_t a[] = {300, -300, 32767, -32768, 200, -7, 1000, 12345};
  const int16_t b[] = {500, 200, 1, -1, 200, 3, -1000, -12345};
  int16_t sum[8], mn[8], mx[8], prod[8];
  std::copy(std::begin(a), std::end(a), sum);
  std::copy(std::begin(a), std::end(a), mn);
  std::copy(std::begin(a), std::end(a), mx);
  std::copy(std::begin(a), std::end(a), prod);
  reduceInto(sum, b, 8, DType::kInt16, ReduceOp::kSum);
  reduceInto(mn, b, 8, DType::kInt16, ReduceOp::kMin);
  reduceInto(mx, b, 8, DType::kInt16, ReduceOp::kMax);
  reduceInto(prod, b, 8, DType::kInt16, ReduceOp::kProduct);
  const int16_t wantSum[] = {800, -100, -32768, 32767, 400, -4, 0, 0};
  const int16_t wantMin[] = {300, -300, 1, -32768, 200, -7, -1000, -12345};
  const int16_t wantMax[] = {500, 200, 32767, -1, 200, 3, 1000, 12345};
  // 300 * 500 = 150000 = 2 * 65536 + 18928; -300 * 200 = -60000 = -65536 + 5536;
  // 32767 * 1; -32768 * -1 = 32768 wraps to -32768; 40000 - 65536 = -25536; -21;
  // -1000000 = -16 * 65536 + 48576 -> 48576 - 65536 = -16960;
  // -152399025 = -2326 * 65536 + 37711 -> 37711 - 65536 = -27825.
  const int16_t wantProd[] = {18928, 5536, 32767, -32768, -25536, -21, -16960, -27825};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(sum[i], wantSum[i]) << "sum " << i;
    EXPECT_EQ(mn[i], wantMin[i]) << "min " << i;
    EXPECT_EQ(mx[i], wantMax[i]) << "max " << i;
    EXPECT_EQ(prod[i], wantProd[i]) << "product " << i;
  }
}

// bool: every pair of bytes from a set with several true patterns; sum and max are OR, min and
// product AND, average (which the C API refuses) OR like sum; every result the byte 0 or 1.
TEST_P(KernelIsaTest, BoolTruthTables) {
  const uint8_t bytes[] = {0, 1, 2, 0x7f, 0x80, 0xff};
  constexpr int kN = 6;
  for (const ReduceOp op : kOps) {
    // Long enough for the vector loops' main body and a tail: each pair repeated 20 times.
    std::vector<uint8_t> dst, src;
    for (int rep = 0; rep < 20; ++rep) {
      for (int i = 0; i < kN; ++i) {
        for (int j = 0; j < kN; ++j) {
          dst.push_back(bytes[i]);
          src.push_back(bytes[j]);
        }
      }
    }
    const std::vector<uint8_t> was = dst;
    reduceInto(dst.data(), src.data(), static_cast<int64_t>(dst.size()), DType::kBool, op);
    const bool isOr = op == ReduceOp::kSum || op == ReduceOp::kMax || op == ReduceOp::kAverage;
    for (size_t k = 0; k < dst.size(); ++k) {
      const bool a = was[k] != 0, b = src[k] != 0;
      const uint8_t want = (isOr ? (a || b) : (a && b)) ? 1 : 0;
      ASSERT_EQ(dst[k], want) << reduceOpName(op) << "(" << int(was[k]) << ", " << int(src[k])
                              << ") at " << k;
    }
  }
}

// The scaled entry point with factor 1 is reduceInto for bool too (the engine's shared-memory
// path calls it).
TEST_P(KernelIsaTest, BoolReduceScaledByOne) {
  uint8_t d[] = {0, 0, 2, 5, 0x80, 1};
  const uint8_t s[] = {0, 3, 0, 9, 0x80, 0};
  reduceScaledInto(d, s, 6, DType::kBool, ReduceOp::kSum, 1.0);
  const uint8_t want[] = {0, 1, 1, 1, 1, 1};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(d[i], want[i]) << i;
  uint8_t e[] = {0, 0, 2, 5, 0x80, 1};
  reduceScaledInto(e, s, 6, DType::kBool, ReduceOp::kProduct, 1.0);
  const uint8_t wantAnd[] = {0, 0, 0, 1, 1, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(e[i], wantAnd[i]) << i;
}

TEST(Kernels, NormalizeBools) {
  std::vector<uint8_t> src(256), dst(256, 0xaa);
  for (int v = 0; v < 256; ++v) src[static_cast<size_t>(v)] = static_cast<uint8_t>(v);
  normalizeBools(dst.data(), src.data(), 256);
  for (int v = 0; v < 256; ++v) {
    ASSERT_EQ(dst[static_cast<size_t>(v)], v == 0 ? 0 : 1) << v;
    ASSERT_EQ(src[static_cast<size_t>(v)], v) << "source changed";
  }
  normalizeBools(src.data(), src.data(), 256);  // in place
  EXPECT_EQ(src, dst);
  EXPECT_NO_THROW(normalizeBools(nullptr, nullptr, 0));
}

TEST_P(KernelIsaTest, AverageReducesAsSum) {
  float a[] = {1.5f, -2.0f, 3.0f};
  const float b[] = {2.5f, 4.0f, 0.25f};
  reduceInto(a, b, 3, DType::kFloat32, ReduceOp::kAverage);
  EXPECT_EQ(a[0], 4.0f);
  EXPECT_EQ(a[1], 2.0f);
  EXPECT_EQ(a[2], 3.25f);
}

TEST_P(KernelIsaTest, HalfSumRoundsOnceInFloat32) {
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
    if constexpr (Traits<D>::kind == Kind::kInt || Traits<D>::kind == Kind::kBool) {
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

TEST_P(KernelIsaTest, MinMaxPropagateNaN) {
  for (const DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    dispatch<CheckNanMinMax>(t);
  }
}

TEST_P(KernelIsaTest, InfinitiesInMinMax) {
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
    if constexpr (Traits<D>::kind == Kind::kInt || Traits<D>::kind == Kind::kBool) {
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
    if constexpr (Traits<D>::kind == Kind::kInt || Traits<D>::kind == Kind::kBool) {
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

TEST_P(KernelIsaTest, ScaleFloatingDTypes) {
  for (const DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    dispatch<CheckScale>(t);
  }
}

// A factor that is not a float32 value is rounded to float32 first for float32 data (and for the
// 16-bit formats), and used as is for float64.
TEST_P(KernelIsaTest, ScaleFactorPrecisionFollowsTheDType) {
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
  for (const DType t : {DType::kUInt8, DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64,
                        DType::kBool}) {
    EXPECT_THROW(scaleInPlace(v, 1, t, 0.5), hora::Error) << dtypeName(t);
  }
  EXPECT_EQ(v[0], 1);
}

TEST_P(KernelIsaTest, WidenNarrowFloat16AndBFloat16) {
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) dispatch<CheckWidenNarrow>(t);
}

TEST(WidenNarrow, OnlySixteenBitFloats) {
  float wide[2] = {};
  uint16_t half[2] = {};
  for (const DType t : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kUInt8,
                        DType::kInt16, DType::kBool}) {
    for (const double factor : kFactors) {
      EXPECT_THROW(widenToFloat(half, wide, 2, t, factor), hora::Error) << dtypeName(t);
      EXPECT_THROW(narrowFromFloat(wide, half, 2, t, factor), hora::Error)
          << dtypeName(t);
    }
  }
}

// Narrowing checked on every float whose low 13 bits are one of the patterns around a rounding
// decision (0, 1, just below and at the float16 tie, just above it, all ones): with the upper 19
// bits enumerated, that puts a tie and both its neighbours at every rounding position, including
// the deeper ones of float16 subnormals and the 16-bit one of bfloat16.
TEST_P(KernelIsaTest, StructuredFloatsNarrowLikeScalar) {
  const uint32_t lows[] = {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu};
  const int64_t n = (int64_t{1} << 19) * 6 - 1;  // odd, so the vector kernels end in a tail
  Guarded<float> src(n, 1);                      // misaligned: a head group too
  Guarded<uint16_t> out(n, 3);
  int64_t k = 0;
  for (uint32_t hi = 0; hi < (1u << 19); ++hi)
    for (const uint32_t lo : lows)
      if (k < n) src.data()[k++] = floatOf((hi << 13) | lo);
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
    narrowFromFloat(src.data(), out.data(), n, t, 1.0);
    for (int64_t i = 0; i < n; ++i) {
      const float x = src.data()[i];
      // narrowFromFloat multiplies by the factor even when it is 1, which quiets a signalling NaN
      // before narrowing; the narrowed bits are the same either way.
      const uint16_t want =
          t == DType::kFloat16 ? floatToHalf(x * 1.0f) : floatToBfloat16(x * 1.0f);
      ASSERT_EQ(out.data()[i], want) << dtypeName(t) << " bits " << bitsOf(x);
    }
    EXPECT_TRUE(out.guardsIntact());
  }
}

// Every 16-bit pattern widens, through the entry point, to the bits of the scalar halfToFloat /
// bfloat16ToFloat times the factor, NaN payloads included (the product quiets a bfloat16 signalling
// NaN in both). One long call at odd misalignments, then the same patterns in short calls of odd
// lengths, so that heads, tails and main loops of the vector kernels each see every pattern.
const int64_t kChunkLengths[] = {1, 2, 3, 5, 7, 9, 15, 16, 17, 31, 33, 47, 63, 64, 65, 100, 129};

template <typename Call>
void inChunks(int64_t n, Call call) {
  int64_t at = 0;
  for (size_t k = 0; at < n; ++k) {
    const int64_t len = std::min(kChunkLengths[k % std::size(kChunkLengths)], n - at);
    call(at, len);
    at += len;
  }
}

TEST_P(KernelIsaTest, EveryPatternWidensBitExact) {
  const int64_t n = 0x10000 + 3;  // every pattern, and a few again for an odd length
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
    for (const double factor : {1.0, 0.5}) {
      for (const int chunked : {0, 1}) {
        Guarded<uint16_t> half(n, 1);
        Guarded<float> wide(n, 3);
        for (int64_t i = 0; i < n; ++i) half.data()[i] = static_cast<uint16_t>(i);
        if (chunked) {
          inChunks(n, [&](int64_t at, int64_t len) {
            widenToFloat(half.data() + at, wide.data() + at, len, t, factor);
          });
        } else {
          widenToFloat(half.data(), wide.data(), n, t, factor);
        }
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t p = half.data()[i];
          const float scalar = t == DType::kFloat16 ? halfToFloat(p) : bfloat16ToFloat(p);
          const float want = scalar * static_cast<float>(factor);
          ASSERT_EQ(bitsOf(wide.data()[i]), bitsOf(want))
              << dtypeName(t) << " x" << factor << " chunked=" << chunked << " pattern " << p;
        }
        EXPECT_TRUE(half.guardsIntact());
        EXPECT_TRUE(wide.guardsIntact());
      }
    }
  }
}

// Every 16-bit pattern, widened by the scalar code, narrows back through the entry point to the
// scalar narrowing's bits: itself, or for a NaN the quieted pattern.
TEST_P(KernelIsaTest, EveryPatternNarrowsBitExact) {
  const int64_t n = 0x10000 + 5;
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
    for (const int chunked : {0, 1}) {
      Guarded<float> wide(n, 1);
      Guarded<uint16_t> half(n, 3);
      for (int64_t i = 0; i < n; ++i) {
        const auto p = static_cast<uint16_t>(i);
        wide.data()[i] = t == DType::kFloat16 ? halfToFloat(p) : bfloat16ToFloat(p);
      }
      if (chunked) {
        inChunks(n, [&](int64_t at, int64_t len) {
          narrowFromFloat(wide.data() + at, half.data() + at, len, t, 1.0);
        });
      } else {
        narrowFromFloat(wide.data(), half.data(), n, t, 1.0);
      }
      for (int64_t i = 0; i < n; ++i) {
        const float x = wide.data()[i];
        const uint16_t want = t == DType::kFloat16 ? floatToHalf(x) : floatToBfloat16(x);
        ASSERT_EQ(half.data()[i], want)
            << dtypeName(t) << " chunked=" << chunked << " pattern " << static_cast<uint16_t>(i);
        if (!std::isnan(x)) {
          ASSERT_EQ(half.data()[i], static_cast<uint16_t>(i));
        }
      }
      EXPECT_TRUE(half.guardsIntact());
      EXPECT_TRUE(wide.guardsIntact());
    }
  }
}

// ---- every kernel against the scalar kernels, bit for bit ---------------------------------------

// Random bits of every element type: all classes of float, NaN payloads of both kinds included.
void randomBytes(unsigned char *p, size_t bytes, std::mt19937_64 &rng) {
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(rng());
}

// A 64-byte aligned byte buffer, to place spans at chosen misalignments.
struct Aligned {
  explicit Aligned(size_t bytes) : words((bytes + 127) / 8) {}
  unsigned char *at(size_t offset) {
    auto *p = reinterpret_cast<unsigned char *>(words.data());
    return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64 + offset;
  }
  std::vector<uint64_t> words;
};

// One kernel call on (dst, src) of n elements of dtype.
using KernelCall = std::function<void(void *dst, const void *src, int64_t n)>;

struct NamedCall {
  std::string name;
  DType dtype;
  size_t dstSize, srcSize;  // element sizes
  KernelCall call;
};

std::vector<NamedCall> everyKernel() {
  std::vector<NamedCall> out;
  for (const DType t : kAllDTypes) {
    const size_t size = dtypeSize(t);
    for (const ReduceOp op : kOps) {
      out.push_back({std::string("reduceInto ") + reduceOpName(op), t, size, size,
                     [t, op](void *d, const void *s, int64_t n) { reduceInto(d, s, n, t, op); }});
      const double factors[] = {1.0, 0.5};
      for (const double f : factors) {
        if (!isFloating(t) && f != 1.0) continue;
        out.push_back(
            {std::string("reduceScaledInto x") + std::to_string(f) + " " + reduceOpName(op), t,
             size, size, [t, op, f](void *d, const void *s, int64_t n) {
               reduceScaledInto(d, s, n, t, op, f);
             }});
      }
      if (t == DType::kFloat16 || t == DType::kBFloat16) {
        for (const double f : {1.0, 3.0}) {
          out.push_back(
              {std::string("reduceWidenedInto x") + std::to_string(f) + " " + reduceOpName(op), t,
               sizeof(float), size, [t, op, f](void *d, const void *s, int64_t n) {
                 reduceWidenedInto(static_cast<float *>(d), s, n, t, op, f);
               }});
        }
      }
    }
    if (isFloating(t)) {
      out.push_back({"scaleInPlace x3", t, size, size,
                     [t](void *d, const void *, int64_t n) { scaleInPlace(d, n, t, 3.0); }});
    }
    if (t == DType::kFloat16 || t == DType::kBFloat16) {
      out.push_back(
          {"widenToFloat x0.5", t, sizeof(float), size, [t](void *d, const void *s, int64_t n) {
             widenToFloat(s, static_cast<float *>(d), n, t, 0.5);
           }});
      out.push_back(
          {"narrowFromFloat x0.5", t, size, sizeof(float), [t](void *d, const void *s, int64_t n) {
             narrowFromFloat(static_cast<const float *>(s), d, n, t, 0.5);
           }});
    }
  }
  return out;
}

// Lengths 0-150 (heads, tails and a few main-loop groups at every misalignment) and two long
// ones; dst and src at different misalignments. Inputs are random bits, so NaNs, infinities and
// subnormals are everywhere. A sum or product of two NaNs may give either one, quieted: the vector
// kernels take dst's, the scalar ones whichever operand order the compiler picked for a + b.
TEST_P(KernelIsaTest, EveryKernelMatchesScalarBitwise) {
  if (GetParam() == Isa::kScalar) GTEST_SKIP() << "the reference itself";
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 150; ++n) lengths.push_back(n);
  lengths.push_back(4099);
  lengths.push_back(100003);
  std::mt19937_64 rng(4242);
  for (const NamedCall &k : everyKernel()) {
    for (const int64_t n : lengths) {
      const int misalignments = n <= 150 ? 4 : 2;
      for (int m = 0; m < misalignments; ++m) {
        const size_t dOff = static_cast<size_t>(m) * k.dstSize;
        const size_t sOff = static_cast<size_t>((m * 3) % 5) * k.srcSize;
        const auto dBytes = static_cast<size_t>(n) * k.dstSize;
        const auto sBytes = static_cast<size_t>(n) * k.srcSize;
        Aligned src(sBytes + sOff), mine(dBytes + dOff + 64), ref(dBytes + dOff + 64);
        randomBytes(src.at(sOff), sBytes, rng);
        randomBytes(mine.at(0), dBytes + dOff + 64, rng);  // guard bytes past the end too
        std::memcpy(ref.at(0), mine.at(0), dBytes + dOff + 64);
        const std::vector<unsigned char> before(mine.at(0), mine.at(0) + dBytes + dOff + 64);
        k.call(mine.at(dOff), src.at(sOff), n);
        withScalarIsa([&] { k.call(ref.at(dOff), src.at(sOff), n); });
        ASSERT_EQ(std::memcmp(mine.at(0), before.data(), dOff), 0) << k.name << " wrote before";
        ASSERT_EQ(std::memcmp(mine.at(dOff + dBytes), before.data() + dOff + dBytes, 64), 0)
            << k.name << " wrote past the end, n=" << n;
        int64_t bad = 0;
        for (int64_t i = 0; i < n; ++i) {
          const unsigned char *got = mine.at(dOff) + i * k.dstSize;
          const unsigned char *want = ref.at(dOff) + i * k.dstSize;
          if (std::memcmp(got, want, k.dstSize) == 0) continue;
          // Both operands NaN in a sum or product: the result is one of them, quieted.
          const unsigned char *wasD = before.data() + dOff + i * k.dstSize;
          const unsigned char *wasS = src.at(sOff) + i * k.srcSize;
          if (k.name.rfind("reduce", 0) == 0 && k.name.find("min") == std::string::npos &&
              k.name.find("max") == std::string::npos && isNanBits(k.dtype, k.dstSize, wasD) &&
              isNanBits(k.dtype, k.srcSize, wasS)) {
            const std::vector<unsigned char> fromD = quietNan(k.dtype, k.dstSize, wasD, k.dstSize);
            const std::vector<unsigned char> fromS = quietNan(k.dtype, k.srcSize, wasS, k.dstSize);
            if (std::memcmp(got, fromD.data(), k.dstSize) == 0 ||
                std::memcmp(got, fromS.data(), k.dstSize) == 0)
              continue;
          }
          if (bad++ < 5) {
            ADD_FAILURE() << k.name << " " << dtypeName(k.dtype) << " n=" << n << " m=" << m
                          << " i=" << i << ": got " << hexBytes(got, k.dstSize) << ", scalar "
                          << hexBytes(want, k.dstSize) << " (dst was "
                          << hexBytes(before.data() + dOff + i * k.dstSize, k.dstSize) << ", src "
                          << hexBytes(src.at(sOff) + i * k.srcSize, k.srcSize) << ")";
          }
        }
        ASSERT_EQ(bad, 0) << k.name << " " << dtypeName(k.dtype) << " n=" << n;
      }
    }
  }
}

// ---- reduceWidenedInto and reduceScaledInto against independent references ----------------------

template <DType D>
struct CheckReduceWidened {
  static void run() {
    if constexpr (Traits<D>::kind == Kind::kHalf || Traits<D>::kind == Kind::kBf16) {
      for (const ReduceOp op : kOps) {
        std::mt19937_64 rng(500 + static_cast<int>(D) * 10 + static_cast<int>(op));
        for (const double factor : kFactors) {
          for (const int64_t n : kShortLengths) {
            for (const int offset : {0, 1}) {
              Guarded<float> dst(n, offset);
              Guarded<uint16_t> src(n, 1 - offset);
              std::vector<float> want(static_cast<size_t>(n));
              for (int64_t i = 0; i < n; ++i) {
                dst.data()[i] = randomValue<DType::kFloat32>(rng);
                src.data()[i] = randomValue<D>(rng);
                float v = widen<D>(src.data()[i]);
                if (factor != 1.0) v *= static_cast<float>(factor);
                want[i] = refFloatOp(op, dst.data()[i], v);
              }
              reduceWidenedInto(dst.data(), src.data(), n, D, op, factor);
              int64_t bad = 0;
              for (int64_t i = 0; i < n; ++i) {
                if (!matches<DType::kFloat32>(op, want[i], dst.data()[i]) && bad++ < 5) {
                  ADD_FAILURE() << dtypeName(D) << " " << reduceOpName(op) << " x" << factor
                                << " n=" << n << " i=" << i << ": want " << want[i] << ", got "
                                << dst.data()[i];
                }
              }
              EXPECT_EQ(bad, 0);
              EXPECT_TRUE(dst.guardsIntact());
              EXPECT_TRUE(src.guardsIntact());
            }
          }
        }
      }
    } else {
      FAIL() << "float16 and bfloat16 only";
    }
  }
};

TEST_P(KernelIsaTest, ReduceWidenedIntoMatchesReference) {
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) dispatch<CheckReduceWidened>(t);
}

template <DType D>
struct CheckReduceScaled {
  static void run() {
    using S = typename Traits<D>::S;
    constexpr Kind kind = Traits<D>::kind;
    for (const ReduceOp op : kOps) {
      std::mt19937_64 rng(700 + static_cast<int>(D) * 10 + static_cast<int>(op));
      for (const double factor : kFactors) {
        if ((kind == Kind::kInt || kind == Kind::kBool) && factor != 1.0)
          continue;  // refused: see NewKernelsRefuse
        for (const int64_t n : kShortLengths) {
          for (const int offset : {0, 1}) {
            Guarded<S> dst(n, offset);
            Guarded<S> src(n, 1 - offset);
            std::vector<S> want(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) {
              dst.data()[i] = randomValue<D>(rng);
              src.data()[i] = randomValue<D>(rng);
              const S a = dst.data()[i], b = src.data()[i];
              if constexpr (kind == Kind::kInt || kind == Kind::kBool) {
                want[i] = refOp<D>(op, a, b);
              } else if constexpr (kind == Kind::kFloat) {
                want[i] = factor == 1.0 ? refOp<D>(op, a, b)
                                        : refFloatOp(op, a, b * static_cast<S>(factor));
              } else {
                const float f = static_cast<float>(factor);
                want[i] = factor == 1.0 ? refOp<D>(op, a, b)
                                        : narrow<D>(refFloatOp(op, widen<D>(a), widen<D>(b) * f));
              }
            }
            reduceScaledInto(dst.data(), src.data(), n, D, op, factor);
            int64_t bad = 0;
            for (int64_t i = 0; i < n; ++i) {
              if (!matches<D>(op, want[i], dst.data()[i]) && bad++ < 5) {
                ADD_FAILURE() << dtypeName(D) << " " << reduceOpName(op) << " x" << factor
                              << " n=" << n << " i=" << i << ": want " << show<D>(want[i])
                              << ", got " << show<D>(dst.data()[i]);
              }
            }
            EXPECT_EQ(bad, 0);
            EXPECT_TRUE(dst.guardsIntact());
            EXPECT_TRUE(src.guardsIntact());
          }
        }
      }
    }
  }
};

TEST_P(KernelIsaTest, ReduceScaledIntoMatchesReference) {
  for (const DType t : kAllDTypes) dispatch<CheckReduceScaled>(t);
}

// A factor of 1 is reduceInto itself, bit for bit, NaN payloads included.
TEST_P(KernelIsaTest, ReduceScaledByOneIsReduceInto) {
  std::mt19937_64 rng(8);
  const int64_t n = 1001;
  for (const DType t : kAllDTypes) {
    const size_t bytes = static_cast<size_t>(n) * dtypeSize(t);
    for (const ReduceOp op : kOps) {
      std::vector<unsigned char> a(bytes), b(bytes), src(bytes);
      randomBytes(a.data(), bytes, rng);
      randomBytes(src.data(), bytes, rng);
      b = a;
      reduceInto(a.data(), src.data(), n, t, op);
      reduceScaledInto(b.data(), src.data(), n, t, op, 1.0);
      EXPECT_EQ(a, b) << dtypeName(t) << " " << reduceOpName(op);
    }
  }
}

// The factor is rounded to float32 for float32 and used as is for float64.
TEST_P(KernelIsaTest, ReduceScaledFactorPrecisionFollowsTheDType) {
  std::vector<float> f(100, 1.0f), fs(100);
  std::vector<double> d(100, 1.0), ds(100);
  for (size_t i = 0; i < fs.size(); ++i) {
    fs[i] = 1.0f + static_cast<float>(i) / 7.0f;
    ds[i] = 1.0 + static_cast<double>(i) / 7.0;
  }
  reduceScaledInto(f.data(), fs.data(), 100, DType::kFloat32, ReduceOp::kSum, 0.1);
  reduceScaledInto(d.data(), ds.data(), 100, DType::kFloat64, ReduceOp::kSum, 0.1);
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_EQ(bitsOf(f[i]), bitsOf(1.0f + fs[i] * 0.1f)) << i;
    EXPECT_EQ(d[i], 1.0 + ds[i] * 0.1) << i;
  }
}

// Min/max keep the exact rule of the scalar code, bit for bit: a NaN in dst stays (its payload),
// a NaN in src is taken where dst is not NaN, and on ties (-0 against +0 included) src wins.
TEST_P(KernelIsaTest, MinMaxOperandRuleBitExact) {
  const float qnanA = floatOf(0x7fc12345u), qnanB = floatOf(0xffc54321u);
  const float snanC = floatOf(0x7f812345u);  // signalling: min/max move it without arithmetic
  const float d4[] = {qnanA, 1.0f, -0.0f, 0.0f, qnanA, 2.0f, 5.0f, snanC};
  const float s4[] = {1.0f, qnanB, 0.0f, -0.0f, qnanB, snanC, 2.0f, 5.0f};
  const int64_t n = 8 * 9;  // every pattern at every vector position, and tails
  for (const ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<float> d(n), s(n);
    std::vector<double> dd(n), sd(n);
    for (int64_t i = 0; i < n; ++i) {
      d[i] = d4[(i + i / 8) % 8];
      s[i] = s4[(i + i / 8) % 8];
      dd[i] = d[i];  // float -> double keeps NaN payload bits (quieted)
      sd[i] = s[i];
    }
    std::vector<float> d0 = d;
    std::vector<double> dd0 = dd;
    reduceInto(d.data(), s.data(), n, DType::kFloat32, op);
    reduceInto(dd.data(), sd.data(), n, DType::kFloat64, op);
    for (int64_t i = 0; i < n; ++i) {
      const float a = d0[i], b = s[i];
      const bool takeA = std::isnan(a) || (op == ReduceOp::kMin ? a < b : a > b);
      EXPECT_EQ(bitsOf(d[i]), bitsOf(takeA ? a : b)) << reduceOpName(op) << " i=" << i;
      const double ad = dd0[i], bd = sd[i];
      const bool takeAd = std::isnan(ad) || (op == ReduceOp::kMin ? ad < bd : ad > bd);
      uint64_t got, want;
      const double w = takeAd ? ad : bd;
      std::memcpy(&got, &dd[i], 8);
      std::memcpy(&want, &w, 8);
      EXPECT_EQ(got, want) << reduceOpName(op) << " float64 i=" << i;
    }
    // The float32 accumulator of reduceWidenedInto, unscaled: the widened src moves unchanged
    // (a bfloat16 signalling NaN stays signalling; float16 widening quiets, as halfToFloat does).
    for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
      std::vector<uint16_t> h(n);
      std::vector<float> acc(n);
      for (int64_t i = 0; i < n; ++i) {
        h[i] = t == DType::kFloat16 ? floatToHalf(s[i]) : static_cast<uint16_t>(bitsOf(s[i]) >> 16);
        acc[i] = d0[i];
      }
      reduceWidenedInto(acc.data(), h.data(), n, t, op, 1.0);
      for (int64_t i = 0; i < n; ++i) {
        const float a = d0[i], b = t == DType::kFloat16 ? halfToFloat(h[i]) : bfloat16ToFloat(h[i]);
        const bool takeA = std::isnan(a) || (op == ReduceOp::kMin ? a < b : a > b);
        EXPECT_EQ(bitsOf(acc[i]), bitsOf(takeA ? a : b))
            << dtypeName(t) << " " << reduceOpName(op) << " i=" << i;
      }
    }
  }
}

// copyBytes and streamBytes: every byte of [dst, dst + n) from src, nothing outside it touched, for every relative
// alignment within a cache line (dst - src of 1..15 bytes modulo 4096 is the one glibc's memcpy
// is slow at here) and lengths around the head, the vector rounds and the tail.
TEST_P(KernelIsaTest, CopiesCopyExactlyTheRange) {
  constexpr size_t kPad = 128;
  std::vector<unsigned char> src(20000 + 2 * kPad), dst(20000 + 2 * kPad);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{63}, size_t{64}, size_t{65}, size_t{255},
                   size_t{256}, size_t{257}, size_t{1000}, size_t{4096 + 13}, size_t{19000}}) {
    for (size_t srcOff = 0; srcOff < 64; srcOff += 9) {
      for (size_t dstOff = 0; dstOff < 64; dstOff += 5) {
        for (bool stream : {false, true}) {
          std::fill(dst.begin(), dst.end(), 0xA5);
          if (stream) {
            streamBytes(dst.data() + kPad + dstOff, src.data() + kPad + srcOff, n);
            streamFence();
          } else {
            copyBytes(dst.data() + kPad + dstOff, src.data() + kPad + srcOff, n);
          }
          for (size_t i = 0; i < dst.size(); ++i) {
            const bool inside = i >= kPad + dstOff && i < kPad + dstOff + n;
            const unsigned char want = inside ? src[i - dstOff + srcOff] : 0xA5;
            ASSERT_EQ(dst[i], want) << (stream ? "streamBytes" : "copyBytes") << " n " << n
                                    << " src+" << srcOff << " dst+" << dstOff << " byte " << i;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, KernelIsaTest, ::testing::ValuesIn(kIsas), isaParamName);

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
  const auto bad = static_cast<DType>(kNumDTypes);  // 10: one past bool
  expectInvalid([&] { reduceInto(a, b, 4, bad, ReduceOp::kSum); }, "reduceInto", "10");
  expectInvalid([&] { reduceInto(a, b, 4, static_cast<DType>(255), ReduceOp::kMax); }, "reduceInto",
                "255");
  expectInvalid([&] { reduceInto(a, b, 4, DType::kFloat32, static_cast<ReduceOp>(9)); },
                "reduceInto", "9");
  expectInvalid([&] { reduceInto(a, b, -1, DType::kFloat32, ReduceOp::kSum); }, "reduceInto", "-1");
  expectInvalid([&] { scaleInPlace(a, 4, bad, 2.0); }, "scaleInPlace", "10");
  expectInvalid([&] { scaleInPlace(a, 4, bad, 1.0); }, "scaleInPlace", "10");
  expectInvalid([&] { scaleInPlace(a, 4, DType::kInt64, 2.0); }, "scaleInPlace", "int64");
  expectInvalid([&] { widenToFloat(a, b, 4, DType::kFloat32, 1.0); }, "widenToFloat", "float32");
  expectInvalid([&] { narrowFromFloat(a, b, 4, bad, 1.0); }, "narrowFromFloat", "10");
  expectInvalid([&] { scaleInPlace(a, 4, DType::kInt16, 2.0); }, "scaleInPlace", "int16");
  expectInvalid([&] { scaleInPlace(a, 4, DType::kBool, 0.5); }, "scaleInPlace", "bool");
  expectInvalid([&] { widenToFloat(a, b, 4, DType::kInt16, 1.0); }, "widenToFloat", "int16");
  expectInvalid([&] { narrowFromFloat(a, b, 4, DType::kInt16, 1.0); }, "narrowFromFloat",
                "int16");
  expectInvalid([&] { normalizeBools(a, b, -3); }, "normalizeBools", "-3");
}

TEST(Kernels, NewKernelsRefuse) {
  float a[4] = {}, b[4] = {};
  int32_t i[4] = {1, 2, 3, 4}, j[4] = {1, 1, 1, 1};
  const auto bad = static_cast<DType>(kNumDTypes);
  expectInvalid([&] { reduceWidenedInto(a, b, 4, DType::kFloat32, ReduceOp::kSum, 1.0); },
                "reduceWidenedInto", "float32");
  expectInvalid([&] { reduceWidenedInto(a, b, 4, bad, ReduceOp::kSum, 2.0); }, "reduceWidenedInto",
                "10");
  expectInvalid([&] { reduceWidenedInto(a, b, 4, DType::kFloat16, static_cast<ReduceOp>(7), 1.0); },
                "reduceWidenedInto", "7");
  expectInvalid([&] { reduceWidenedInto(a, b, -2, DType::kBFloat16, ReduceOp::kMax, 1.0); },
                "reduceWidenedInto", "-2");
  expectInvalid([&] { reduceScaledInto(a, b, 4, bad, ReduceOp::kSum, 1.0); }, "reduceScaledInto",
                "10");
  expectInvalid([&] { reduceScaledInto(a, b, 4, DType::kFloat32, static_cast<ReduceOp>(5), 2.0); },
                "reduceScaledInto", "5");
  expectInvalid([&] { reduceScaledInto(a, b, -1, DType::kFloat32, ReduceOp::kSum, 2.0); },
                "reduceScaledInto", "-1");
  // Integers: factor 1 is reduceInto; any other factor is refused, as scaleInPlace refuses it.
  for (const DType t : {DType::kUInt8, DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64,
                        DType::kBool}) {
    expectInvalid([&] { reduceScaledInto(i, j, 1, t, ReduceOp::kSum, 0.5); }, "reduceScaledInto",
                  dtypeName(t));
  }
  EXPECT_EQ(i[0], 1);
  reduceScaledInto(i, j, 4, DType::kInt32, ReduceOp::kSum, 1.0);
  EXPECT_EQ(i[3], 5);
}

TEST(Kernels, InstructionSets) {
  using namespace kernels_detail;
  EXPECT_STREQ(isaName(Isa::kScalar), "scalar");
  EXPECT_STREQ(isaName(Isa::kAvx2), "avx2");
  EXPECT_STREQ(isaName(Isa::kAvx512), "avx512");
  EXPECT_STREQ(isaName(static_cast<Isa>(kNumIsas)), "invalid");
  EXPECT_TRUE(isaSupported(Isa::kScalar));
  EXPECT_FALSE(isaSupported(static_cast<Isa>(kNumIsas)));
  EXPECT_TRUE(isaSupported(bestIsa()));
  if (isaSupported(Isa::kAvx512)) {
    EXPECT_TRUE(isaSupported(Isa::kAvx2));
  }
  EXPECT_THROW(setIsaForTesting(static_cast<Isa>(kNumIsas)), hora::Error);
  for (const Isa isa : kIsas) {
    if (isaSupported(isa)) {
      setIsaForTesting(isa);
      EXPECT_EQ(activeIsa(), isa);
    } else {
      EXPECT_THROW(setIsaForTesting(isa), hora::Error) << isaName(isa);
    }
  }
  setIsaForTesting(bestIsa());
  EXPECT_EQ(activeIsa(), bestIsa());
  std::printf("kernels: best instruction set here is %s\n", isaName(bestIsa()));
}

TEST(Kernels, ZeroCountTouchesNothing) {
  for (const DType t : kAllDTypes) {
    for (const ReduceOp op : kOps) EXPECT_NO_THROW(reduceInto(nullptr, nullptr, 0, t, op));
  }
  EXPECT_NO_THROW(scaleInPlace(nullptr, 0, DType::kFloat16, 2.0));
  EXPECT_NO_THROW(widenToFloat(nullptr, nullptr, 0, DType::kBFloat16, 2.0));
  EXPECT_NO_THROW(narrowFromFloat(nullptr, nullptr, 0, DType::kFloat16, 2.0));
  for (const ReduceOp op : kOps) {
    EXPECT_NO_THROW(reduceWidenedInto(nullptr, nullptr, 0, DType::kBFloat16, op, 2.0));
    for (const DType t : kAllDTypes) {
      EXPECT_NO_THROW(reduceScaledInto(nullptr, nullptr, 0, t, op, 1.0));
      EXPECT_NO_THROW(reduceScaledInto(nullptr, nullptr, 0, t, op, 2.0));
    }
  }
}

}  // namespace
}  // namespace hora
