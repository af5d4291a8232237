// SPDX-License-Identifier: Apache-2.0
// hora-bench and hora-grads --device cuda: device buffers and the raw NCCL columns, without CUDA
// or NCCL headers in the benchmarks themselves (bench_cuda.cpp has them; built only where hora has
// its NCCL backend).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace hora::bench {

enum class NcclColl { kAllreduce, kAllgather, kBroadcast, kReducescatter, kAlltoall };

class CudaSide {
 public:
  // Collective over the world (world.h): this rank's GPU (local rank modulo the GPUs it sees), two
  // device buffers of `sendBytes` and `recvBytes` (recv() is nullptr for 0), a non-blocking
  // stream, and an NCCL communicator of the benchmark's own (unique id sent with the harness
  // broadcast). Throws std::runtime_error with CUDA's or NCCL's words.
  CudaSide(int localRank, size_t sendBytes, size_t recvBytes);
  ~CudaSide();
  CudaSide(const CudaSide &) = delete;
  CudaSide &operator=(const CudaSide &) = delete;

  static int deviceCount();  // 0 without a GPU or driver
  // Why deviceCount() is 0, in CUDA's words ("CUDA driver version is insufficient ..."); "" when
  // a device is visible.
  static std::string whyNoDevice();
  int device() const;
  void *stream() const;  // the cudaStream_t, for hora_cuda_set_stream
  void *send() const;
  void *recv() const;
  void upload(void *device, const void *host, size_t bytes);          // synchronous
  void download(void *host, const void *device, size_t bytes) const;  // synchronous

  // One raw NCCL collective on the two buffers, queued on the stream; count as nccl-tests: the
  // elements each rank sends (allreduce, broadcast), receives from each rank (allgather), or
  // keeps (reducescatter); per peer for alltoall. dtype and op by hora-bench's names ("float",
  // "half", ...; "sum", "avg", ...).
  void ncclOnce(NcclColl coll, const std::string &dtype, const std::string &op, int64_t count,
                int root);
  // One raw ncclAllReduce of `count` elements at `data` (device memory), in place, queued on the
  // stream: hora-grads' per-tensor and flat rows.
  void allreduceInPlace(void *data, int64_t count, const std::string &dtype, const std::string &op);
  void synchronize();  // the stream

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hora::bench
