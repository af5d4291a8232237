// SPDX-License-Identifier: Apache-2.0
// CPU element kernels: plain restrict loops, one template per shape, that GCC auto-vectorises.
#include "core/kernels.h"

#include "base/error.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace hora {
namespace {

// ---- errors -------------------------------------------------------------------------------------

std::string describeDType(DType t) {
  const auto raw = static_cast<unsigned>(t);
  if (isValidDType(static_cast<uint8_t>(raw))) return dtypeName(t);
  return "invalid dtype " + std::to_string(raw);
}

[[noreturn]] void throwBadDType(const char *fn, DType t, const char *why) {
  HORA_THROW(HORA_ERR_INTERNAL, fn, ": ", why, ": ", describeDType(t));
}

void checkCount(const char *fn, int64_t count) {
  if (count < 0)
    HORA_THROW(HORA_ERR_INTERNAL, fn, ": negative count ", count);
}

// ---- branch-free conversions --------------------------------------------------------------------
// The inline converters in base/dtype.h branch per element, which stops the vectoriser. These
// compute every case and select, so each loop below becomes straight-line SIMD. They match
// halfToFloat / floatToHalf / floatToBfloat16 (test_kernels widens every 16-bit pattern and narrows
// ties and their neighbours at every rounding position).

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// All-ones when c holds. Conditions become masks and `?:` becomes mask arithmetic: a `?:` whose arm
// holds a float operation gets that operation sunk into a branch, and GCC will not if-convert a
// branch holding an operation that may trap (the default -ftrapping-math), so the loop would stay
// scalar. Masks leave nothing to sink.
inline uint32_t maskIf(bool c) { return 0u - static_cast<uint32_t>(c); }

inline uint32_t selectBits(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = maskIf(c);
  return (a & mask) | (b & ~mask);
}

inline float halfToFloatVec(uint16_t h) {
  const uint32_t mag = h & 0x7fffu;
  const uint32_t infNan = maskIf(mag >= 0x7c00u);
  const uint32_t nan = maskIf(mag > 0x7c00u);
  const uint32_t sub = maskIf(mag < 0x0400u);  // subnormal or zero
  // Rebias the exponent 15 -> 127, twice over for inf/NaN to reach 255, and quiet NaNs as
  // halfToFloat does. A subnormal gets exponent 2^-14 put under its mantissa and then 2^-14 taken
  // off again by one float subtraction, which is exact; every other lane subtracts +0, a no-op.
  const uint32_t bits = ((mag << 13) + 0x38000000u + (infNan & 0x38000000u) + (sub & 0x00800000u)) |
                        (nan & 0x00400000u);
  const float magnitude = floatOf(bits) - floatOf(sub & 0x38800000u);
  return floatOf(bitsOf(magnitude) | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

// One float addition does all the rounding. For m = 2^(max(e, -14) + 13), e the exponent of |f|,
// the sum |f| + m keeps exactly the bits float16 keeps (its float ulp is float16's spacing at e),
// so the FPU rounds to nearest even where float16 would, subnormals included; this assumes the
// default rounding mode, which hora never changes (floatToHalf in base/ is the mode-independent
// reference). bits(sum) - bits(m) is then the rounded significand k in float16 units, and the
// float16 pattern is ((max(e, -14) + 14) << 10) + k: a carry of k into 2^11 moves to the next
// exponent, up to infinity from 65520 on, and a subnormal has exponent term 0. Clamping |f| to 2^16
// first keeps larger values on that path to infinity.
//
// The arithmetic runs one bit to the left and shifts back at the very end: the final right shift
// needs 17 bits, which stops GCC from narrowing the arithmetic before it to 16-bit lanes, which on
// SSE2 (no packusdw) costs a several-shuffle pack for each operand instead of one at the end.
inline uint16_t floatToHalfVec(float f) {
  const uint32_t x = bitsOf(f);
  const auto a = static_cast<int32_t>(x & 0x7fffffffu);  // |f| < 2^31: signed compares suffice
  const uint32_t c = selectBits(a < 0x47800000, static_cast<uint32_t>(a), 0x47800000u);
  const uint32_t e = c & 0x7f800000u;
  const uint32_t m = selectBits(static_cast<int32_t>(e) > 0x38800000, e, 0x38800000u) + (13u << 23);
  const uint32_t sum = bitsOf(floatOf(c) + floatOf(m));
  const uint32_t half2 = ((sum - m) << 1) + (m >> 12) - (126u << 11);
  // NaN: keep the top of the payload and set the quiet bit, as floatToHalf does.
  const uint32_t nan2 = 0xfc00u | ((x >> 12) & 0x7feu);
  const uint32_t sign2 = (x >> 15) & 0x10000u;
  return static_cast<uint16_t>((selectBits(a > 0x7f800000, nan2, half2) | sign2) >> 1);
}

inline float bfloat16ToFloatVec(uint16_t b) { return floatOf(static_cast<uint32_t>(b) << 16); }

// Rounds in 32 bits and shifts once at the end, for the same reason as floatToHalfVec.
inline uint16_t floatToBfloat16Vec(float f) {
  const uint32_t x = bitsOf(f);
  const bool isNan = static_cast<int32_t>(x & 0x7fffffffu) > 0x7f800000;
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);  // to nearest even; carries reach inf
  return static_cast<uint16_t>(selectBits(isNan, x | 0x00400000u, rounded) >> 16);
}

// Lets one template serve both 16-bit float formats.
struct HalfCodec {
  static float widen(uint16_t v) { return halfToFloatVec(v); }
  static uint16_t narrow(float v) { return floatToHalfVec(v); }
};
struct BFloat16Codec {
  static float widen(uint16_t v) { return bfloat16ToFloatVec(v); }
  static uint16_t narrow(float v) { return floatToBfloat16Vec(v); }
};

// ---- element operations -------------------------------------------------------------------------

// Integer sum/product in the unsigned type of the same width (at least unsigned int, so uint8
// operands are not promoted to signed int): wraps modulo 2^n instead of signed-overflow UB.
template <typename T>
using WrapType =
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <typename T>
struct SumOp {
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<WrapType<T>>(a) + static_cast<WrapType<T>>(b));
    } else {
      return a + b;
    }
  }
};

