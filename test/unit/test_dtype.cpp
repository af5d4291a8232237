// SPDX-License-Identifier: Apache-2.0
// dtype sizes and names, and float16/bfloat16 conversions checked against independent references.
#include <gtest/gtest.h>

#include "base/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace hora {
namespace {

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

// ---- independent references ---------------------------------------------------------------------
// Decoders built from the format definitions with std::ldexp, and an encoder that picks the nearest
// representable value from a sorted table by exact comparisons, without any bit tricks.

struct Format {
  const char *name;
  int mantBits;  // stored mantissa bits
  int expBits;
  int bias;
};
constexpr Format kHalf{"float16", 10, 5, 15};
constexpr Format kBf16{"bfloat16", 7, 8, 127};

bool refIsNan(const Format &f, uint16_t v) {
  const int e = (v >> f.mantBits) & ((1 << f.expBits) - 1);
  const int m = v & ((1 << f.mantBits) - 1);
  return e == (1 << f.expBits) - 1 && m != 0;
}

double refDecode(const Format &f, uint16_t v) {
  const bool neg = (v & 0x8000u) != 0;
  const int e = (v >> f.mantBits) & ((1 << f.expBits) - 1);
  const int m = v & ((1 << f.mantBits) - 1);
  double mag;
  if (e == (1 << f.expBits) - 1) {
    mag =
        m != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    mag = std::ldexp(static_cast<double>(m), 1 - f.bias - f.mantBits);
  } else {
    mag = std::ldexp(static_cast<double>((1 << f.mantBits) + m), e - f.bias - f.mantBits);
  }
  return neg ? -mag : mag;
}

// Every non-negative finite value, ascending with the bit pattern, plus the value infinity stands
// for when rounding (the next power of two, whose pattern is the infinity pattern and even), so
// that overflow falls out of the same nearest-even rule as every other rounding.
struct RoundingTable {
  std::vector<double> values;
  std::vector<uint16_t> patterns;
};

RoundingTable makeTable(const Format &f) {
  RoundingTable t;
  const uint16_t inf = static_cast<uint16_t>(((1u << f.expBits) - 1u) << f.mantBits);
  for (uint32_t v = 0; v < inf; ++v) {
    t.values.push_back(refDecode(f, static_cast<uint16_t>(v)));
    t.patterns.push_back(static_cast<uint16_t>(v));
  }
  t.values.push_back(std::ldexp(1.0, (1 << (f.expBits - 1))));  // 2^16 or 2^128
  t.patterns.push_back(inf);
  return t;
}

const RoundingTable &table(const Format &f) {
  static const RoundingTable half = makeTable(kHalf);
  static const RoundingTable bf16 = makeTable(kBf16);
  return f.expBits == kHalf.expBits ? half : bf16;
}

// Nearest, ties to the even pattern. Non-NaN input only.
uint16_t refEncode(const Format &f, float x) {
  const RoundingTable &t = table(f);
  const uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= t.values.back()) return static_cast<uint16_t>(sign | t.patterns.back());
  const size_t hi =
      static_cast<size_t>(std::upper_bound(t.values.begin(), t.values.end(), a) - t.values.begin());
  const size_t lo = hi - 1;  // values[lo] <= a < values[hi]
  // lo + hi and 2a are exact in double: both neighbours have at most 11 significant bits.
  const double twice = 2.0 * a;
  const double sum = t.values[lo] + t.values[hi];
  size_t pick;
  if (twice < sum) {
    pick = lo;
  } else if (twice > sum) {
    pick = hi;
  } else {
    pick = (t.patterns[lo] & 1u) == 0 ? lo : hi;
  }
  return static_cast<uint16_t>(sign | t.patterns[pick]);
}

uint16_t encode(const Format &f, float x) {
  return f.expBits == kHalf.expBits ? floatToHalf(x) : floatToBfloat16(x);
}

float decode(const Format &f, uint16_t v) {
  return f.expBits == kHalf.expBits ? halfToFloat(v) : bfloat16ToFloat(v);
}

const Format kFormats[] = {kHalf, kBf16};

// ---- dtype table --------------------------------------------------------------------------------

