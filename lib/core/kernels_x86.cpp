// SPDX-License-Identifier: Apache-2.0
// The AVX2 and AVX-512 kernels: one traits struct V per instruction set, each in a region compiled
// for that set only, with the loops of kernels_x86.inc included after it. kernels.cpp calls
// fillAvx2Table / fillAvx512Table only on a CPU that runs them, so the rest of the library keeps
// to the baseline ISA and runs on any x86_64.
//
// float16 uses F16C (vcvtph2ps, vcvtps2ph with immediate rounding to nearest even): on every input
// these give the bits of halfToFloat / floatToHalf, NaN payloads, the quiet bit, subnormals and
// overflow included, whatever MXCSR says (rounding mode, FTZ, DAZ). bfloat16 widens by a shift and
// narrows with integer arithmetic, as floatToBfloat16 does; where every operand is bfloat16 the
// values are split into even- and odd-indexed ones, which needs no shuffle at all. (AVX512_BF16's
// vcvtneps2bf16 is not used: it flushes float subnormals to zero.)
#include "core/kernels_isa.h"

#if HORA_KERNELS_X86

// GCC 12 warns that the _mm512_undefined_* placeholders inside the AVX-512 intrinsics (min, max,
// srli, cvtps_ph, ...) are (maybe) used uninitialized once inlined (GCC bug 105593, fixed in GCC
// 13). The warning is placed in the intrinsic headers, so it is silenced from before their include.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

// No multiply may fuse with the add after it: the portable kernels never fuse, and AVX-512 alone
// lets GCC contract _mm512_mul_ps + _mm512_add_ps into vfmadd.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

namespace hora {
namespace kernels_detail {
namespace {

// ---- AVX2 + F16C --------------------------------------------------------------------------------

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif

namespace avx2 {

struct V {
  using F = __m256;
  using D = __m256d;
  static constexpr int kF = 8;
  static constexpr int kD = 4;

  static F load(const float *p) { return _mm256_loadu_ps(p); }
  static D load(const double *p) { return _mm256_loadu_pd(p); }
  static void store(float *p, F v) { _mm256_storeu_ps(p, v); }
  static void stream(float *p, F v) { _mm256_stream_ps(p, v); }  // p 32-byte aligned
  static void store(double *p, D v) { _mm256_storeu_pd(p, v); }
  static F splat(float x) { return _mm256_set1_ps(x); }
  static D splat(double x) { return _mm256_set1_pd(x); }

  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static D add(D a, D b) { return _mm256_add_pd(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static D mul(D a, D b) { return _mm256_mul_pd(a, b); }
  // minps/maxps give b when either is NaN; put a back where a is NaN.
  static F min(F a, F b) {
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static D min(D a, D b) {
    return _mm256_blendv_pd(_mm256_min_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
  static F max(F a, F b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static D max(D a, D b) {
    return _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }

  static F loadHalf(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
  }
  static void storeHalf(uint16_t *p, F v) {
    // Immediate 0: round to nearest even, whatever MXCSR's rounding mode.
    _mm_storeu_si128(reinterpret_cast<__m128i *>(p), _mm256_cvtps_ph(v, 0));
  }
  // bfloat16 -> float32 is a 16-bit shift; natural order via a zero extension.
  static F loadBf16(const uint16_t *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // 16 values as two vectors without any shuffle: the even-indexed ones shifted up into the top
  // half of their 32-bit lane, and the odd-indexed ones, already there, with the even ones masked
  // off. storeBf16EvenOdd puts them back.
  static void loadBf16EvenOdd(const uint16_t *p, F &even, F &odd) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    odd =
        _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  // floatToBfloat16 in each 32-bit lane, the result in the top 16 bits: anything but NaN adds
  // 0x7fff + lsb and truncates (round to nearest even, carries reaching infinity), and a NaN keeps
  // its top bits and gets the quiet bit. No shifts: AMD runs those on two pipes only, next to the
  // shuffles. The NaN fix-up is skipped for the (usual) pair of vectors without any NaN.
  static __m256i bf16RoundedNoNan(__m256i x) {
    const __m256i lsbBit = _mm256_set1_epi32(0x10000);
    const __m256i lsbSet = _mm256_cmpeq_epi32(_mm256_and_si256(x, lsbBit), lsbBit);  // -1 or 0
    return _mm256_sub_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsbSet);
  }
  static __m256i bf16Rounded(F v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
    return _mm256_blendv_epi8(bf16RoundedNoNan(x), quiet, nan);
  }
  static bool anyNan(F a, F b) {
    return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q)) != 0;
  }
  static void roundPair(F a, F b, __m256i &ra, __m256i &rb) {
    if (anyNan(a, b)) {
      ra = bf16Rounded(a);
      rb = bf16Rounded(b);
    } else {
      ra = bf16RoundedNoNan(_mm256_castps_si256(a));
      rb = bf16RoundedNoNan(_mm256_castps_si256(b));
    }
  }
  static void storeBf16EvenOdd(uint16_t *p, F even, F odd) {
    __m256i e, o;
    roundPair(even, odd, e, o);
    const __m256i high = _mm256_and_si256(o, _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(p),
                        _mm256_or_si256(_mm256_srli_epi32(e, 16), high));
  }
  // 16 values in memory order from lo (0-7) and hi (8-15): packus interleaves 4-value groups as
  // lo0 hi0 lo1 hi1; the permute puts them back as lo0 lo1 hi0 hi1.
  static void storeBf16(uint16_t *p, F lo, F hi) {
    __m256i l, h;
    roundPair(lo, hi, l, h);
    const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(l, 16), _mm256_srli_epi32(h, 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(p), _mm256_permute4x64_epi64(packed, 0xd8));
  }
};

#include "core/kernels_x86.inc"

}  // namespace avx2

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

// ---- AVX-512 (F, BW, DQ, VL) --------------------------------------------------------------------

// prefer-vector-width=512: GCC's generic tuning would auto-vectorise the integer loops with 256-bit
// vectors only. (Clang does not take it in a target attribute.)
#if defined(__clang__)
#pragma clang attribute push( \
    __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512dq,avx512vl"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c,avx512f,avx512bw,avx512dq,avx512vl,prefer-vector-width=512")
#endif

namespace avx512 {

struct V {
  using F = __m512;
  using D = __m512d;
  static constexpr int kF = 16;
  static constexpr int kD = 8;

  static F load(const float *p) { return _mm512_loadu_ps(p); }
  static D load(const double *p) { return _mm512_loadu_pd(p); }
  static void store(float *p, F v) { _mm512_storeu_ps(p, v); }
  static void stream(float *p, F v) { _mm512_stream_ps(p, v); }  // p 64-byte aligned
  static void store(double *p, D v) { _mm512_storeu_pd(p, v); }
  static F splat(float x) { return _mm512_set1_ps(x); }
  static D splat(double x) { return _mm512_set1_pd(x); }

  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static D add(D a, D b) { return _mm512_add_pd(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static D mul(D a, D b) { return _mm512_mul_pd(a, b); }
  // As in AVX2: the minps/maxps choice, then a wherever a is NaN.
  static F min(F a, F b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_min_ps(a, b), a);
  }
  static D min(D a, D b) {
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), _mm512_min_pd(a, b), a);
  }
  static F max(F a, F b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_max_ps(a, b), a);
  }
  static D max(D a, D b) {
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), _mm512_max_pd(a, b), a);
  }