template <typename T>
struct ProductOp {
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<WrapType<T>>(a) * static_cast<WrapType<T>>(b));
    } else {
      return a * b;
    }
  }
};

// For floats, `a < b ? a : b` alone would return b when a is NaN (what minps does), so a NaN in dst
// would vanish. The extra `a != a` keeps it: any NaN operand gives NaN.
template <typename T>
struct MinOp {
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return (a < b || a != a) ? a : b;
    } else {
      return a < b ? a : b;
    }
  }
};

template <typename T>
struct MaxOp {
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return (a > b || a != a) ? a : b;
    } else {
      return a > b ? a : b;
    }
  }
};

// ---- loops --------------------------------------------------------------------------------------
// At -O2 GCC 12 vectorises only loops whose trip count is a known multiple of the vector width (the
// "very-cheap" cost model), so every loop runs over fixed blocks of kBlock elements and then one
// short tail. -O3 vectorises the tail too. Because of the restrict pointers, source and destination
// must not overlap.

constexpr int64_t kBlock = 64;
using FullBlock = std::integral_constant<int64_t, kBlock>;

template <typename SpanFn>
inline void forEachBlock(int64_t n, SpanFn span) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) span(i, FullBlock());
  if (i < n) span(i, n - i);
}

template <typename Op, typename T, typename Len>
inline void reduceSpan(T *__restrict dst, const T *__restrict src, Len n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Op::apply(dst[i], src[i]);
}

// One rounding per element: widen both, combine in float32, narrow.
template <typename Op, typename Codec, typename Len>
inline void reduceSpan16(uint16_t *__restrict dst, const uint16_t *__restrict src, Len n) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = Codec::narrow(Op::apply(Codec::widen(dst[i]), Codec::widen(src[i])));
}

template <typename T, typename Len>
inline void scaleSpan(T *__restrict buf, Len n, T factor) {
  for (int64_t i = 0; i < n; ++i) buf[i] *= factor;
}

template <typename Codec, typename Len>
inline void scaleSpan16(uint16_t *__restrict buf, Len n, float factor) {
  for (int64_t i = 0; i < n; ++i) buf[i] = Codec::narrow(Codec::widen(buf[i]) * factor);
}

template <typename Codec, typename Len>
inline void widenSpan(const uint16_t *__restrict src, float *__restrict dst, Len n, float factor) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Codec::widen(src[i]) * factor;
}

template <typename Codec, typename Len>
inline void narrowSpan(const float *__restrict src, uint16_t *__restrict dst, Len n, float factor) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Codec::narrow(src[i] * factor);
}

template <template <typename> class Op, typename T>
void reduceLoop(void *dst, const void *src, int64_t n) {
  auto *d = static_cast<T *>(dst);
  const auto *s = static_cast<const T *>(src);
  forEachBlock(n, [=](int64_t at, auto len) { reduceSpan<Op<T>>(d + at, s + at, len); });
}

template <template <typename> class Op, typename Codec>
void reduceLoop16(void *dst, const void *src, int64_t n) {
  auto *d = static_cast<uint16_t *>(dst);
  const auto *s = static_cast<const uint16_t *>(src);
  forEachBlock(n,
               [=](int64_t at, auto len) { reduceSpan16<Op<float>, Codec>(d + at, s + at, len); });
}

