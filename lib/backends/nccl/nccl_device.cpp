// SPDX-License-Identifier: Apache-2.0
// The CUDA runtime calls of the NCCL backend and of the C API's CUDA submissions.
#include "backends/nccl/nccl_device.h"

#include <cuda_runtime_api.h>

#include "base/error.h"

namespace hora::nccl_device {

void check(int err, const char *what) {
  if (err != cudaSuccess) {
    const auto e = static_cast<cudaError_t>(err);
    HORA_THROW(HORA_ERR_BACKEND, what, ": CUDA error ", cudaGetErrorName(e), " (",
               cudaGetErrorString(e), ")");
  }
}

int deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return n;
}

std::string whyNoDevice() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();
  if (err != cudaSuccess) return std::string(cudaGetErrorString(err));
  return n == 0 ? "no CUDA device is visible" : "";
}

void setDevice(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }

Buffer::Buffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
  setDevice(device);
  if (bytes > 0) check(cudaMalloc(&data_, bytes), "cudaMalloc");
}

// No cudaSetDevice: cudaFree does not need the device current, and the thread that drops the
// last reference (a user's, for an output hora allocated) keeps its own.
Buffer::~Buffer() {
  if (data_ != nullptr) cudaFree(data_);
}

void Buffer::upload(const void *host, size_t bytes, size_t offset) {
  HORA_ENFORCE(offset + bytes <= bytes_, "upload of ", bytes, " bytes at ", offset, " into ", bytes_);
  setDevice(device_);
  check(cudaMemcpy(static_cast<char *>(data_) + offset, host, bytes, cudaMemcpyHostToDevice),
        "cudaMemcpy to the device");
  // From pageable memory cudaMemcpy may return before the data has landed; work on a
  // non-blocking stream would not wait for it.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after an upload");
}

void Buffer::download(void *host, size_t bytes, size_t offset) const {
  HORA_ENFORCE(offset + bytes <= bytes_, "download of ", bytes, " bytes at ", offset, " from ", bytes_);
  cudaSetDevice(device_);
  check(cudaMemcpy(host, static_cast<const char *>(data_) + offset, bytes, cudaMemcpyDeviceToHost),
        "cudaMemcpy from the device");
}

Stream::Stream(int device) : device_(device) {
  setDevice(device);
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  stream_ = s;
}

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void Stream::waitFor(void *event) {
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(event), 0),
        "cudaStreamWaitEvent");
}

void Stream::synchronize() {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize");
}

std::shared_ptr<void> recordEvent(int device, void *stream) {
  int previous = 0;
  check(cudaGetDevice(&previous), "cudaGetDevice");
  if (previous != device) setDevice(device);
  cudaEvent_t event = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (err == cudaSuccess) {
    err = cudaEventRecord(event, stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) cudaEventDestroy(event);
  }
  // The caller's thread keeps its device; restored only when changed, since setting a device
  // creates its context.
  if (previous != device) cudaSetDevice(previous);
  check(err, "recording the caller's stream");
  return std::shared_ptr<void>(event, [](void *e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
}

bool eventDone(void *event) {
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaErrorNotReady) return false;
  check(err, "cudaEventQuery");
  return true;
}

}  // namespace hora::nccl_device
