// SPDX-License-Identifier: Apache-2.0
// The NCCL backend's device kernels (nccl_kernels.cu, built by nvcc), declared without CUDA
// headers: a stream is a cudaStream_t passed as void *.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace hora::nccl_kernels {

struct CopyItem {
  const void *src;
  void *dst;
  int64_t bytes;
};

// `cancel`, in the calls below: a flag the device reads, nullptr for never cancelled. Each block
// of a launch reads it once, as it starts (a volatile load), and writes nothing when it is nonzero.
// The host sets it (before ncclCommAbort) so that the unpacking copies and scalings already queued
// behind an aborted collective leave the caller's tensors as they were. The host writes it in
// device-visible host memory (cudaHostAlloc(cudaHostAllocMapped | cudaHostAllocPortable)); the
// kernels should read a device-memory copy of it that snapshotCancel made just before them, in
// stream order: a read of host memory crosses the bus, once per block, and on an H100 in a
// virtual machine those reads cost about 1 us each and did not overlap, so a 64 MiB unpack of
// 16 tensors (16,384 blocks) took 16 ms instead of 47 us. A block that started before the host
// wrote it still writes.
//
// Each call returns the cudaError_t (as int) of its first launch that failed, 0 when all were
// queued. An error some earlier call left in the calling thread's CUDA error slot is discarded
// first, not reported as this call's.

// Every item's bytes copied on `stream` in one kernel launch per kMaxItemsPerLaunch items (the
// descriptors travel as the launch's arguments): packing a fused response of many small tensors
// costs a launch or two, not a cudaMemcpyAsync per tensor. Items must not overlap. Any alignment:
// a copy moves the widest words (16, 8, 4, 2 bytes) that its source and destination can both be
// aligned to, bytes only when their distance is odd.
constexpr int kMaxItemsPerLaunch = 512;

// *mirror = *hostFlag once `stream` reaches this point (one thread reads the host's flag over the
// bus): what the kernels queued after it on `stream` then read as their `cancel`. `mirror` is one
// int of device memory; `hostFlag` the device pointer of mapped host memory.
int snapshotCancel(const int *hostFlag, int *mirror, void *stream);
int batchedCopy(const std::vector<CopyItem> &items, const int *cancel, void *stream);

// buf[i] *= factor for `count` elements of a floating dtype on `stream`: float64 in float64,
// the others in float32 (float16 and bfloat16 rounded once to nearest even).
int scale(void *buf, int64_t count, DType dtype, double factor, const int *cancel, void *stream);

// The GPU architectures this build holds kernel code for, as meson's gpu_archs option chose
// them: "sm_75 sm_80 ... sm_121 + PTX compute_121" (SASS for each, PTX the driver can compile
// for newer GPUs).
const char *builtArchitectures();

// "" when the kernels can run on CUDA device `device`, else why not ("cuda:0 is sm_70 (Tesla
// V100); this build has code for ..."). Never throws; leaves the calling thread's current device
// as it was and no error in its CUDA error slot.
std::string kernelsRunOn(int device);

// "NVIDIA H100 80GB HBM3, sm_90"; "unknown device (CUDA's reason)" when it cannot be asked.
// Never throws; leaves no error in the calling thread's CUDA error slot.
std::string deviceDescription(int device);

}  // namespace hora::nccl_kernels
