// SPDX-License-Identifier: Apache-2.0
// The raw NCCL columns of hora-bench and hora-grads --device cuda.
#include "bench_cuda.h"

#include <stdexcept>

#if HORA_BENCH_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "world.h"

#include <map>

namespace hora::bench {
namespace {

void cudaCheck(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": CUDA error " + cudaGetErrorString(e));
  }
}

void ncclCheck(ncclResult_t r, const char *what) {
  if (r != ncclSuccess) {
    throw std::runtime_error(std::string(what) + ": NCCL error " + ncclGetErrorString(r));
  }
}

ncclDataType_t ncclTypeNamed(const std::string &name) {
  static const std::map<std::string, ncclDataType_t> types = {
      {"float", ncclFloat32}, {"half", ncclFloat16}, {"bfloat16", ncclBfloat16},
      {"double", ncclFloat64}, {"int32", ncclInt32}, {"int64", ncclInt64},
      {"int8", ncclInt8},     {"uint8", ncclUint8}};
  auto it = types.find(name);
  if (it == types.end()) throw std::runtime_error("no NCCL type for " + name);
  return it->second;
}

size_t ncclTypeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

ncclRedOp_t ncclOpNamed(const std::string &name) {
  static const std::map<std::string, ncclRedOp_t> ops = {
      {"sum", ncclSum}, {"avg", ncclAvg}, {"min", ncclMin}, {"max", ncclMax}, {"prod", ncclProd}};
  auto it = ops.find(name);
  if (it == ops.end()) throw std::runtime_error("no NCCL op for " + name);
  return it->second;
}

}  // namespace

struct CudaSide::Impl {
  int device = 0;
  int rank = 0, size = 1;
  void *send = nullptr, *recv = nullptr;
  cudaStream_t stream = nullptr;
  ncclComm_t comm = nullptr;
};

int CudaSide::deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string CudaSide::whyNoDevice() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess) return n > 0 ? "" : "cudaGetDeviceCount found 0 devices";
  cudaGetLastError();
  return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
}

CudaSide::CudaSide(int localRank, size_t sendBytes, size_t recvBytes) : impl_(new Impl) {
  const int gpus = deviceCount();
  if (gpus == 0) throw std::runtime_error("--device cuda: no CUDA device is visible");
  impl_->device = localRank % gpus;
  impl_->rank = worldRank();
  impl_->size = worldSize();
  cudaCheck(cudaSetDevice(impl_->device), "cudaSetDevice");
  cudaCheck(cudaMalloc(&impl_->send, sendBytes + 1), "cudaMalloc");
  if (recvBytes > 0) cudaCheck(cudaMalloc(&impl_->recv, recvBytes + 1), "cudaMalloc");
  cudaCheck(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  ncclUniqueId id;
  if (impl_->rank == 0) ncclCheck(ncclGetUniqueId(&id), "ncclGetUniqueId");
  broadcastBytes(&id, sizeof id);
  ncclCheck(ncclCommInitRank(&impl_->comm, impl_->size, id, impl_->rank), "ncclCommInitRank");
}

CudaSide::~CudaSide() {
  cudaSetDevice(impl_->device);
  if (impl_->comm != nullptr) ncclCommDestroy(impl_->comm);
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
  cudaFree(impl_->send);
  cudaFree(impl_->recv);
}

int CudaSide::device() const { return impl_->device; }
void *CudaSide::stream() const { return impl_->stream; }
void *CudaSide::send() const { return impl_->send; }
void *CudaSide::recv() const { return impl_->recv; }

void CudaSide::upload(void *device, const void *host, size_t bytes) {
  cudaCheck(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
  // From pageable memory cudaMemcpy may return before the data has landed, and the NCCL stream
  // is non-blocking: wait, so that the raw NCCL column reads the new inputs.
  cudaCheck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void CudaSide::download(void *host, const void *device, size_t bytes) const {
  cudaCheck(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from the device");
}

void CudaSide::ncclOnce(NcclColl coll, const std::string &dtype, const std::string &op,
                        int64_t count, int root) {
  const ncclDataType_t t = ncclTypeNamed(dtype);
  const size_t n = static_cast<size_t>(count);
  ncclComm_t c = impl_->comm;
  cudaStream_t s = impl_->stream;
  switch (coll) {
    case NcclColl::kAllreduce:
      ncclCheck(ncclAllReduce(impl_->send, impl_->recv, n, t, ncclOpNamed(op), c, s), "ncclAllReduce");
      break;
    case NcclColl::kAllgather:
      ncclCheck(ncclAllGather(impl_->send, impl_->recv, n, t, c, s), "ncclAllGather");
      break;
    case NcclColl::kBroadcast:
      ncclCheck(ncclBroadcast(impl_->recv, impl_->recv, n, t, root, c, s), "ncclBroadcast");
      break;
    case NcclColl::kReducescatter:
      ncclCheck(ncclReduceScatter(impl_->send, impl_->recv, n, t, ncclOpNamed(op), c, s),
                "ncclReduceScatter");
      break;
    case NcclColl::kAlltoall: {
      const size_t block = n * ncclTypeBytes(t);
      ncclCheck(ncclGroupStart(), "ncclGroupStart");
      for (int p = 0; p < impl_->size; ++p) {
        ncclCheck(ncclSend(static_cast<char *>(impl_->send) + p * block, n, t, p, c, s), "ncclSend");
        ncclCheck(ncclRecv(static_cast<char *>(impl_->recv) + p * block, n, t, p, c, s), "ncclRecv");
      }
      ncclCheck(ncclGroupEnd(), "ncclGroupEnd");
      break;
    }
  }
}

void CudaSide::allreduceInPlace(void *data, int64_t count, const std::string &dtype,
                                const std::string &op) {
  ncclCheck(ncclAllReduce(data, data, static_cast<size_t>(count), ncclTypeNamed(dtype),
                          ncclOpNamed(op), impl_->comm, impl_->stream),
            "ncclAllReduce");
}

void CudaSide::synchronize() { cudaCheck(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize"); }

}  // namespace hora::bench

#else  // a build without NCCL: --device cuda is refused before any of this could run

namespace hora::bench {

struct CudaSide::Impl {};
int CudaSide::deviceCount() { return 0; }
std::string CudaSide::whyNoDevice() { return "this build has no NCCL backend"; }
CudaSide::CudaSide(int, size_t, size_t) { throw std::runtime_error("this build has no NCCL backend"); }
CudaSide::~CudaSide() = default;
int CudaSide::device() const { return -1; }
void *CudaSide::stream() const { return nullptr; }
void *CudaSide::send() const { return nullptr; }
void *CudaSide::recv() const { return nullptr; }
void CudaSide::upload(void *, const void *, size_t) {}
void CudaSide::download(void *, const void *, size_t) const {}
void CudaSide::ncclOnce(NcclColl, const std::string &, const std::string &, int64_t, int) {}
void CudaSide::allreduceInPlace(void *, int64_t, const std::string &, const std::string &) {}
void CudaSide::synchronize() {}

}  // namespace hora::bench
#endif