template <typename T>
void scaleLoop(T *buf, int64_t n, T factor) {
  forEachBlock(n, [=](int64_t at, auto len) { scaleSpan(buf + at, len, factor); });
}

template <typename Codec>
void scaleLoop16(uint16_t *buf, int64_t n, float factor) {
  forEachBlock(n, [=](int64_t at, auto len) { scaleSpan16<Codec>(buf + at, len, factor); });
}

template <typename Codec>
void widenLoop(const uint16_t *src, float *dst, int64_t n, float factor) {
  forEachBlock(n, [=](int64_t at, auto len) { widenSpan<Codec>(src + at, dst + at, len, factor); });
}

template <typename Codec>
void narrowLoop(const float *src, uint16_t *dst, int64_t n, float factor) {
  forEachBlock(n,
               [=](int64_t at, auto len) { narrowSpan<Codec>(src + at, dst + at, len, factor); });
}

template <template <typename> class Op>
void reduceTyped(void *dst, const void *src, int64_t n, DType dtype) {
  switch (dtype) {
    case DType::kUInt8: return reduceLoop<Op, uint8_t>(dst, src, n);
    case DType::kInt8: return reduceLoop<Op, int8_t>(dst, src, n);
    case DType::kInt32: return reduceLoop<Op, int32_t>(dst, src, n);
    case DType::kInt64: return reduceLoop<Op, int64_t>(dst, src, n);
    case DType::kFloat16: return reduceLoop16<Op, HalfCodec>(dst, src, n);
    case DType::kBFloat16: return reduceLoop16<Op, BFloat16Codec>(dst, src, n);
    case DType::kFloat32: return reduceLoop<Op, float>(dst, src, n);
    case DType::kFloat64: return reduceLoop<Op, double>(dst, src, n);
  }
  throwBadDType("reduceInto", dtype, "unsupported dtype");
}

}  // namespace

const char *reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
  }
  return "invalid";  // used in error messages; never throw from here
}

void scaleInPlace(void *buf, int64_t count, DType dtype, double factor) {
  checkCount("scaleInPlace", count);
  if (!isValidDType(static_cast<uint8_t>(dtype)))
    throwBadDType("scaleInPlace", dtype, "unsupported dtype");
  // Before the integer check, so that a pipeline that always applies its (default 1.0) scale
  // factors need not special-case integer tensors.
  if (factor == 1.0 || count == 0) return;
  auto *h = static_cast<uint16_t *>(buf);
  const auto f = static_cast<float>(factor);
  switch (dtype) {
    case DType::kFloat16: return scaleLoop16<HalfCodec>(h, count, f);
    case DType::kBFloat16: return scaleLoop16<BFloat16Codec>(h, count, f);
    case DType::kFloat32: return scaleLoop(static_cast<float *>(buf), count, f);
    case DType::kFloat64: return scaleLoop(static_cast<double *>(buf), count, factor);
    default: throwBadDType("scaleInPlace", dtype, "cannot scale an integer dtype");
  }
}

void widenToFloat(const void *src, float *dst, int64_t count, DType dtype, double factor) {
  checkCount("widenToFloat", count);
  const auto *s = static_cast<const uint16_t *>(src);
  const auto f = static_cast<float>(factor);
  switch (dtype) {
    case DType::kFloat16: return widenLoop<HalfCodec>(s, dst, count, f);
    case DType::kBFloat16: return widenLoop<BFloat16Codec>(s, dst, count, f);
    default: throwBadDType("widenToFloat", dtype, "source must be float16 or bfloat16");
  }
}

void narrowFromFloat(const float *src, void *dst, int64_t count, DType dtype, double factor) {
  checkCount("narrowFromFloat", count);
  auto *d = static_cast<uint16_t *>(dst);
  const auto f = static_cast<float>(factor);
  switch (dtype) {
    case DType::kFloat16: return narrowLoop<HalfCodec>(src, d, count, f);
    case DType::kBFloat16: return narrowLoop<BFloat16Codec>(src, d, count, f);
    default: throwBadDType("narrowFromFloat", dtype, "destination must be float16 or bfloat16");
  }
}

void reduceInto(void *dst, const void *src, int64_t count, DType dtype, ReduceOp op) {
  checkCount("reduceInto", count);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:  // the caller divides, once, after the last step
      return reduceTyped<SumOp>(dst, src, count, dtype);
    case ReduceOp::kMin: return reduceTyped<MinOp>(dst, src, count, dtype);
    case ReduceOp::kMax: return reduceTyped<MaxOp>(dst, src, count, dtype);
    case ReduceOp::kProduct: return reduceTyped<ProductOp>(dst, src, count, dtype);
  }
  HORA_THROW(HORA_ERR_INTERNAL, "reduceInto: invalid reduce op ", static_cast<unsigned>(op));
}

}  // namespace hora
