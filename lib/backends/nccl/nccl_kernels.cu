// SPDX-License-Identifier: Apache-2.0
// Device kernels of the NCCL backend: batched packing copies and in-place scaling.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backends/nccl/nccl_kernels.h"

// lib/backends/nccl/meson.build passes the architectures it has nvcc build, in words.
#ifndef HORA_CUDA_ARCHS
#error "HORA_CUDA_ARCHS is not defined: build nccl_kernels.cu through meson (gpu_archs option)"
#endif

namespace hora::nccl_kernels {
namespace {

// Whether `text` names `arch` ("_90" in "sm_90" or "compute_90", not in "sm_900").
constexpr bool mentions(const char *text, int arch) {
  for (const char *c = text; *c != '\0'; ++c) {
    if (*c != '_') continue;
    int n = 0;
    const char *d = c + 1;
    for (; *d >= '0' && *d <= '9'; ++d) n = n * 10 + (*d - '0');
    if (d != c + 1 && n == arch) return true;
  }
  return false;
}
#ifdef __CUDA_ARCH__
// Each device pass checks that the string hora-info prints names the code it is building.
static_assert(mentions(HORA_CUDA_ARCHS, __CUDA_ARCH__ / 10),
              "HORA_CUDA_ARCHS misses an architecture nvcc builds");
#endif

struct Batch {
  CopyItem items[kMaxItemsPerLaunch];
};
static_assert(sizeof(Batch) <= 32000, "kernel arguments are limited to 32 KiB (CUDA 12.1+)");

constexpr int kThreads = 256;

// Whether the host has cancelled this launch: one volatile load (of mapped host memory, over the
// bus) per block, by its first thread. Every thread of the block must call it.
__device__ bool cancelled(const int *cancel) {
  if (cancel == nullptr) return false;
  __shared__ int stop;
  if (threadIdx.x == 0) stop = *static_cast<const volatile int *>(cancel);
  __syncthreads();
  return stop != 0;
}

// The widest word both ends of a copy can be aligned to at once: their distance is a multiple of it.
__host__ __device__ inline int wordFor(const void *src, const void *dst) {
  const uintptr_t distance = reinterpret_cast<uintptr_t>(src) - reinterpret_cast<uintptr_t>(dst);
  for (int w = 16; w > 1; w /= 2) {
    if (distance % w == 0) return w;
  }
  return 1;
}

// Bytes until dst is W-aligned (src is then aligned too), W-sized words grid-stride, then the
// tail. Head and tail are under 16 bytes: the first threads of block 0 copy them.
template <typename W>
__device__ void copyWords(const char *src, char *dst, int64_t bytes, int64_t first, int64_t stride) {
  constexpr int64_t w = sizeof(W);
  const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst) % w);
  const int64_t head = bytes < (w - misaligned) % w ? bytes : (w - misaligned) % w;
  const int64_t words = (bytes - head) / w;
  const int64_t tail = head + words * w;
  if (first < head) dst[first] = src[first];
  const W *s = reinterpret_cast<const W *>(src + head);
  W *d = reinterpret_cast<W *>(dst + head);
  for (int64_t i = first; i < words; i += stride) d[i] = s[i];
  if (first < bytes - tail) dst[tail + first] = src[tail + first];
}

// Block (x, y) copies a stripe of item y. Blocks past the item's words leave at once, without
// reading the cancel flag.
__global__ void __launch_bounds__(kThreads) copyKernel(const __grid_constant__ Batch batch, const int *cancel) {
  const CopyItem item = batch.items[blockIdx.y];
  const int w = wordFor(item.src, item.dst);
  const int64_t words = item.bytes / w;
  if (item.bytes == 0 || static_cast<int64_t>(blockIdx.x) * blockDim.x >= (words > 0 ? words : 1)) return;
  if (cancelled(cancel)) return;
  const char *src = static_cast<const char *>(item.src);
  char *dst = static_cast<char *>(item.dst);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  switch (w) {
    case 16: copyWords<uint4>(src, dst, item.bytes, first, stride); break;
    case 8: copyWords<unsigned long long>(src, dst, item.bytes, first, stride); break;
    case 4: copyWords<unsigned>(src, dst, item.bytes, first, stride); break;
    case 2: copyWords<unsigned short>(src, dst, item.bytes, first, stride); break;
    default: copyWords<unsigned char>(src, dst, item.bytes, first, stride);
  }
}

__global__ void snapshotKernel(const int *hostFlag, int *mirror) {
  *mirror = *static_cast<const volatile int *>(hostFlag);
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
__global__ void __launch_bounds__(kThreads) scaleKernel(T *buf, int64_t count, float factor,
                                                        const int *cancel) {
  if (cancelled(cancel)) return;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    buf[i] = fromFloat<T>(toFloat(buf[i]) * factor);
  }
}

__global__ void __launch_bounds__(kThreads) scaleKernel64(double *buf, int64_t count, double factor,
                                                          const int *cancel) {
  if (cancelled(cancel)) return;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    buf[i] *= factor;
  }
}