TEST(DType, SizesNamesAndKinds) {
  struct Row {
    DType t;
    size_t size;
    const char *name;
    bool floating;
  };
  const Row rows[] = {
      {DType::kUInt8, 1, "uint8", false},    {DType::kInt8, 1, "int8", false},
      {DType::kInt32, 4, "int32", false},    {DType::kInt64, 8, "int64", false},
      {DType::kFloat16, 2, "float16", true}, {DType::kBFloat16, 2, "bfloat16", true},
      {DType::kFloat32, 4, "float32", true}, {DType::kFloat64, 8, "float64", true},
      {DType::kInt16, 2, "int16", false},    {DType::kBool, 1, "bool", false},
  };
  ASSERT_EQ(sizeof rows / sizeof rows[0], static_cast<size_t>(kNumDTypes));
  for (const Row &r : rows) {
    EXPECT_EQ(dtypeSize(r.t), r.size) << r.name;
    EXPECT_STREQ(dtypeName(r.t), r.name);
    EXPECT_EQ(isFloating(r.t), r.floating) << r.name;
  }
}

TEST(DType, WireValuesAreFixed) {
  EXPECT_EQ(static_cast<int>(DType::kUInt8), 0);
  EXPECT_EQ(static_cast<int>(DType::kInt8), 1);
  EXPECT_EQ(static_cast<int>(DType::kInt32), 2);
  EXPECT_EQ(static_cast<int>(DType::kInt64), 3);
  EXPECT_EQ(static_cast<int>(DType::kFloat16), 4);
  EXPECT_EQ(static_cast<int>(DType::kBFloat16), 5);
  EXPECT_EQ(static_cast<int>(DType::kFloat32), 6);
  EXPECT_EQ(static_cast<int>(DType::kFloat64), 7);
  EXPECT_EQ(static_cast<int>(DType::kInt16), 8);
  EXPECT_EQ(static_cast<int>(DType::kBool), 9);
  EXPECT_EQ(kNumDTypes, 10);
  EXPECT_EQ(kDLBoolCode, 6);  // DLPack's kDLBool
}

TEST(DType, IsValidDType) {
  for (int raw = 0; raw < 256; ++raw) {
    EXPECT_EQ(isValidDType(static_cast<uint8_t>(raw)), raw < 10) << raw;
  }
  EXPECT_TRUE(isValidDType(8));   // int16
  EXPECT_TRUE(isValidDType(9));   // bool
  EXPECT_FALSE(isValidDType(10));
  EXPECT_FALSE(isValidDType(255));
}

TEST(DType, InvalidValues) {
  for (int raw : {10, 100, 255}) {
    const auto t = static_cast<DType>(raw);
    EXPECT_THROW(dtypeSize(t), hora::Error) << raw;
    EXPECT_STREQ(dtypeName(t), "invalid");
    EXPECT_FALSE(isFloating(t));
  }
}

// ---- widening -----------------------------------------------------------------------------------

TEST(HalfConversion, DecodeAllPatternsMatchesReference) {
  for (const Format &f : kFormats) {
    for (uint32_t v = 0; v < 0x10000u; ++v) {
      const auto p = static_cast<uint16_t>(v);
      const float got = decode(f, p);
      const double want = refDecode(f, p);
      if (refIsNan(f, p)) {
        ASSERT_TRUE(std::isnan(got)) << f.name << " pattern " << v;
        if (f.expBits == kHalf.expBits) {
          ASSERT_NE(bitsOf(got) & 0x00400000u, 0u) << "float16 NaN must widen quiet, " << v;
        } else {
          ASSERT_EQ(bitsOf(got), v << 16) << "bfloat16 widening is exact, NaNs included, " << v;
        }
        ASSERT_EQ(std::signbit(got), (v & 0x8000u) != 0) << f.name << " " << v;
      } else {
        ASSERT_EQ(static_cast<double>(got), want) << f.name << " pattern " << v;
        ASSERT_EQ(std::signbit(got), (v & 0x8000u) != 0) << f.name << " " << v;  // -0 too
      }
    }
  }
}

// ---- round trips --------------------------------------------------------------------------------

TEST(HalfConversion, RoundTripAllPatterns) {
  for (const Format &f : kFormats) {
    const uint16_t quietBit = static_cast<uint16_t>(1u << (f.mantBits - 1));
    for (uint32_t v = 0; v < 0x10000u; ++v) {
      const auto p = static_cast<uint16_t>(v);
      const uint16_t back = encode(f, decode(f, p));
      if (refIsNan(f, p)) {
        ASSERT_TRUE(refIsNan(f, back)) << f.name << " pattern " << v << " -> " << back;
        // Sign and payload survive; a signalling NaN comes back quiet.
        ASSERT_EQ(back, p | quietBit) << f.name << " pattern " << v;
      } else {
        ASSERT_EQ(back, p) << f.name << " pattern " << v;
      }
    }
  }
}

