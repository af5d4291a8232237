// SPDX-License-Identifier: Apache-2.0
// DeviceApi over the process's CUDA runtime and NCCL: the one place the NCCL backend's calls meet
// the vendor libraries.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <type_traits>
#include <vector>

#include "backends/nccl/cuda_errors.h"
#include "backends/nccl/device_api.h"
#include "backends/nccl/nccl_device.h"
#include "backends/nccl/nccl_kernels.h"
#include "backends/nccl/nccl_plan.h"
#include "base/error.h"
#include "base/logging.h"

namespace hora::gpu {
namespace {

using nccl_plan::NcclOp;
using nccl_plan::NcclType;

static_assert(kNcclSuccess == ncclSuccess && kNcclInProgress == ncclInProgress,
              "device_api.h's results are NCCL's");
static_assert(static_cast<int>(NcclType::kInt8) == ncclInt8 &&
                  static_cast<int>(NcclType::kUint8) == ncclUint8 &&
                  static_cast<int>(NcclType::kInt32) == ncclInt32 &&
                  static_cast<int>(NcclType::kInt64) == ncclInt64 &&
                  static_cast<int>(NcclType::kFloat16) == ncclFloat16 &&
                  static_cast<int>(NcclType::kFloat32) == ncclFloat32 &&
                  static_cast<int>(NcclType::kFloat64) == ncclFloat64 &&
                  static_cast<int>(NcclType::kBfloat16) == ncclBfloat16,
              "nccl_plan's types are NCCL's");
static_assert(static_cast<int>(NcclOp::kSum) == ncclSum && static_cast<int>(NcclOp::kProd) == ncclProd &&
                  static_cast<int>(NcclOp::kMax) == ncclMax && static_cast<int>(NcclOp::kMin) == ncclMin &&
                  static_cast<int>(NcclOp::kAvg) == ncclAvg,
              "nccl_plan's ops are NCCL's");
static_assert(sizeof(ncclRedOp_t) == sizeof(RedOp), "a RedOp holds any ncclRedOp_t");

cudaStream_t cudaStream(StreamHandle s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t cudaEvent(EventHandle e) { return static_cast<cudaEvent_t>(e); }
ncclComm_t ncclCommOf(CommHandle c) { return static_cast<ncclComm_t>(c); }
ncclRedOp_t ncclOp(RedOp op) { return static_cast<ncclRedOp_t>(op); }

// ncclInvalidArgument for a dtype NCCL has no type for (int16: its reductions are refused at
// submission, nccl_plan::whyNotReduced, and the byte-wise calls never ask).
bool toNccl(DType t, ncclDataType_t *out) noexcept {
  try {
    *out = static_cast<ncclDataType_t>(nccl_plan::ncclType(t));
    return true;
  } catch (...) {
    return false;
  }
}

int lastError() { return static_cast<int>(cudaGetLastError()); }

// Throws for a failed call, which checkedLaunch / queryDone have already taken out of the
// thread's error slot, or which is taken out here: an error is reported once.
template <class... What>
void check(int err, const What &...what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  const auto e = static_cast<cudaError_t>(err);
  HORA_THROW(HORA_ERR_BACKEND, what..., ": CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
             ")");
}

// A launch or asynchronous call checked for its own error only (cuda_errors.h).
template <class Launch>
int launch(Launch call) {
  return cuda_errors::checkedLaunch([&] { return static_cast<int>(call()); }, lastError);
}

// For the noexcept teardown calls: a failure is logged and taken out of the error slot.
void quietly(cudaError_t err, const char *what) noexcept {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  try {
    HORA_LOG(kWarning) << what << ": CUDA error " << cudaGetErrorName(err) << " ("
                       << cudaGetErrorString(err) << ")";
  } catch (...) {
  }
}

class CudaDeviceApi final : public DeviceApi {
 public:
  // ---- CUDA

  int deviceCount() noexcept override { return nccl_device::deviceCount(); }

  std::string whyNoDevice() noexcept override {
    try {
      return nccl_device::whyNoDevice();
    } catch (...) {
      return "no CUDA device";
    }
  }

  void setDevice(int device) override { check(cudaSetDevice(device), "cudaSetDevice(", device, ")"); }
  std::shared_ptr<void> keepContext() noexcept override { return nccl_device::keepContext(); }

  int multiprocessors(int device) override {
    int n = 0;
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device),
          "asking cuda:", device, " for its multiprocessor count");
    return n;
  }