  static F loadHalf(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
  }
  static void storeHalf(uint16_t *p, F v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(p), _mm512_cvtps_ph(v, 0));
  }
  static F loadBf16(const uint16_t *p) {
    const __m512i w =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  // As in AVX2: even-indexed values shifted up, odd-indexed ones masked.
  static void loadBf16EvenOdd(const uint16_t *p, F &even, F &odd) {
    const __m512i x = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    odd =
        _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static __m512i bf16RoundedNoNan(__m512i x) {
    const __mmask16 lsbSet = _mm512_test_epi32_mask(x, _mm512_set1_epi32(0x10000));
    const __m512i biased = _mm512_add_epi32(x, _mm512_set1_epi32(0x7fff));
    return _mm512_mask_add_epi32(biased, lsbSet, biased, _mm512_set1_epi32(1));
  }
  static __m512i bf16Rounded(F v) {
    const __m512i x = _mm512_castps_si512(v);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_or_epi32(bf16RoundedNoNan(x), nan, x, _mm512_set1_epi32(0x00400000));
  }
  static bool anyNan(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) != 0; }
  static void roundPair(F a, F b, __m512i &ra, __m512i &rb) {
    if (anyNan(a, b)) {
      ra = bf16Rounded(a);
      rb = bf16Rounded(b);
    } else {
      ra = bf16RoundedNoNan(_mm512_castps_si512(a));
      rb = bf16RoundedNoNan(_mm512_castps_si512(b));
    }
  }
  static void storeBf16EvenOdd(uint16_t *p, F even, F odd) {
    __m512i e, o;
    roundPair(even, odd, e, o);
    // The odd values' top halves over the even values' low ones: 16-bit lanes 1, 3, 5, ...
    _mm512_storeu_si512(p, _mm512_mask_mov_epi16(_mm512_srli_epi32(e, 16), 0xaaaaaaaau, o));
  }
  // packus gives 4-value groups lo0 hi0 lo1 hi1 lo2 hi2 lo3 hi3; reorder the 64-bit groups.
  static void storeBf16(uint16_t *p, F lo, F hi) {
    __m512i l, h;
    roundPair(lo, hi, l, h);
    const __m512i packed = _mm512_packus_epi32(_mm512_srli_epi32(l, 16), _mm512_srli_epi32(h, 16));
    const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    _mm512_storeu_si512(p, _mm512_permutexvar_epi64(order, packed));
  }
};

#include "core/kernels_x86.inc"

}  // namespace avx512

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

}  // namespace

void fillAvx2Table(KernelTable &table) { avx2::fillTable(table); }
void fillAvx512Table(KernelTable &table) { avx512::fillTable(table); }

}  // namespace kernels_detail
}  // namespace hora

#endif  // HORA_KERNELS_X86