// ---- rounding -----------------------------------------------------------------------------------

// Every midpoint between neighbouring values (ties), and the floats just either side of it.
TEST(HalfConversion, AllTiesRoundToNearestEven) {
  for (const Format &f : kFormats) {
    const RoundingTable &t = table(f);
    for (size_t i = 0; i + 1 < t.values.size(); ++i) {
      const double mid = (t.values[i] + t.values[i + 1]) / 2;
      const auto x = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(x), mid) << "midpoint must be exact in float";
      const uint16_t even = (t.patterns[i] & 1u) == 0 ? t.patterns[i] : t.patterns[i + 1];
      for (const float sgn : {1.0f, -1.0f}) {
        const uint16_t s = sgn < 0 ? 0x8000u : 0u;
        const float y = sgn * x;
        ASSERT_EQ(encode(f, y), static_cast<uint16_t>(s | even)) << f.name << " tie at " << y;
        ASSERT_EQ(encode(f, std::nextafter(y, 0.0f)), static_cast<uint16_t>(s | t.patterns[i]))
            << f.name << " below tie " << y;
        ASSERT_EQ(encode(f, std::nextafter(y, sgn * std::numeric_limits<float>::infinity())),
                  static_cast<uint16_t>(s | t.patterns[i + 1]))
            << f.name << " above tie " << y;
      }
    }
  }
}

TEST(HalfConversion, RandomFloatsMatchReference) {
  std::mt19937 rng(12345);
  for (const Format &f : kFormats) {
    for (int i = 0; i < 1000000; ++i) {
      const float x = floatOf(static_cast<uint32_t>(rng()));
      const uint16_t got = encode(f, x);
      if (std::isnan(x)) {
        ASSERT_TRUE(refIsNan(f, got)) << f.name << " bits " << bitsOf(x);
      } else {
        ASSERT_EQ(got, refEncode(f, x)) << f.name << " x=" << x << " bits " << bitsOf(x);
      }
    }
    // Concentrated where half rounding is delicate: around the subnormal and overflow edges.
    std::uniform_real_distribution<float> tiny(0.0f, 1.3e-4f);
    std::uniform_real_distribution<float> big(6.0e4f, 7.0e4f);
    for (int i = 0; i < 200000; ++i) {
      for (const float x : {tiny(rng), -tiny(rng), big(rng), -big(rng)}) {
        ASSERT_EQ(encode(f, x), refEncode(f, x)) << f.name << " x=" << x;
      }
    }
  }
}

TEST(HalfConversion, HalfOverflowToInfinity) {
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bffu);
  EXPECT_EQ(floatToHalf(-65504.0f), 0xfbffu);
  EXPECT_EQ(floatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bffu);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00u);  // tie between 65504 (odd) and 2^16 (even: inf)
  EXPECT_EQ(floatToHalf(-65520.0f), 0xfc00u);
  EXPECT_EQ(floatToHalf(65536.0f), 0x7c00u);
  EXPECT_EQ(floatToHalf(1e10f), 0x7c00u);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::max()), 0x7c00u);
  EXPECT_EQ(floatToHalf(-std::numeric_limits<float>::max()), 0xfc00u);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::infinity()), 0x7c00u);
  EXPECT_EQ(floatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00u);
}

TEST(HalfConversion, BFloat16OverflowToInfinity) {
  const float maxBf16 = std::ldexp(255.0f, 120);  // 0x7f7f: (2 - 2^-7) * 2^127
  EXPECT_EQ(floatToBfloat16(maxBf16), 0x7f7fu);
  // float max lies above the midpoint between 0x7f7f and 2^128, so it rounds to infinity.
  EXPECT_EQ(floatToBfloat16(std::numeric_limits<float>::max()), 0x7f80u);
  EXPECT_EQ(floatToBfloat16(-std::numeric_limits<float>::max()), 0xff80u);
  EXPECT_EQ(floatToBfloat16(floatOf(0x7f7f7fffu)), 0x7f7fu);
  EXPECT_EQ(floatToBfloat16(floatOf(0x7f7f8000u)), 0x7f80u);
  EXPECT_EQ(floatToBfloat16(std::numeric_limits<float>::infinity()), 0x7f80u);
  EXPECT_EQ(floatToBfloat16(-std::numeric_limits<float>::infinity()), 0xff80u);
}

