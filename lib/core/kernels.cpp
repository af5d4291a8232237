// SPDX-License-Identifier: Apache-2.0
// CPU element kernels: the entry points (argument checks, then a call through the table of the
// active instruction set), the choice of that instruction set, and the portable implementations:
// plain restrict loops, one template per shape, that GCC auto-vectorises for the baseline ISA.
// kernels_x86.cpp holds the AVX2 and AVX-512 ones.
#include "core/kernels.h"

#include "base/error.h"
#include "core/kernels_isa.h"

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if HORA_KERNELS_X86
#include <cpuid.h>
#endif

// No multiply may fuse with the add after it (reduceScaledInto, reduceWidenedInto): a build for
// an FMA target would otherwise round differently from the vector kernels, which never fuse. GCC
// contracts across statements by default in C++ (-ffp-contract=fast); this covers every function
// defined below.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

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
// Each op is a struct with one static apply template, so that a kernel template takes it as a type.

// Integer sum/product in the unsigned type of the same width (at least unsigned int, so uint8
// operands are not promoted to signed int): wraps modulo 2^n instead of signed-overflow UB.
template <typename T>
using WrapType =
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

struct SumOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<WrapType<T>>(a) + static_cast<WrapType<T>>(b));
    } else {
      return a + b;
    }
  }
};

struct ProductOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<WrapType<T>>(a) * static_cast<WrapType<T>>(b));
    } else {
      return a * b;
    }
  }
};

// For floats, `a < b ? a : b` alone would return b when a is NaN (what minps does), so a NaN in dst
// would vanish. The extra `a != a` keeps it: any NaN operand gives NaN. The vector kernels copy
// this exactly (kernels_x86.cpp).
struct MinOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return (a < b || a != a) ? a : b;
    } else {
      return a < b ? a : b;
    }
  }
};

struct MaxOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return (a > b || a != a) ? a : b;
    } else {
      return a > b ? a : b;
    }
  }
};

// bool (one byte, any nonzero byte true): OR for sum and max, AND for min and product, and the
// result always 0 or 1, whatever nonzero bytes came in.
struct BoolOrOp {
  static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a | b) != 0); }
};

struct BoolAndOp {
  static uint8_t apply(uint8_t a, uint8_t b) {
    return static_cast<uint8_t>((a != 0) & (b != 0));
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

template <typename Op, typename T, typename Len>
inline void reduceScaledSpan(T *__restrict dst, const T *__restrict src, Len n, T factor) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Op::apply(dst[i], src[i] * factor);
}

// One rounding per element: widen both, combine in float32, narrow.
template <typename Op, typename Codec, typename Len>
inline void reduceSpan16(uint16_t *__restrict dst, const uint16_t *__restrict src, Len n) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = Codec::narrow(Op::apply(Codec::widen(dst[i]), Codec::widen(src[i])));
}

template <typename Op, typename Codec, typename Len>
inline void reduceScaledSpan16(uint16_t *__restrict dst, const uint16_t *__restrict src, Len n,
                               float factor) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = Codec::narrow(Op::apply(Codec::widen(dst[i]), Codec::widen(src[i]) * factor));
}

template <typename Op, typename Codec, typename Len>
inline void reduceWidenedSpan(float *__restrict dst, const uint16_t *__restrict src, Len n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Op::apply(dst[i], Codec::widen(src[i]));
}

template <typename Op, typename Codec, typename Len>
inline void reduceWidenedScaledSpan(float *__restrict dst, const uint16_t *__restrict src, Len n,
                                    float factor) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Op::apply(dst[i], Codec::widen(src[i]) * factor);
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

// ---- table entries ------------------------------------------------------------------------------
// One function per (shape, dtype, op) with the table's signature; the factor is rounded here
// (float32 for everything but float64).

