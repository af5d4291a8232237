// SPDX-License-Identifier: Apache-2.0
// Internal to core/kernels*.cpp: the table of kernel implementations for one instruction set.
// kernels.cpp validates arguments and calls through the table of the active instruction set;
// kernels_x86.cpp fills the AVX2 and AVX-512 tables.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "core/kernels.h"

namespace hora {
namespace kernels_detail {

// Arguments are already checked: count > 0, pointers valid, dtype and op supported by the slot.
// Ops are indexed by ReduceOp (kAverage holds the kSum kernel). Factors stay double here; each
// kernel rounds it as its dtype says.
struct KernelTable {
  using Reduce = void (*)(void *dst, const void *src, int64_t n);
  using ReduceScaled = void (*)(void *dst, const void *src, int64_t n, double factor);
  using ReduceWidened = void (*)(float *dst, const void *src, int64_t n, double factor);
  using Scale = void (*)(void *buf, int64_t n, double factor);
  using Widen = void (*)(const void *src, float *dst, int64_t n, double factor);
  using Narrow = void (*)(const float *src, void *dst, int64_t n, double factor);
  using Copy = void (*)(void *dst, const void *src, size_t bytes);

  Reduce reduce[kNumDTypes][kNumReduceOps] = {};
  ReduceScaled reduceScaled[kNumDTypes][kNumReduceOps] = {};    // floating dtypes only
  ReduceWidened reduceWidened[kNumDTypes][kNumReduceOps] = {};  // float16, bfloat16 only
  ReduceWidened reduceWidenedUnscaled[kNumDTypes][kNumReduceOps] = {};
  Scale scale[kNumDTypes] = {};    // floating dtypes only
  Widen widen[kNumDTypes] = {};    // float16, bfloat16 only
  Narrow narrow[kNumDTypes] = {};  // float16, bfloat16 only
  Copy copy = nullptr;             // bytes > 0
  Copy stream = nullptr;           // bytes > 0, non-temporal stores
};

// The portable table, complete (kernels.cpp).
void fillScalarTable(KernelTable &table);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HORA_KERNELS_X86 1
// kernels_x86.cpp: overwrite the slots that instruction set does better; the caller starts from a
// complete table. Call only where the CPU supports it.
void fillAvx2Table(KernelTable &table);
void fillAvx512Table(KernelTable &table);
#else
#define HORA_KERNELS_X86 0
#endif

}  // namespace kernels_detail
}  // namespace hora
