// SPDX-License-Identifier: Apache-2.0
// Every CUDA and NCCL call the NCCL backend makes, behind one interface without CUDA or NCCL
// headers. The backend's logic (nccl_executor.cpp: ordering, error clearing, abort sequencing,
// memory reuse, join's device choice) is written against this interface only, so it builds and
// is tested everywhere: on a machine without a GPU against a fake device that records calls and
// injects errors (test/unit/fake_device.h), and on a GPU against cuda_device_api.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/nccl/nccl_kernels.h"
#include "base/dtype.h"

namespace hora::gpu {

// cudaStream_t, cudaEvent_t and ncclComm_t, opaque.
using StreamHandle = void *;
using EventHandle = void *;
using CommHandle = void *;

// NCCL's ncclResult_t values that the backend branches on (nccl.h; cuda_device_api.cpp
// static_asserts them); any other value is an error, described by ncclErrorString().
constexpr int kNcclSuccess = 0;
constexpr int kNcclInProgress = 7;
constexpr int kSplitNoColor = -1;  // NCCL_SPLIT_NOCOLOR

// A reduction as NCCL takes it: one of nccl_plan::NcclOp's values, or an operator made by
// createPreMulSum() (ncclRedOp_t is an int-sized enum).
using RedOp = int;

class DeviceApi {
 public:
  virtual ~DeviceApi() = default;

  // ---- CUDA. Calls that can fail throw Error(HORA_ERR_BACKEND) with CUDA's own words and what
  // hora was doing; calls marked noexcept never throw (they are used in teardown).

  // Visible devices; 0 when there is no GPU or no driver (never throws, leaves no error behind).
  virtual int deviceCount() noexcept = 0;
  virtual std::string whyNoDevice() noexcept = 0;
  // The calling thread's device from now on.
  virtual void setDevice(int device) = 0;
  // The calling thread's CUDA context, put back as it was when the returned object is dropped.
  virtual std::shared_ptr<void> keepContext() noexcept = 0;
  // Streaming multiprocessors of `device` (what every communicator's CTAs must fit in).
  virtual int multiprocessors(int device) = 0;
  // "" when hora's kernels run on `device`, else why (no image for its architecture).
  virtual std::string kernelsRunOn(int device) noexcept = 0;

  // A non-blocking stream on the current device.
  virtual StreamHandle createStream() = 0;
  virtual void destroyStream(StreamHandle stream) noexcept = 0;
  // Timing disabled; a host thread that synchronizes on it sleeps (cudaEventBlockingSync) rather
  // than spinning.
  virtual EventHandle createEvent() = 0;
  virtual void destroyEvent(EventHandle event) noexcept = 0;
  virtual void recordEvent(EventHandle event, StreamHandle stream) = 0;
  // Whether everything before the event has run; never blocks. cudaErrorNotReady is not an error:
  // it must not stay in the thread's error slot, where the next launch's check would find it.
  // Throws for an error the event reports.
  virtual bool eventDone(EventHandle event) = 0;
  // Blocks the calling thread until the work before the event's latest record has run
  // (cudaEventSynchronize); throws for an error the event reports.
  virtual void synchronizeEvent(EventHandle event) = 0;
  // Later work on `stream` waits for `event`.
  virtual void waitEvent(StreamHandle stream, EventHandle event) = 0;
  // `fn(arg)` runs on a driver thread once `stream` reaches this point (cudaLaunchHostFunc); it
  // must not call CUDA. The executor does not use it (the stream stalls until the driver's thread
  // has run it); tests and the GPU probe do.
  virtual void hostCallback(StreamHandle stream, void (*fn)(void *), void *arg) = 0;

  // Stream-ordered device memory (cudaMallocAsync / cudaFreeAsync): neither call synchronises
  // the device, so an engine thread may make them while another communicator's kernels wait
  // for their peers. The memory may be used by work queued on `stream` after the call.
  virtual void *allocate(size_t bytes, StreamHandle stream) = 0;
  // stream == nullptr: a synchronous free (cudaFree), from any thread on any current device.
  virtual void release(void *data, StreamHandle stream) noexcept = 0;
  virtual void copy(void *dst, const void *src, size_t bytes, StreamHandle stream) = 0;
  virtual void zero(void *data, size_t bytes, StreamHandle stream) = 0;
  // hora's kernels (nccl_kernels.h), each launch's own error checked. `cancel`: see cancelFlag().
  virtual void batchedCopy(const std::vector<nccl_kernels::CopyItem> &items, const int *cancel,
                           StreamHandle stream) = 0;
  virtual void scale(void *data, int64_t count, DType dtype, double factor, const int *cancel,
                     StreamHandle stream) = 0;
  // An int in pinned, mapped host memory, 0 at first: the host writes *host, hora's kernels read
  // *device as they start and write nothing once it is nonzero.
  struct CancelFlag {
    int *host = nullptr;
    const int *device = nullptr;
  };
  virtual CancelFlag createCancelFlag() = 0;
  virtual void destroyCancelFlag(CancelFlag flag) noexcept = 0;