template <typename Op, typename T>
void reduceLoop(void *dst, const void *src, int64_t n) {
  auto *d = static_cast<T *>(dst);
  const auto *s = static_cast<const T *>(src);
  forEachBlock(n, [=](int64_t at, auto len) { reduceSpan<Op>(d + at, s + at, len); });
}

template <typename Op, typename T>
void reduceScaledLoop(void *dst, const void *src, int64_t n, double factor) {
  auto *d = static_cast<T *>(dst);
  const auto *s = static_cast<const T *>(src);
  const auto f = static_cast<T>(factor);
  forEachBlock(n, [=](int64_t at, auto len) { reduceScaledSpan<Op>(d + at, s + at, len, f); });
}

template <typename Op, typename Codec>
void reduceLoop16(void *dst, const void *src, int64_t n) {
  auto *d = static_cast<uint16_t *>(dst);
  const auto *s = static_cast<const uint16_t *>(src);
  forEachBlock(n, [=](int64_t at, auto len) { reduceSpan16<Op, Codec>(d + at, s + at, len); });
}

template <typename Op, typename Codec>
void reduceScaledLoop16(void *dst, const void *src, int64_t n, double factor) {
  auto *d = static_cast<uint16_t *>(dst);
  const auto *s = static_cast<const uint16_t *>(src);
  const auto f = static_cast<float>(factor);
  forEachBlock(
      n, [=](int64_t at, auto len) { reduceScaledSpan16<Op, Codec>(d + at, s + at, len, f); });
}

template <typename Op, typename Codec>
void reduceWidenedLoop(float *dst, const void *src, int64_t n, double /*factor, 1.0*/) {
  const auto *s = static_cast<const uint16_t *>(src);
  forEachBlock(n,
               [=](int64_t at, auto len) { reduceWidenedSpan<Op, Codec>(dst + at, s + at, len); });
}

template <typename Op, typename Codec>
void reduceWidenedScaledLoop(float *dst, const void *src, int64_t n, double factor) {
  const auto *s = static_cast<const uint16_t *>(src);
  const auto f = static_cast<float>(factor);
  forEachBlock(n, [=](int64_t at, auto len) {
    reduceWidenedScaledSpan<Op, Codec>(dst + at, s + at, len, f);
  });
}

template <typename T>
void scaleLoop(void *buf, int64_t n, double factor) {
  auto *b = static_cast<T *>(buf);
  const auto f = static_cast<T>(factor);
  forEachBlock(n, [=](int64_t at, auto len) { scaleSpan(b + at, len, f); });
}

template <typename Codec>
void scaleLoop16(void *buf, int64_t n, double factor) {
  auto *b = static_cast<uint16_t *>(buf);
  const auto f = static_cast<float>(factor);
  forEachBlock(n, [=](int64_t at, auto len) { scaleSpan16<Codec>(b + at, len, f); });
}

template <typename Codec>
void widenLoop(const void *src, float *dst, int64_t n, double factor) {
  const auto *s = static_cast<const uint16_t *>(src);
  const auto f = static_cast<float>(factor);
  forEachBlock(n, [=](int64_t at, auto len) { widenSpan<Codec>(s + at, dst + at, len, f); });
}

template <typename Codec>
void narrowLoop(const float *src, void *dst, int64_t n, double factor) {
  auto *d = static_cast<uint16_t *>(dst);
  const auto f = static_cast<float>(factor);
  forEachBlock(n, [=](int64_t at, auto len) { narrowSpan<Codec>(src + at, d + at, len, f); });
}

// Fills one table row: make(op) gives the kernel for each op; kAverage shares kSum's.
template <typename Fn, typename Make>
void fillOps(Fn (&row)[kNumReduceOps], Make make) {
  row[static_cast<int>(ReduceOp::kSum)] = make(SumOp());
  row[static_cast<int>(ReduceOp::kAverage)] = make(SumOp());
  row[static_cast<int>(ReduceOp::kMin)] = make(MinOp());
  row[static_cast<int>(ReduceOp::kMax)] = make(MaxOp());
  row[static_cast<int>(ReduceOp::kProduct)] = make(ProductOp());
}

