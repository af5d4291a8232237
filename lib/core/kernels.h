// SPDX-License-Identifier: Apache-2.0
// CPU element kernels: scaling, float16/bfloat16 widening and narrowing, pairwise reduction.
// Plain loops over restrict pointers that GCC auto-vectorises at -O2/-O3.
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace hora {

enum class ReduceOp : uint8_t { kSum = 0, kAverage = 1, kMin = 2, kMax = 3, kProduct = 4 };
constexpr int kNumReduceOps = 5;
const char *reduceOpName(ReduceOp op);  // "sum", "average", ...

// Source and destination never overlap (restrict); a negative count or an invalid dtype/op
// throws Error(HORA_ERR_INTERNAL): callers validate first.

// buf[i] *= factor for `count` elements of a floating dtype: float64 in float64; float32,
// float16 and bfloat16 in float32 (the factor rounded to float32). factor == 1.0 returns at once
// for every dtype; any other factor on an integer dtype throws (the C API refuses it earlier
// with HORA_ERR_UNSUPPORTED).
void scaleInPlace(void *buf, int64_t count, DType dtype, double factor);

// dst[i] = float(src[i]) * factor, src float16 or bfloat16.
void widenToFloat(const void *src, float *dst, int64_t count, DType dtype, double factor);
// dst[i] = narrow(src[i] * factor), dst float16 or bfloat16 (round to nearest even).
void narrowFromFloat(const float *src, void *dst, int64_t count, DType dtype, double factor);

// dst[i] = dst[i] op src[i]. kAverage reduces as kSum (the caller divides). float16/bfloat16
// compute in float32 and round once per element.
void reduceInto(void *dst, const void *src, int64_t count, DType dtype, ReduceOp op);

}  // namespace hora
