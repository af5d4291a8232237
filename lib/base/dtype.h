// SPDX-License-Identifier: Apache-2.0
// Element types hora moves and reduces, and the float16/bfloat16 <-> float32 conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace hora {

// The DLPack types hora supports (lanes 1). The numeric values travel on the wire: a new type
// takes the next value, never an existing one.
enum class DType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kBFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
  kInt16 = 8,
  // DLPack kDLBool, 8 bits (torch.bool, numpy.bool_): any nonzero byte reads as true; hora's
  // reductions write 0 or 1. SUM and MAX are logical OR, MIN and PRODUCT logical AND.
  kBool = 9,
};
constexpr int kNumDTypes = 10;

// DLPack's type code for bool (kDLBool from dlpack.h 0.8 on; the 0.6 header hora builds against
// may lack the name, the value is fixed by the DLPack ABI).
constexpr uint8_t kDLBoolCode = 6;

size_t dtypeSize(DType t);
const char *dtypeName(DType t);  // "float32", "bfloat16", ...
bool isFloating(DType t);        // float16, bfloat16, float32, float64
bool isValidDType(uint8_t raw);

// float16 (IEEE binary16) and bfloat16. To-float conversions are exact; from-float conversions
// round to nearest even, keep NaN a (quiet) NaN, and overflow to infinity.
inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf / nan
    bits = sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
  } else if (exp != 0) {  // normal
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // zero
    bits = sign;
  } else {  // subnormal: value = mant * 2^-24, exact in float32
    float f = static_cast<float>(mant) * 5.9604644775390625e-08f;
    std::memcpy(&bits, &f, sizeof bits);
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

uint16_t floatToHalf(float f);

inline float bfloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

inline uint16_t floatToBfloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace hora