constexpr int slot(DType t) { return static_cast<int>(t); }

template <typename T>
void fillPlain(kernels_detail::KernelTable &k, DType t) {
  fillOps(k.reduce[slot(t)], [](auto op) { return &reduceLoop<decltype(op), T>; });
  if constexpr (std::is_floating_point_v<T>) {
    fillOps(k.reduceScaled[slot(t)], [](auto op) { return &reduceScaledLoop<decltype(op), T>; });
    k.scale[slot(t)] = &scaleLoop<T>;
  }
}

void fillBool(kernels_detail::KernelTable &k) {
  auto &row = k.reduce[slot(DType::kBool)];
  row[static_cast<int>(ReduceOp::kSum)] = &reduceLoop<BoolOrOp, uint8_t>;
  row[static_cast<int>(ReduceOp::kAverage)] = &reduceLoop<BoolOrOp, uint8_t>;
  row[static_cast<int>(ReduceOp::kMax)] = &reduceLoop<BoolOrOp, uint8_t>;
  row[static_cast<int>(ReduceOp::kMin)] = &reduceLoop<BoolAndOp, uint8_t>;
  row[static_cast<int>(ReduceOp::kProduct)] = &reduceLoop<BoolAndOp, uint8_t>;
}

template <typename Codec>
void fill16(kernels_detail::KernelTable &k, DType t) {
  fillOps(k.reduce[slot(t)], [](auto op) { return &reduceLoop16<decltype(op), Codec>; });
  fillOps(k.reduceScaled[slot(t)],
          [](auto op) { return &reduceScaledLoop16<decltype(op), Codec>; });
  fillOps(k.reduceWidened[slot(t)],
          [](auto op) { return &reduceWidenedScaledLoop<decltype(op), Codec>; });
  fillOps(k.reduceWidenedUnscaled[slot(t)],
          [](auto op) { return &reduceWidenedLoop<decltype(op), Codec>; });
  k.scale[slot(t)] = &scaleLoop16<Codec>;
  k.widen[slot(t)] = &widenLoop<Codec>;
  k.narrow[slot(t)] = &narrowLoop<Codec>;
}

// ---- instruction-set choice ---------------------------------------------------------------------

using kernels_detail::Isa;
using kernels_detail::KernelTable;

#if HORA_KERNELS_X86
// CPUID.1:ECX.F16C directly: Clang's __builtin_cpu_supports does not know "f16c". The OS side
// (YMM state) is the one avx2 needs, checked below.
bool cpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

bool cpuRuns(Isa isa) {
#if HORA_KERNELS_X86
  // libgcc's (and compiler-rt's) feature bits already include the OS check (XGETBV): AVX state for
  // avx2, opmask/ZMM state for avx512*.
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && cpuHasF16c();
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2: return avx2;
    case Isa::kAvx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }
  return false;
#else
  return isa == Isa::kScalar;
#endif
}

bool validIsa(Isa isa) { return static_cast<unsigned>(isa) < kernels_detail::kNumIsas; }

struct IsaKernels {
  Isa isa;
  KernelTable table;
};

IsaKernels build(Isa isa) {
  IsaKernels k{isa, {}};
  kernels_detail::fillScalarTable(k.table);
#if HORA_KERNELS_X86
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512) kernels_detail::fillAvx2Table(k.table);
  if (isa == Isa::kAvx512) kernels_detail::fillAvx512Table(k.table);
#endif
  return k;
}

// Built on first use (thread-safe statics); only for an ISA the CPU runs.
const IsaKernels &kernelsFor(Isa isa) {
  switch (isa) {
    case Isa::kAvx2: {
      static const IsaKernels k = build(Isa::kAvx2);
      return k;
    }
    case Isa::kAvx512: {
      static const IsaKernels k = build(Isa::kAvx512);
      return k;
    }
    case Isa::kScalar: break;
  }
  static const IsaKernels k = build(Isa::kScalar);
  return k;
}

