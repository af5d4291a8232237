// SPDX-License-Identifier: Apache-2.0
// Element type sizes and names, and the scalar float32 -> float16 conversion.
#include "base/dtype.h"

#include "base/error.h"

#include <stdexcept>
#include <string>

namespace hora {

size_t dtypeSize(DType t) {
  switch (t) {
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kBool: return 1;
    case DType::kInt16:
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kInt32:
    case DType::kFloat32: return 4;
    case DType::kInt64:
    case DType::kFloat64: return 8;
  }
  // A size of 0 would let a corrupt wire value turn into a zero-byte copy that "succeeds".
  HORA_THROW(HORA_ERR_INTERNAL, "dtypeSize: invalid dtype ", static_cast<unsigned>(t));
}

const char *dtypeName(DType t) {
  switch (t) {
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kBool: return "bool";
  }
  // Names end up in error messages, often ones about this very value, so never throw here.
  return "invalid";
}

bool isFloating(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat32:
    case DType::kFloat64: return true;
    default: return false;
  }
}

bool isValidDType(uint8_t raw) { return raw < kNumDTypes; }

// Integer-only, so the result does not depend on the floating-point rounding mode. The vectorised
// kernels in core/kernels.cpp use their own branch-free variant and are tested against this one.
uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;

  if (a > 0x7f800000u) {
    // Keep the top of the payload and force the quiet bit: a signalling NaN must not come out as
    // infinity (payload bits all below bit 13) or stay signalling.
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  }
  if (a >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65536, or inf

  if (a >= 0x38800000u) {
    // Normal half (>= 2^-14): rebias 127 -> 15 and drop 13 mantissa bits, ties to even. A carry out
    // of the mantissa bumps the exponent, which is exactly right, up to and including overflow to
    // inf for values in [65520, 65536).
    const uint32_t lsb = (a >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((a - 0x38000000u + 0xfffu + lsb) >> 13));
  }

  // Subnormal half: the result counts units of 2^-24. With the implicit bit made explicit,
  // value = mant * 2^(e - 150), so the count is mant >> (126 - e), rounded to nearest even.
  const uint32_t e = a >> 23;
  const uint32_t shift = 126u - e;  // 14 for the largest subnormals
  if (shift > 24u) return sign;     // below 2^-25: less than half of the smallest subnormal
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // q may reach 0x400: the smallest normal
  return static_cast<uint16_t>(sign | q);
}

}  // namespace hora
