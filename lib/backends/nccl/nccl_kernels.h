// SPDX-License-Identifier: Apache-2.0
// The NCCL backend's device kernels (nccl_kernels.cu, built by nvcc), declared without CUDA
// headers: a stream is a cudaStream_t passed as void *.
#pragma once

#include <cstdint>
#include <vector>

#include "base/dtype.h"

namespace hora::nccl_kernels {

struct CopyItem {
  const void *src;
  void *dst;
  int64_t bytes;
};

// Every item's bytes copied on `stream` in one kernel launch per kMaxItemsPerLaunch items (the
// descriptors travel as the launch's arguments): packing a fused response of many small tensors
// costs a launch or two, not a cudaMemcpyAsync per tensor. Items must not overlap. Returns the
// cudaError_t of the last launch (0 = success).
constexpr int kMaxItemsPerLaunch = 512;
int batchedCopy(const std::vector<CopyItem> &items, void *stream);

// buf[i] *= factor for `count` elements of a floating dtype on `stream`: float64 in float64,
// the others in float32 (float16 and bfloat16 rounded once to nearest even). Returns the
// cudaError_t of the launch.
int scale(void *buf, int64_t count, DType dtype, double factor, void *stream);

}  // namespace hora::nccl_kernels