unsigned blocksFor(int64_t work) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(1024, (work + kThreads - 1) / kThreads)));
}

// A launch reports its failure only through the thread's error slot (cudaGetLastError), which
// also keeps whatever an earlier runtime call left there and nobody collected: a cudaEventQuery
// that answered cudaErrorNotReady, for one. Emptying the slot just before the launch and reading
// it just after pins the code on this launch, not on a stale non-error from elsewhere. (A sticky
// error, a device fault, cannot be emptied: the launch then fails with it, which is its cause.)
void forgetStaleError() { (void)cudaGetLastError(); }

struct DeviceFacts {
  cudaError_t err = cudaSuccess;
  std::string name;
  std::string arch;  // "sm_90"
};

DeviceFacts factsOf(int device) {
  DeviceFacts f;
  cudaDeviceProp p;
  f.err = cudaGetDeviceProperties(&p, device);
  if (f.err == cudaSuccess) {
    f.name = p.name;
    f.arch = "sm_" + std::to_string(p.major * 10 + p.minor);
  }
  (void)cudaGetLastError();
  return f;
}

std::string cudaWords(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

}  // namespace

int batchedCopy(const std::vector<CopyItem> &items, const int *cancel, void *stream) {
  for (size_t at = 0; at < items.size(); at += kMaxItemsPerLaunch) {
    const size_t n = std::min<size_t>(kMaxItemsPerLaunch, items.size() - at);
    Batch batch;
    int64_t words = 0;  // of the item with the most: the grid's width
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      const CopyItem &item = items[at + i];
      batch.items[i] = item;
      any = any || item.bytes > 0;
      words = std::max(words, item.bytes / wordFor(item.src, item.dst));
    }
    if (!any) continue;
    const dim3 grid(blocksFor(words), static_cast<unsigned>(n));
    forgetStaleError();
    copyKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(batch, cancel);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  return 0;
}

int snapshotCancel(const int *hostFlag, int *mirror, void *stream) {
  forgetStaleError();
  snapshotKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(hostFlag, mirror);
  return static_cast<int>(cudaGetLastError());
}

int scale(void *buf, int64_t count, DType dtype, double factor, const int *cancel, void *stream) {
  if (count == 0 || factor == 1.0) return 0;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = blocksFor(count);
  const float f = static_cast<float>(factor);
  forgetStaleError();
  switch (dtype) {
    case DType::kFloat16:
      scaleKernel<<<blocks, kThreads, 0, s>>>(static_cast<__half *>(buf), count, f, cancel);
      break;
    case DType::kBFloat16:
      scaleKernel<<<blocks, kThreads, 0, s>>>(static_cast<__nv_bfloat16 *>(buf), count, f, cancel);
      break;
    case DType::kFloat32:
      scaleKernel<<<blocks, kThreads, 0, s>>>(static_cast<float *>(buf), count, f, cancel);
      break;
    case DType::kFloat64:
      scaleKernel64<<<blocks, kThreads, 0, s>>>(static_cast<double *>(buf), count, factor, cancel);
      break;
    default: return static_cast<int>(cudaErrorInvalidValue);  // integers are never scaled
  }
  return static_cast<int>(cudaGetLastError());
}

const char *builtArchitectures() { return HORA_CUDA_ARCHS; }

std::string deviceDescription(int device) {
  const DeviceFacts f = factsOf(device);
  if (f.err != cudaSuccess) return "unknown device (" + cudaWords(f.err) + ")";
  return f.name + ", " + f.arch;
}

// cudaFuncGetAttributes loads the copy kernel for the current device, as a launch would: from
// its SASS, or by having the driver compile the PTX. It answers for the current device only, so
// the device is switched for the question and back after.
std::string kernelsRunOn(int device) {
  const std::string who = "cuda:" + std::to_string(device);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return who + ": no CUDA device (" + cudaWords(err) + ")";
  }
  if (device < 0 || device >= count) {
    return who + " does not exist (" + std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s") +
           " visible)";
  }
  const DeviceFacts facts = factsOf(device);
  if (facts.err != cudaSuccess) return who + ": cannot be asked (" + cudaWords(facts.err) + ")";
  int current = -1;
  bool switched = false;
  err = cudaGetDevice(&current);
  if (err == cudaSuccess && current != device) {
    err = cudaSetDevice(device);
    switched = err == cudaSuccess;
  }
  cudaFuncAttributes attr;
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&attr, copyKernel);
  if (switched) cudaSetDevice(current);
  (void)cudaGetLastError();
  if (err == cudaSuccess) return "";
  const std::string is = who + " is " + facts.arch + " (" + facts.name + ")";
  if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction) {
    return is + "; this build has code for " + builtArchitectures() + " (" + cudaGetErrorName(err) +
           "; meson's gpu_archs option chooses them)";
  }
  return is + "; its kernels did not load (" + cudaWords(err) + ")";
}

}  // namespace hora::nccl_kernels