Isa pickBest() {
  // AVX-512 wherever the CPU has it: on an AMD EPYC (Zen 4) hora-kernel-bench (bench/) measures it
  // 1.3-2x faster than AVX2 on cache-resident buffers (float16 and bfloat16 1.7-2x) and the same
  // on buffers that stream from L3 or memory.
  if (cpuRuns(Isa::kAvx512)) return Isa::kAvx512;
  if (cpuRuns(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

std::atomic<const IsaKernels *> g_active{nullptr};

const IsaKernels &activeKernels() {
  const IsaKernels *k = g_active.load(std::memory_order_acquire);
  if (k != nullptr) return *k;
  const IsaKernels *best = &kernelsFor(kernels_detail::bestIsa());
  // A concurrent setIsaForTesting wins over the default.
  if (g_active.compare_exchange_strong(k, best, std::memory_order_acq_rel)) return *best;
  return *k;
}

const KernelTable &active() { return activeKernels().table; }

// ---- argument checks ----------------------------------------------------------------------------

bool isSixteenBit(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

void checkOp(const char *fn, ReduceOp op) {
  if (static_cast<unsigned>(op) >= static_cast<unsigned>(kNumReduceOps))
    HORA_THROW(HORA_ERR_INTERNAL, fn, ": invalid reduce op ", static_cast<unsigned>(op));
}

void checkDType(const char *fn, DType t) {
  if (!isValidDType(static_cast<uint8_t>(t))) throwBadDType(fn, t, "unsupported dtype");
}

}  // namespace

// ---- tables -------------------------------------------------------------------------------------

namespace kernels_detail {

// 64 bytes at a time through fixed-size copies (vector moves of the baseline ISA), so that glibc's
// `rep movsb` path is never taken; the tail is shorter than a block.
void copyPortable(void *dst, const void *src, size_t bytes) {
  auto *d = static_cast<unsigned char *>(dst);
  const auto *s = static_cast<const unsigned char *>(src);
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) __builtin_memcpy(d + i, s + i, 64);
  if (i < bytes) std::memcpy(d + i, s + i, bytes - i);
}

// SSE2 (the x86_64 baseline) has a 16-byte non-temporal store; elsewhere a plain copy.
void streamPortable(void *dst, const void *src, size_t bytes) {
#if defined(__SSE2__)
  auto *d = static_cast<unsigned char *>(dst);
  const auto *s = static_cast<const unsigned char *>(src);
  size_t i = (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16;
  if (i > bytes) i = bytes;
  std::memcpy(d, s, i);
  for (; i + 16 <= bytes; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i *>(d + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i)));
  }
  std::memcpy(d + i, s + i, bytes - i);
#else
  copyPortable(dst, src, bytes);
#endif
}

void fillScalarTable(KernelTable &k) {
  k.copy = &copyPortable;
  k.stream = &streamPortable;
  fillPlain<uint8_t>(k, DType::kUInt8);
  fillPlain<int8_t>(k, DType::kInt8);
  fillPlain<int16_t>(k, DType::kInt16);
  fillPlain<int32_t>(k, DType::kInt32);
  fillPlain<int64_t>(k, DType::kInt64);
  fillPlain<float>(k, DType::kFloat32);
  fillPlain<double>(k, DType::kFloat64);
  fill16<HalfCodec>(k, DType::kFloat16);
  fill16<BFloat16Codec>(k, DType::kBFloat16);
  fillBool(k);
}

const char *isaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "invalid";
}

bool isaSupported(Isa isa) { return validIsa(isa) && cpuRuns(isa); }

Isa bestIsa() {
  static const Isa best = pickBest();
  return best;
}

Isa activeIsa() { return activeKernels().isa; }

void setIsaForTesting(Isa isa) {
  if (!isaSupported(isa))
    HORA_THROW(HORA_ERR_INTERNAL, "setIsaForTesting: instruction set ", isaName(isa), " (",
               static_cast<unsigned>(isa), ") not supported here");
  g_active.store(&kernelsFor(isa), std::memory_order_release);
}

}  // namespace kernels_detail