  // ---- NCCL. Calls return an ncclResult_t: kNcclSuccess, kNcclInProgress (non-blocking
  // communicators), or an error, described by ncclErrorString().
  virtual std::string ncclVersion() noexcept = 0;  // "2.28.3"
  virtual std::string ncclErrorString(int result) noexcept = 0;
  // The unique id's bytes; throws Error(HORA_ERR_BACKEND) if NCCL cannot make one.
  virtual std::string uniqueId() = 0;
  // A non-blocking communicator on the current device (ncclCommInitRankConfig, blocking = 0);
  // maxCTAs > 0 caps the CTAs each of its kernels uses. *comm is set even when it fails, if
  // NCCL made one (abort it then).
  virtual int commInit(CommHandle *comm, const std::string &uniqueId, int size, int rank,
                       int maxCTAs) noexcept = 0;
  // ncclCommSplit of `parent` (collective over it) with splitShare = 1 (the child shares the
  // parent's resources), non-blocking, maxCTAs as commInit's; color kSplitNoColor: this rank takes
  // part but gets no communicator (*comm nullptr).
  virtual int commSplit(CommHandle parent, int color, int key, CommHandle *comm, int maxCTAs) noexcept = 0;
  // ncclCommGetAsyncError: *state is kNcclSuccess, kNcclInProgress or an error.
  virtual int commAsyncError(CommHandle comm, int *state) noexcept = 0;
  // NCCL's last message about `comm`, "" if none.
  virtual std::string commLastError(CommHandle comm) noexcept = 0;
  virtual int commFinalize(CommHandle comm) noexcept = 0;
  virtual int commDestroy(CommHandle comm) noexcept = 0;
  virtual int commAbort(CommHandle comm) noexcept = 0;

  // Memory for buffers NCCL may register (ncclMemAlloc: cuMem allocations NCCL can map for its
  // peers); not stream-ordered: free only memory no queued work uses. *data is nullptr on failure.
  virtual int memAlloc(void **data, size_t bytes) noexcept = 0;
  virtual int memFree(void *data) noexcept = 0;
  // ncclCommRegister / ncclCommDeregister: `data` stays registered with `comm` (NCCL may then
  // move it without staging copies) until deregistered, which must come before the
  // communicator is destroyed.
  virtual int commRegister(CommHandle comm, void *data, size_t bytes, void **handle) noexcept = 0;
  virtual int commDeregister(CommHandle comm, void *handle) noexcept = 0;

  virtual int createPreMulSum(RedOp *op, DType dtype, double factor, CommHandle comm) noexcept = 0;
  virtual int destroyRedOp(RedOp op, CommHandle comm) noexcept = 0;

  virtual int groupStart() noexcept = 0;
  virtual int groupEnd() noexcept = 0;
  // Counts are elements of `dtype`; byte-wise calls (broadcast, allGather, send, recv) move
  // bytes (NCCL's uint8).
  virtual int allReduce(const void *in, void *out, size_t count, DType dtype, RedOp op,
                        CommHandle comm, StreamHandle stream) noexcept = 0;
  virtual int broadcast(const void *in, void *out, size_t bytes, int root, CommHandle comm,
                        StreamHandle stream) noexcept = 0;
  virtual int allGather(const void *in, void *out, size_t bytesPerRank, CommHandle comm,
                        StreamHandle stream) noexcept = 0;
  virtual int reduceScatter(const void *in, void *out, size_t countPerRank, DType dtype, RedOp op,
                            CommHandle comm, StreamHandle stream) noexcept = 0;
  virtual int reduce(const void *in, void *out, size_t count, DType dtype, RedOp op, int root,
                     CommHandle comm, StreamHandle stream) noexcept = 0;
  virtual int send(const void *in, size_t bytes, int peer, CommHandle comm,
                   StreamHandle stream) noexcept = 0;
  virtual int recv(void *out, size_t bytes, int peer, CommHandle comm,
                   StreamHandle stream) noexcept = 0;
};

// The process's CUDA and NCCL (cuda_device_api.cpp); only where the NCCL backend is built.
DeviceApi &cudaDeviceApi();

}  // namespace hora::gpu
