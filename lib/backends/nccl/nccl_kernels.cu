// SPDX-License-Identifier: Apache-2.0
// Device kernels of the NCCL backend: batched packing copies and in-place scaling.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backends/nccl/nccl_kernels.h"

namespace hora::nccl_kernels {
namespace {

struct Batch {
  CopyItem items[kMaxItemsPerLaunch];
};
static_assert(sizeof(Batch) <= 32000, "kernel arguments are limited to 32 KiB (CUDA 12.1+)");

constexpr int kThreads = 256;

// Block (x, y) copies a stripe of item y: 16-byte words when source and destination allow it,
// bytes otherwise (and for the tail).
__global__ void copyKernel(const __grid_constant__ Batch batch) {
  const CopyItem item = batch.items[blockIdx.y];
  const char *src = static_cast<const char *>(item.src);
  char *dst = static_cast<char *>(item.dst);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
    const int64_t words = item.bytes / 16;
    const uint4 *s = reinterpret_cast<const uint4 *>(src);
    uint4 *d = reinterpret_cast<uint4 *>(dst);
    for (int64_t i = first; i < words; i += stride) d[i] = s[i];
    done = words * 16;
  }
  for (int64_t i = done + first; i < item.bytes; i += stride) dst[i] = src[i];
}

template <typename T>
__device__ inline float toFloat(T v) { return static_cast<float>(v); }
template <typename T>
__device__ inline T fromFloat(float v) { return static_cast<T>(v); }
template <>
__device__ inline __half fromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ inline __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__global__ void scaleKernel(T *buf, int64_t count, float factor) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    buf[i] = fromFloat<T>(toFloat(buf[i]) * factor);
  }
}

__global__ void scaleKernel64(double *buf, int64_t count, double factor) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    buf[i] *= factor;
  }
}

unsigned blocksFor(int64_t work) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(1024, (work + kThreads - 1) / kThreads)));
}

}  // namespace

int batchedCopy(const std::vector<CopyItem> &items, void *stream) {
  cudaError_t err = cudaSuccess;
  for (size_t at = 0; at < items.size(); at += kMaxItemsPerLaunch) {
    const size_t n = std::min<size_t>(kMaxItemsPerLaunch, items.size() - at);
    Batch batch;
    int64_t largest = 0;
    for (size_t i = 0; i < n; ++i) {
      batch.items[i] = items[at + i];
      largest = std::max(largest, items[at + i].bytes);
    }
    if (largest == 0) continue;
    const dim3 grid(blocksFor(largest / 16 + 1), static_cast<unsigned>(n));
    copyKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(batch);
    err = cudaGetLastError();
    if (err != cudaSuccess) break;
  }
  return static_cast<int>(err);
}

int scale(void *buf, int64_t count, DType dtype, double factor, void *stream) {
  if (count == 0 || factor == 1.0) return 0;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = blocksFor(count);
  switch (dtype) {
    case DType::kFloat16:
      scaleKernel<<<blocks, kThreads, 0, s>>>(static_cast<__half *>(buf), count, static_cast<float>(factor));
      break;
    case DType::kBFloat16:
      scaleKernel<<<blocks, kThreads, 0, s>>>(static_cast<__nv_bfloat16 *>(buf), count, static_cast<float>(factor));
      break;
    case DType::kFloat32:
      scaleKernel<<<blocks, kThreads, 0, s>>>(static_cast<float *>(buf), count, static_cast<float>(factor));
      break;
    case DType::kFloat64:
      scaleKernel64<<<blocks, kThreads, 0, s>>>(static_cast<double *>(buf), count, factor);
      break;
    default: return static_cast<int>(cudaErrorInvalidValue);  // integers are never scaled
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace hora::nccl_kernels