TEST(HalfConversion, HalfSubnormals) {
  const float unit = std::ldexp(1.0f, -24);  // smallest half subnormal
  EXPECT_EQ(floatToHalf(unit), 0x0001u);
  EXPECT_EQ(floatToHalf(-unit), 0x8001u);
  EXPECT_EQ(floatToHalf(unit / 2), 0x0000u);   // tie with 0: even
  EXPECT_EQ(floatToHalf(-unit / 2), 0x8000u);  // and the sign survives
  EXPECT_EQ(floatToHalf(std::nextafter(unit / 2, 1.0f)), 0x0001u);
  EXPECT_EQ(floatToHalf(unit / 4), 0x0000u);
  EXPECT_EQ(floatToHalf(1.5f * unit), 0x0002u);  // tie between 1 and 2
  EXPECT_EQ(floatToHalf(2.5f * unit), 0x0002u);  // tie between 2 and 3
  EXPECT_EQ(floatToHalf(3.5f * unit), 0x0004u);
  EXPECT_EQ(floatToHalf(1023.0f * unit), 0x03ffu);         // largest subnormal
  EXPECT_EQ(floatToHalf(1023.5f * unit), 0x0400u);         // tie: rounds up into the normals
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -14)), 0x0400u);  // smallest normal
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000u);
  EXPECT_EQ(floatToHalf(-std::numeric_limits<float>::denorm_min()), 0x8000u);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::min()), 0x0000u);
  EXPECT_EQ(floatToHalf(0.0f), 0x0000u);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000u);
  for (uint16_t m = 1; m < 0x400u; ++m) {
    EXPECT_EQ(halfToFloat(m), static_cast<float>(m) * unit) << m;
  }
}

TEST(HalfConversion, BFloat16Subnormals) {
  // bfloat16 has float32's exponent range, so float subnormals map onto bfloat16 subnormals.
  const float unit = std::ldexp(1.0f, -133);
  EXPECT_EQ(floatToBfloat16(unit), 0x0001u);
  EXPECT_EQ(floatToBfloat16(std::numeric_limits<float>::denorm_min()), 0x0000u);
  EXPECT_EQ(floatToBfloat16(-std::numeric_limits<float>::denorm_min()), 0x8000u);
  EXPECT_EQ(floatToBfloat16(1.5f * unit), 0x0002u);
  EXPECT_EQ(floatToBfloat16(2.5f * unit), 0x0002u);
  EXPECT_EQ(floatToBfloat16(127.5f * unit), 0x0080u);  // into the smallest normal
  EXPECT_EQ(bfloat16ToFloat(0x0001u), unit);
  EXPECT_EQ(floatToBfloat16(std::numeric_limits<float>::min()), 0x0080u);
}

TEST(HalfConversion, NaNsStayQuietNaNs) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  const float snan = std::numeric_limits<float>::signaling_NaN();
  for (const Format &f : kFormats) {
    for (const float x : {qnan, -qnan, snan, -snan}) {
      const uint16_t v = encode(f, x);
      EXPECT_TRUE(refIsNan(f, v)) << f.name << " " << bitsOf(x);
      EXPECT_NE(v & (1u << (f.mantBits - 1)), 0u) << f.name << " must be quiet";
      EXPECT_EQ((v & 0x8000u) != 0, std::signbit(x)) << f.name;
    }
    // Payload only in the bits that narrowing drops: must not turn into infinity.
    for (const uint32_t bits : {0x7f800001u, 0xff800001u, 0x7f801000u, 0x7fc00000u, 0x7fffffffu}) {
      EXPECT_TRUE(refIsNan(f, encode(f, floatOf(bits)))) << f.name << " " << bits;
    }
  }
}

TEST(HalfConversion, SimpleValues) {
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00u);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000u);
  EXPECT_EQ(floatToHalf(0.5f), 0x3800u);
  EXPECT_EQ(floatToHalf(0.1f), 0x2e66u);
  EXPECT_EQ(halfToFloat(0x3555u), 0.333251953125f);
  EXPECT_EQ(floatToBfloat16(1.0f), 0x3f80u);
  EXPECT_EQ(floatToBfloat16(-2.0f), 0xc000u);
  EXPECT_EQ(floatToBfloat16(3.140625f), 0x4049u);
  EXPECT_EQ(bfloat16ToFloat(0x4049u), 3.140625f);
}

}  // namespace
}  // namespace hora
