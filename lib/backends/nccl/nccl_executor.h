// SPDX-License-Identifier: Apache-2.0
// The GPU data plane: one NCCL communicator per process set and rank, behind DeviceExecutor, on
// top of gpu::DeviceApi only (no CUDA or NCCL headers), so that its logic runs in the CPU test
// suite against a fake device as well as on a GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backends/nccl/device_api.h"
#include "core/control_plane.h"
#include "core/device_executor.h"

namespace hora {

// Collective over `control` (every rank of the set calls it at the same response):
//   1. each rank sets up CUDA on `device` (stream, event, cancel flag, kernels for its
//      architecture); the ranks agree that all of them could (one AND), so that a rank whose
//      setup failed makes every rank fail at once, naming it, instead of leaving them waiting;
//   2. rank 0 makes NCCL's unique id and the control plane carries it to the others;
//   3. every rank joins a non-blocking communicator, waiting at most options.initTimeoutS before
//      aborting it with HORA_ERR_TIMEOUT.
// Throws Error(HORA_ERR_BACKEND) naming CUDA's or NCCL's error and the ranks that failed.
struct NcclOptions {
  double timeoutS = 300;      // HORA_TIMEOUT_S: an op, or the communicator's end
  double initTimeoutS = 120;  // HORA_NCCL_INIT_TIMEOUT_S (capped at timeoutS): its creation
  int64_t fusionBytes = int64_t{64} << 20;  // HORA_FUSION_THRESHOLD: the registered fusion buffer
  int64_t directBytes = int64_t{1} << 20;   // HORA_CUDA_DIRECT_BYTES: 0 packs every tensor
};
std::unique_ptr<DeviceExecutor> createNcclExecutor(gpu::DeviceApi &api, ControlPlane &control,
                                                   int device, const NcclOptions &options,
                                                   DeviceHooks hooks);
// The defaults, but `timeoutS` for both deadlines (tests).
std::unique_ptr<DeviceExecutor> createNcclExecutor(gpu::DeviceApi &api, ControlPlane &control,
                                                   int device, double timeoutS,
                                                   DeviceHooks hooks);

// The GPU of a rank none of whose tensors named one (it joined before its first CUDA op): its
// local rank modulo the visible GPUs. Throws Error(HORA_ERR_BACKEND) without a GPU.
int defaultCudaDevice(gpu::DeviceApi &api, int localRank);

// Why a tensor on CUDA device `device` cannot be used in this process, as the end of the message
// that refuses its call before it is submitted ("input is on cuda:3, but ..."): CUDA's reason
// when no device is visible, else how many this process sees; "" when the device is there.
std::string whyNoCudaDevice(gpu::DeviceApi &api, int device);

}  // namespace hora