  std::string kernelsRunOn(int device) noexcept override {
    try {
      return nccl_kernels::kernelsRunOn(device);
    } catch (const std::exception &e) {
      return e.what();
    } catch (...) {
      return "hora's kernels could not be checked";
    }
  }

  StreamHandle createStream() override {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }

  void destroyStream(StreamHandle stream) noexcept override {
    if (stream != nullptr) quietly(cudaStreamDestroy(cudaStream(stream)), "cudaStreamDestroy");
  }

  EventHandle createEvent() override {
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync), "cudaEventCreateWithFlags");
    return e;
  }

  void destroyEvent(EventHandle event) noexcept override {
    if (event != nullptr) quietly(cudaEventDestroy(cudaEvent(event)), "cudaEventDestroy");
  }

  void recordEvent(EventHandle event, StreamHandle stream) override {
    check(launch([&] { return cudaEventRecord(cudaEvent(event), cudaStream(stream)); }), "cudaEventRecord");
  }

  // cudaErrorNotReady leaves the error slot here: left there, the next kernel launch's
  // cudaGetLastError reported it as the launch's own failure.
  bool eventDone(EventHandle event) override {
    int err = 0;
    if (cuda_errors::queryDone([&] { return static_cast<int>(cudaEventQuery(cudaEvent(event))); },
                               lastError, cudaErrorNotReady, &err)) {
      return true;
    }
    check(err, "cudaEventQuery");
    return false;
  }

  void synchronizeEvent(EventHandle event) override {
    check(cudaEventSynchronize(cudaEvent(event)), "cudaEventSynchronize");
  }

  void waitEvent(StreamHandle stream, EventHandle event) override {
    check(launch([&] { return cudaStreamWaitEvent(cudaStream(stream), cudaEvent(event), 0); }),
          "cudaStreamWaitEvent");
  }

  void hostCallback(StreamHandle stream, void (*fn)(void *), void *arg) override {
    check(launch([&] { return cudaLaunchHostFunc(cudaStream(stream), fn, arg); }), "cudaLaunchHostFunc");
  }

  void *allocate(size_t bytes, StreamHandle stream) override {
    if (bytes == 0) return nullptr;
    void *p = nullptr;
    if (pooled(streamDevice(stream))) {
      check(launch([&] { return cudaMallocAsync(&p, bytes, cudaStream(stream)); }), "cudaMallocAsync of ",
            bytes, " bytes");
    } else {
      check(launch([&] { return cudaMalloc(&p, bytes); }), "cudaMalloc of ", bytes, " bytes");
    }
    return p;
  }

  void release(void *data, StreamHandle stream) noexcept override {
    if (data == nullptr) return;
    if (stream == nullptr) {  // no stream (an output outliving its executor): cudaFree synchronises
      quietly(cudaFree(data), "cudaFree");
      return;
    }
    bool usePool = true;
    try {
      usePool = pooled(streamDevice(stream));
    } catch (...) {  // allocate() would have thrown the same: the pool's device was known then
    }
    if (usePool) {
      quietly(cudaFreeAsync(data, cudaStream(stream)), "cudaFreeAsync");
    } else {
      quietly(cudaFree(data), "cudaFree");
    }
  }

  void copy(void *dst, const void *src, size_t bytes, StreamHandle stream) override {
    if (bytes == 0) return;
    check(launch([&] {
            return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cudaStream(stream));
          }),
          "cudaMemcpyAsync of ", bytes, " bytes on the device");
  }

  void zero(void *data, size_t bytes, StreamHandle stream) override {
    if (bytes == 0) return;
    check(launch([&] { return cudaMemsetAsync(data, 0, bytes, cudaStream(stream)); }), "cudaMemsetAsync of ",
          bytes, " bytes");
  }

  void batchedCopy(const std::vector<nccl_kernels::CopyItem> &items, const int *cancel,
                   StreamHandle stream) override {
    const int *flag = snapshot(cancel, stream);
    check(launch([&] { return nccl_kernels::batchedCopy(items, flag, stream); }), "hora's copy kernel (",
          items.size(), " tensors)");
  }

  void scale(void *data, int64_t count, DType dtype, double factor, const int *cancel,
             StreamHandle stream) override {
    if (count == 0 || factor == 1.0) return;  // nothing launched
    const int *flag = snapshot(cancel, stream);
    check(launch([&] { return nccl_kernels::scale(data, count, dtype, factor, flag, stream); }),
          "hora's scaling kernel (", count, " ", dtypeName(dtype), ")");
  }

  // The flag is mapped host memory (the host must be able to set it while the GPU is stuck in
  // an NCCL kernel); each flag has a device-memory mirror, which snapshot() refreshes in stream
  // order just before a kernel that reads it (nccl_kernels.h says why).
  CancelFlag createCancelFlag() override {
    void *host = nullptr;
    // Portable: pinned and mapped for every context of the process, not only the current one.
    check(cudaHostAlloc(&host, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc of the cancel flag");
    *static_cast<int *>(host) = 0;
    void *device = nullptr;
    void *mirror = nullptr;
    cudaError_t err = cudaHostGetDevicePointer(&device, host, 0);
    if (err == cudaSuccess) err = cudaMalloc(&mirror, sizeof(int));
    if (err == cudaSuccess) err = cudaMemset(mirror, 0, sizeof(int));
    if (err != cudaSuccess) {
      if (mirror != nullptr) cudaFree(mirror);
      cudaFreeHost(host);
      check(err, "setting up the cancel flag");
    }
    std::lock_guard<std::mutex> lock(mirrorsMutex_);
    mirrors_[static_cast<const int *>(device)] = static_cast<int *>(mirror);
    return {static_cast<int *>(host), static_cast<const int *>(device)};
  }

  void destroyCancelFlag(CancelFlag flag) noexcept override {
    int *mirror = nullptr;
    {
      std::lock_guard<std::mutex> lock(mirrorsMutex_);
      auto it = mirrors_.find(flag.device);
      if (it != mirrors_.end()) {
        mirror = it->second;
        mirrors_.erase(it);
      }
    }
    if (mirror != nullptr) quietly(cudaFree(mirror), "cudaFree of the cancel flag's mirror");
    if (flag.host != nullptr) quietly(cudaFreeHost(flag.host), "cudaFreeHost of the cancel flag");
  }

  // ---- NCCL

  std::string ncclVersion() noexcept override {
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
    // NCCL 2.9 and later: major * 10000 + minor * 100 + patch.
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  }

  std::string ncclErrorString(int result) noexcept override {
    const char *s = ncclGetErrorString(static_cast<ncclResult_t>(result));
    return s != nullptr ? s : "unknown NCCL error";
  }

  std::string uniqueId() override {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) HORA_THROW(HORA_ERR_BACKEND, "ncclGetUniqueId: NCCL error ", ncclGetErrorString(r));
    return std::string(reinterpret_cast<const char *>(&id), sizeof id);
  }

  int commInit(CommHandle *comm, const std::string &uniqueId, int size, int rank,
               int maxCTAs) noexcept override {
    *comm = nullptr;
    if (uniqueId.size() != sizeof(ncclUniqueId)) return ncclInvalidArgument;
    ncclUniqueId id;
    std::memcpy(&id, uniqueId.data(), sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    if (maxCTAs > 0) config.maxCTAs = maxCTAs;
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&c, size, id, rank, &config);
    *comm = c;
    return r;
  }

  int commSplit(CommHandle parent, int color, int key, CommHandle *comm, int maxCTAs) noexcept override {
    *comm = nullptr;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.splitShare = 1;
    if (maxCTAs > 0) config.maxCTAs = maxCTAs;
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommSplit(ncclCommOf(parent), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &c,
                                         &config);
    *comm = c;
    return r;
  }

  int commAsyncError(CommHandle comm, int *state) noexcept override {
    ncclResult_t s = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(ncclCommOf(comm), &s);
    *state = s;
    return r;
  }

  std::string commLastError(CommHandle comm) noexcept override {
    const char *last = ncclGetLastError(ncclCommOf(comm));
    return last != nullptr ? last : "";
  }

  int commFinalize(CommHandle comm) noexcept override { return ncclCommFinalize(ncclCommOf(comm)); }
  int commDestroy(CommHandle comm) noexcept override { return ncclCommDestroy(ncclCommOf(comm)); }
  int commAbort(CommHandle comm) noexcept override { return ncclCommAbort(ncclCommOf(comm)); }

  int memAlloc(void **data, size_t bytes) noexcept override {
    *data = nullptr;
    return ncclMemAlloc(data, bytes);
  }
  int memFree(void *data) noexcept override { return data == nullptr ? ncclSuccess : ncclMemFree(data); }
  int commRegister(CommHandle comm, void *data, size_t bytes, void **handle) noexcept override {
    return ncclCommRegister(ncclCommOf(comm), data, bytes, handle);
  }
  int commDeregister(CommHandle comm, void *handle) noexcept override {
    return ncclCommDeregister(ncclCommOf(comm), handle);
  }

  // The factor as a host scalar of the dtype, which NCCL copies when the operator is made.
  int createPreMulSum(RedOp *op, DType dtype, double factor, CommHandle comm) noexcept override {
    union {
      uint16_t h;
      float f;
      double d;
    } scalar{};
    switch (dtype) {
      case DType::kFloat16: scalar.h = floatToHalf(static_cast<float>(factor)); break;
      case DType::kBFloat16: scalar.h = floatToBfloat16(static_cast<float>(factor)); break;
      case DType::kFloat32: scalar.f = static_cast<float>(factor); break;
      case DType::kFloat64: scalar.d = factor; break;
      default: return ncclInvalidArgument;  // integers are never scaled
    }
    ncclDataType_t type;
    if (!toNccl(dtype, &type)) return ncclInvalidArgument;
    ncclRedOp_t made{};
    const ncclResult_t r =
        ncclRedOpCreatePreMulSum(&made, &scalar, type, ncclScalarHostImmediate, ncclCommOf(comm));
    if (r == ncclSuccess || r == ncclInProgress) *op = static_cast<RedOp>(made);
    return r;
  }

  int destroyRedOp(RedOp op, CommHandle comm) noexcept override {
    return ncclRedOpDestroy(ncclOp(op), ncclCommOf(comm));
  }

  int groupStart() noexcept override { return ncclGroupStart(); }
  int groupEnd() noexcept override { return ncclGroupEnd(); }

  int allReduce(const void *in, void *out, size_t count, DType dtype, RedOp op, CommHandle comm,
                StreamHandle stream) noexcept override {
    ncclDataType_t type;
    if (!toNccl(dtype, &type)) return ncclInvalidArgument;
    return ncclAllReduce(in, out, count, type, ncclOp(op), ncclCommOf(comm), cudaStream(stream));
  }

  int broadcast(const void *in, void *out, size_t bytes, int root, CommHandle comm,
                StreamHandle stream) noexcept override {
    return ncclBroadcast(in, out, bytes, ncclUint8, root, ncclCommOf(comm), cudaStream(stream));
  }

  int allGather(const void *in, void *out, size_t bytesPerRank, CommHandle comm,
                StreamHandle stream) noexcept override {
    return ncclAllGather(in, out, bytesPerRank, ncclUint8, ncclCommOf(comm), cudaStream(stream));
  }

  int reduceScatter(const void *in, void *out, size_t countPerRank, DType dtype, RedOp op, CommHandle comm,
                    StreamHandle stream) noexcept override {
    ncclDataType_t type;
    if (!toNccl(dtype, &type)) return ncclInvalidArgument;
    return ncclReduceScatter(in, out, countPerRank, type, ncclOp(op), ncclCommOf(comm), cudaStream(stream));
  }

  int reduce(const void *in, void *out, size_t count, DType dtype, RedOp op, int root, CommHandle comm,
             StreamHandle stream) noexcept override {
    ncclDataType_t type;
    if (!toNccl(dtype, &type)) return ncclInvalidArgument;
    return ncclReduce(in, out, count, type, ncclOp(op), root, ncclCommOf(comm), cudaStream(stream));
  }

  int send(const void *in, size_t bytes, int peer, CommHandle comm, StreamHandle stream) noexcept override {
    return ncclSend(in, bytes, ncclUint8, peer, ncclCommOf(comm), cudaStream(stream));
  }

  int recv(void *out, size_t bytes, int peer, CommHandle comm, StreamHandle stream) noexcept override {
    return ncclRecv(out, bytes, ncclUint8, peer, ncclCommOf(comm), cudaStream(stream));
  }

 private:
  static int streamDevice(StreamHandle stream) {
    int device = 0;
#if CUDART_VERSION >= 12080
    check(cudaStreamGetDevice(cudaStream(stream), &device), "cudaStreamGetDevice");
#else
    (void)stream;  // hora's streams are made on the thread's current device
    check(cudaGetDevice(&device), "cudaGetDevice");
#endif
    return device;
  }

  // Whether `device` allocates from its default memory pool (every GPU and driver hora targets;
  // some virtualised ones have no pools, and then cudaMalloc/cudaFree, which synchronise). The
  // first time, the pool's release threshold is set to "never": memory freed stays cached in the
  // pool for the next allocation instead of going back to the driver at every synchronisation,
  // so a per-call buffer costs no cudaMalloc.
  bool pooled(int device) {
    std::lock_guard<std::mutex> lock(poolsMutex_);
    if (device >= static_cast<int>(pools_.size())) pools_.resize(device + 1);
    Pool &pool = pools_[device];
    if (!pool.configured) {
      int supported = 0;
      check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device),
            "asking cuda:", device, " whether it has memory pools");
      if (supported != 0) {
        cudaMemPool_t defaultPool = nullptr;
        check(cudaDeviceGetDefaultMemPool(&defaultPool, device), "cudaDeviceGetDefaultMemPool(", device, ")");
        uint64_t threshold = UINT64_MAX;
        check(cudaMemPoolSetAttribute(defaultPool, cudaMemPoolAttrReleaseThreshold, &threshold),
              "setting the release threshold of cuda:", device, "'s memory pool");
      }
      pool.configured = true;
      pool.supported = supported != 0;
    }
    return pool.supported;
  }

  struct Pool {
    bool configured = false;
    bool supported = false;
  };
  // This mutex protects: pools_ (engine threads of several devices allocate at once).
  std::mutex poolsMutex_;
  std::vector<Pool> pools_;  // by device

  // The device-memory mirror of `cancel` (a flag from createCancelFlag), refreshed on `stream`
  // now; nullptr for nullptr. A pointer that is no flag of this API is read as it is.
  const int *snapshot(const int *cancel, StreamHandle stream) {
    if (cancel == nullptr) return nullptr;
    int *mirror = nullptr;
    {
      std::lock_guard<std::mutex> lock(mirrorsMutex_);
      auto it = mirrors_.find(cancel);
      if (it != mirrors_.end()) mirror = it->second;
    }
    if (mirror == nullptr) return cancel;
    check(launch([&] { return nccl_kernels::snapshotCancel(cancel, mirror, stream); }),
          "hora's cancel-flag snapshot kernel");
    return mirror;
  }

  // This mutex protects: mirrors_ (executors of several sets make and drop flags at once).
  std::mutex mirrorsMutex_;
  std::unordered_map<const int *, int *> mirrors_;  // a flag's device pointer -> its mirror
};

}  // namespace

DeviceApi &cudaDeviceApi() {
  // Never destroyed: backends may release memory and streams from static destructors.
  static CudaDeviceApi *api = new CudaDeviceApi();
  return *api;
}

}  // namespace hora::gpu