// ---- entry points -------------------------------------------------------------------------------

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
  checkDType("scaleInPlace", dtype);
  // Before the integer check, so that a pipeline that always applies its (default 1.0) scale
  // factors need not special-case integer tensors.
  if (factor == 1.0 || count == 0) return;
  if (!isFloating(dtype)) throwBadDType("scaleInPlace", dtype, "cannot scale an integer dtype");
  active().scale[slot(dtype)](buf, count, factor);
}

void widenToFloat(const void *src, float *dst, int64_t count, DType dtype, double factor) {
  checkCount("widenToFloat", count);
  if (!isSixteenBit(dtype))
    throwBadDType("widenToFloat", dtype, "source must be float16 or bfloat16");
  if (count == 0) return;
  active().widen[slot(dtype)](src, dst, count, factor);
}

void narrowFromFloat(const float *src, void *dst, int64_t count, DType dtype, double factor) {
  checkCount("narrowFromFloat", count);
  if (!isSixteenBit(dtype))
    throwBadDType("narrowFromFloat", dtype, "destination must be float16 or bfloat16");
  if (count == 0) return;
  active().narrow[slot(dtype)](src, dst, count, factor);
}

void reduceInto(void *dst, const void *src, int64_t count, DType dtype, ReduceOp op) {
  checkCount("reduceInto", count);
  checkOp("reduceInto", op);
  checkDType("reduceInto", dtype);
  if (count == 0) return;
  active().reduce[slot(dtype)][static_cast<int>(op)](dst, src, count);
}

void reduceWidenedInto(float *dst, const void *src, int64_t count, DType dtype, ReduceOp op,
                       double factor) {
  checkCount("reduceWidenedInto", count);
  checkOp("reduceWidenedInto", op);
  if (!isSixteenBit(dtype))
    throwBadDType("reduceWidenedInto", dtype, "source must be float16 or bfloat16");
  if (count == 0) return;
  const KernelTable &k = active();
  const auto row = factor == 1.0 ? k.reduceWidenedUnscaled : k.reduceWidened;
  row[slot(dtype)][static_cast<int>(op)](dst, src, count, factor);
}

void normalizeBools(void *dst, const void *src, int64_t count) {
  checkCount("normalizeBools", count);
  auto *d = static_cast<uint8_t *>(dst);
  const auto *s = static_cast<const uint8_t *>(src);
  // No restrict: dst may be src. Byte loads and stores in order, so in place is exact.
  for (int64_t i = 0; i < count; ++i) d[i] = static_cast<uint8_t>(s[i] != 0);
}

void copyBytes(void *dst, const void *src, size_t bytes) {
  if (bytes != 0) active().copy(dst, src, bytes);
}

void streamBytes(void *dst, const void *src, size_t bytes) {
  if (bytes != 0) active().stream(dst, src, bytes);
}

void streamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

void reduceScaledInto(void *dst, const void *src, int64_t count, DType dtype, ReduceOp op,
                      double factor) {
  checkCount("reduceScaledInto", count);
  checkOp("reduceScaledInto", op);
  checkDType("reduceScaledInto", dtype);
  if (count == 0) return;
  const KernelTable &k = active();
  if (factor == 1.0) return k.reduce[slot(dtype)][static_cast<int>(op)](dst, src, count);
  if (!isFloating(dtype)) throwBadDType("reduceScaledInto", dtype, "cannot scale an integer dtype");
  k.reduceScaled[slot(dtype)][static_cast<int>(op)](dst, src, count, factor);
}

}  // namespace hora
