// SPDX-License-Identifier: Apache-2.0
// The one place backends are registered and chosen.
#pragma once

#include <memory>

#include "base/knobs.h"
#include "bootstrap/bootstrap.h"
#include "core/backend.h"
#include "core/device_executor.h"

namespace hora {

// The CPU data plane for `group` (the world or a process set): walks the registered backends in order (HORA_CPU_BACKEND
// first if set) and returns the first that can serve this world. Throws Error(UNSUPPORTED)
// saying which backends were considered and why each could not serve.
std::unique_ptr<Backend> createCpuBackend(const Knobs &knobs, Bootstrap &bootstrap, Group &group);

// The executor for tensors on `device` (a CUDA ordinal) for the set behind `control`: NCCL.
// Collective over the set. Throws Error(UNSUPPORTED) in a build without NCCL.
std::unique_ptr<DeviceExecutor> createDeviceExecutor(ControlPlane &control, int device,
                                                     DeviceHooks hooks, const Knobs &knobs);
// The GPU of a rank none of whose tensors named one: local rank modulo the visible GPUs. Throws
// Error(HORA_ERR_BACKEND) without a GPU, Error(UNSUPPORTED) in a build without NCCL.
int defaultCudaDevice(int localRank);
// The calling thread's CUDA context, put back when the result is dropped (null without NCCL).
std::shared_ptr<void> keepCudaContext();

// A world of one: copies.
std::unique_ptr<Backend> createSelfBackend();

}  // namespace hora
