// SPDX-License-Identifier: Apache-2.0
// CPU element kernels: scaling, float16/bfloat16 widening and narrowing, pairwise reduction.
// Each entry point validates its arguments and calls the implementation for the best instruction
// set this CPU has, picked once per process (see kernels_detail below): AVX-512 or AVX2 with F16C
// on x86_64, else portable loops that GCC auto-vectorises for the baseline ISA. Every
// implementation gives the same bits as the portable one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace hora {

enum class ReduceOp : uint8_t { kSum = 0, kAverage = 1, kMin = 2, kMax = 3, kProduct = 4 };
constexpr int kNumReduceOps = 5;
const char *reduceOpName(ReduceOp op);  // "sum", "average", ...

// Source and destination never overlap (restrict); a negative count or an invalid dtype/op
// throws Error(HORA_ERR_INTERNAL): callers validate first.
//
// Floating-point results are the same bits on every instruction set. float16 and bfloat16 compute
// in float32 and round once per element to nearest even, exactly as floatToHalf / floatToBfloat16
// in base/dtype.h (NaN stays a quiet NaN with the top of its payload, overflow goes to infinity);
// widening is exact and quiets a float16 NaN as halfToFloat does. Float min/max keep a NaN from
// either operand: with a = dst[i] and b the src value, min is a when a is NaN or a < b, else b
// (so a NaN in dst stays, a NaN in src is taken, and on ties, -0 against +0 included, src wins);
// max likewise with a > b. The one exception to identical bits: where both operands of a sum or
// product are NaN, which of the two (quieted) comes out is the compiler's and hardware's choice.
// No multiply is ever fused with the add after it.

// buf[i] *= factor for `count` elements of a floating dtype: float64 in float64; float32,
// float16 and bfloat16 in float32 (the factor rounded to float32). factor == 1.0 returns at once
// for every dtype; any other factor on an integer dtype throws (the C API refuses it earlier
// with HORA_ERR_UNSUPPORTED).
void scaleInPlace(void *buf, int64_t count, DType dtype, double factor);

// dst[i] = float(src[i]) * factor, src float16 or bfloat16 (the factor rounded to float32; the
// multiply is done even for factor 1.0).
void widenToFloat(const void *src, float *dst, int64_t count, DType dtype, double factor);
// dst[i] = narrow(src[i] * factor), dst float16 or bfloat16 (round to nearest even).
void narrowFromFloat(const float *src, void *dst, int64_t count, DType dtype, double factor);

// dst[i] = dst[i] op src[i]. kAverage reduces as kSum (the caller divides). float16/bfloat16
// compute in float32 and round once per element. bool: kSum and kMax are logical OR, kMin and
// kProduct logical AND (kAverage: OR, as kSum; the C API refuses it); a nonzero byte in either
// operand reads as true and every result is 0 or 1.
void reduceInto(void *dst, const void *src, int64_t count, DType dtype, ReduceOp op);

// dst[i] = dst[i] op (float(src[i]) * factor): a float32 accumulator takes a float16 or bfloat16
// source without a rounding step in between (the factor rounded to float32). factor == 1.0 skips
// the multiply: dst[i] = dst[i] op float(src[i]). kAverage reduces as kSum.
void reduceWidenedInto(float *dst, const void *src, int64_t count, DType dtype, ReduceOp op,
                       double factor);

// dst[i] = dst[i] op (src[i] * factor): the product in float64 for float64, in float32 for
// float32 (the factor rounded to float32), and for float16/bfloat16 in float32 with one rounding
// at the end: narrow(float(dst[i]) op (float(src[i]) * factor)). factor == 1.0 is reduceInto,
// for every dtype; any other factor on an integer dtype throws, as scaleInPlace does. kAverage
// reduces as kSum.
void reduceScaledInto(void *dst, const void *src, int64_t count, DType dtype, ReduceOp op,
                      double factor);

// dst[i] = (src[i] != 0) for `count` bool bytes; dst may be src. A backend whose transport
// reduces bool as uint8 (MPI_MAX / MPI_MIN, ncclMax / ncclMin) gets the right truth values from
// any bytes, but only 0/1 inputs keep the results 0 or 1: it normalizes its input first.
void normalizeBools(void *dst, const void *src, int64_t count);

// memcpy for buffers that do not overlap, by vector loads and stores, never `rep movsb`. glibc
// 2.36's memcpy copies blocks above a few KiB with `rep movsb`, which on the AMD EPYC (Zen 4) of
// this machine class runs at 3.5 GB/s instead of 35-48 GB/s whenever dst - src is 1..15 bytes
// modulo 4096 (measured; a 4K-aliasing stall on every line). Tensors packed end to end meet that
// relative alignment by chance, so every bulk copy of the data path goes through here.
void copyBytes(void *dst, const void *src, size_t bytes);
// copyBytes with non-temporal stores: the bytes go to memory, not into this core's caches, so a
// reader on a core that shares no cache with this one reads them from memory rather than from
// this core's cache. The stores are weakly ordered: call streamFence() before publishing them.
void streamBytes(void *dst, const void *src, size_t bytes);
void streamFence();

// ---- instruction-set selection (tests and benchmarks) ------------------------------------------
namespace kernels_detail {

// kScalar: the portable loops (still auto-vectorised for the compiler's baseline, SSE2 on x86_64).
// kAvx2: AVX2 + F16C. kAvx512: AVX-512 F/BW/DQ/VL (with AVX2 + F16C). Only x86_64 GCC/Clang builds
// have the vector ones.
enum class Isa : uint8_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
constexpr int kNumIsas = 3;

const char *isaName(Isa isa);  // "scalar", "avx2", "avx512"
bool isaSupported(Isa isa);    // built in, and this CPU (and OS) runs it
Isa bestIsa();                 // what the kernels use unless told otherwise
Isa activeIsa();

// Switches every kernel of the process to `isa` (bestIsa() to go back); throws
// Error(HORA_ERR_INTERNAL) when !isaSupported(isa). For tests and benchmarks: calls already
// running in other threads finish on the old implementation.
void setIsaForTesting(Isa isa);

}  // namespace kernels_detail
}  // namespace hora
