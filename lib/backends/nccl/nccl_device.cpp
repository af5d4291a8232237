// SPDX-License-Identifier: Apache-2.0
// The CUDA runtime calls of the NCCL backend and of the C API's CUDA submissions.
#include "backends/nccl/nccl_device.h"

#include <cuda_runtime_api.h>
#if __has_include(<cuda.h>)
#include <cuda.h>  // the driver's types only: its calls are reached through the runtime
#endif

#include "backends/nccl/cuda_errors.h"
#include "base/error.h"

namespace hora::nccl_device {
namespace {

int lastError() { return static_cast<int>(cudaGetLastError()); }

#if __has_include(<cuda.h>)
using DriverContext = CUcontext;
using DriverResult = CUresult;
constexpr DriverResult kDriverSuccess = CUDA_SUCCESS;
#else
using DriverContext = struct CUctx_st *;
using DriverResult = int;
constexpr DriverResult kDriverSuccess = 0;
#endif

// The driver's cuCtxGetCurrent and cuCtxSetCurrent, found through the runtime so that hora does
// not link libcuda itself; both null when the runtime cannot give them (CUDA before 12.5, or no
// driver), and then recordEvent falls back to restoring a device.
struct ContextCalls {
  DriverResult (*getCurrent)(DriverContext *) = nullptr;
  DriverResult (*setCurrent)(DriverContext) = nullptr;
};

const ContextCalls &contextCalls() {
  static const ContextCalls calls = [] {
    ContextCalls c;
#if CUDART_VERSION >= 12050
    void *get = nullptr;
    void *set = nullptr;
    cudaDriverEntryPointQueryResult getFound = cudaDriverEntryPointSymbolNotFound;
    cudaDriverEntryPointQueryResult setFound = cudaDriverEntryPointSymbolNotFound;
    // 4000: both calls as CUDA 4.0 introduced them (cudaTypedefs.h's PFN_cuCtx*Current_v4000).
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &getFound) ==
            cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 4000, cudaEnableDefault, &setFound) ==
            cudaSuccess &&
        getFound == cudaDriverEntryPointSuccess && setFound == cudaDriverEntryPointSuccess &&
        get != nullptr && set != nullptr) {
      c.getCurrent = reinterpret_cast<DriverResult (*)(DriverContext *)>(get);
      c.setCurrent = reinterpret_cast<DriverResult (*)(DriverContext)>(set);
    }
    cudaGetLastError();  // no driver: not the next launch's failure
#endif
    return c;
  }();
  return calls;
}

// The calling thread's CUDA context (its device too, which the fallback restores where the
// driver's context calls are missing), and how to put it back exactly (none stays none).
struct ThreadContext {
  DriverContext context = nullptr;
  bool haveContext = false;  // the driver's calls gave `context` (nullptr: none current)
  int device = -1;           // cudaGetDevice's (which creates no context); -1 where it failed
  int deviceError = cudaSuccess;

  static ThreadContext current() noexcept {
    ThreadContext c;
    const ContextCalls &calls = contextCalls();
    c.haveContext = calls.getCurrent != nullptr && calls.getCurrent(&c.context) == kDriverSuccess;
    c.deviceError = cudaGetDevice(&c.device);
    if (c.deviceError != cudaSuccess) {
      cudaGetLastError();
      c.device = -1;
    }
    return c;
  }
  void restore() const noexcept {
    const bool restored = haveContext ? contextCalls().setCurrent(context) == kDriverSuccess
                          : device >= 0 ? cudaSetDevice(device) == cudaSuccess
                                        : true;
    if (!restored) cudaGetLastError();
  }
};

}  // namespace

void check(int err, const char *what) {
  if (err != cudaSuccess) {
    // The error is reported here, so it leaves the thread's error slot, where the next launch's
    // check would otherwise find it (a sticky error stays: CUDA keeps it).
    cudaGetLastError();
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
// last reference (a user's, for an output hora allocated) keeps its own. A failure is only taken
// out of the error slot: destructors never throw.
Buffer::~Buffer() noexcept {
  if (data_ != nullptr && cudaFree(data_) != cudaSuccess) cudaGetLastError();
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
  setDevice(device_);
  check(cudaMemcpy(host, static_cast<const char *>(data_) + offset, bytes, cudaMemcpyDeviceToHost),
        "cudaMemcpy from the device");
}

Stream::Stream(int device) : device_(device) {
  setDevice(device);
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  stream_ = s;
}

Stream::~Stream() noexcept {
  if (stream_ != nullptr && cudaStreamDestroy(static_cast<cudaStream_t>(stream_)) != cudaSuccess) {
    cudaGetLastError();
  }
}

void Stream::waitFor(void *event) {
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(event), 0),
        "cudaStreamWaitEvent");
}

void Stream::synchronize() {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize");
}

// The caller's thread keeps its CUDA context exactly: the context current before (none, on a
// thread that never used CUDA) is current again after. Restoring cudaGetDevice's answer instead
// would be wrong there: with no context current it says 0, and setting device 0 creates a context
// on GPU 0, hundreds of MB in every process whatever its own GPU. Without the driver's context
// calls, the device cudaGetDevice names is restored as before.
std::shared_ptr<void> recordEvent(int device, void *stream) {
  const ThreadContext saved = ThreadContext::current();
  check(saved.deviceError, "cudaGetDevice");
  // With no context current, using any device makes its context current: put "none" back.
  const bool switched = saved.device != device || (saved.haveContext && saved.context == nullptr);
  // Nothing throws until the thread's context is back.
  cudaEvent_t event = nullptr;
  cudaError_t err = switched ? cudaSetDevice(device) : cudaSuccess;
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (err == cudaSuccess) {
    err = cudaEventRecord(event, stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) cudaEventDestroy(event);
  }
  if (switched) saved.restore();
  check(err, "recording the caller's stream");
  return std::shared_ptr<void>(event, [](void *e) {
    if (cudaEventDestroy(static_cast<cudaEvent_t>(e)) != cudaSuccess) cudaGetLastError();
  });
}

std::shared_ptr<void> keepContext() noexcept {
  auto saved = std::make_shared<ThreadContext>(ThreadContext::current());
  return std::shared_ptr<void>(saved.get(), [saved](void *) { saved->restore(); });
}

// cudaErrorNotReady is "not yet", not an error: it is taken out of the thread's error slot, or the
// next kernel launch's cudaGetLastError would report it as the launch's failure.
bool eventDone(void *event) {
  int err = 0;
  const auto query = [event] { return static_cast<int>(cudaEventQuery(static_cast<cudaEvent_t>(event))); };
  if (cuda_errors::queryDone(query, lastError, cudaErrorNotReady, &err)) {
    return true;
  }
  check(err, "cudaEventQuery");
  return false;
}

}  // namespace hora::nccl_device
