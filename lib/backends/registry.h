// SPDX-License-Identifier: Apache-2.0
// The one place backends are registered and chosen.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/knobs.h"
#include "bootstrap/bootstrap.h"
#include "core/backend.h"
#include "core/device_executor.h"

namespace hora {

// A CPU data plane the registry knows by name: the one list of them, which HORA_CPU_BACKEND's
// check, hora-info's build facts and the error messages read.
struct PlaneInfo {
  std::string name;     // "ucx", "mpi", "gloo", "self"
  bool built = false;   // this build has it
  bool byName = false;  // HORA_CPU_BACKEND may name it ("self" serves a world of one by itself)
  std::string note;     // for hora-info: "world of one"; "" for most
  bool link = false;    // a Link: its collectives are core's algorithm tables (HORA_ALGORITHM)
  // For hora-info: the plane's library version and the transports this machine offers it (may
  // start the library, so only asked for); null for most.
  std::string (*describe)() = nullptr;
};
// Every plane the registry knows, in the order `auto` tries them.
std::vector<PlaneInfo> cpuPlanes();

// The CPU data plane for `group` (the world or a process set): walks the registered backends in order (HORA_CPU_BACKEND
// first if set) and returns the first that can serve this world. Throws Error(INVALID_ARGUMENT)
// when HORA_CPU_BACKEND names no plane of the registry's (the knob's parser takes any plain name),
// and Error(UNSUPPORTED) saying which backends were considered and why each could not serve (a
// plane named but not built among them).
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

// The device plane's rules for a CUDA tensor, asked before its call is submitted, so that the
// refusal is this rank's own (told to the other ranks under the call's name, as a tombstone)
// instead of a failure of the whole set later. Whether this build has a device plane (NCCL).
bool haveDevicePlane();
// Why a tensor on CUDA device `device` cannot be used in this process ("" when it can): no such
// device, or a build without NCCL.
std::string whyNoCudaDevice(int device);
// Why the device plane cannot reduce `dtype` ("" when it can).
std::string whyCudaCannotReduce(DType dtype);
// An event recorded on the caller's `stream` of `device` (nullptr: the legacy default stream):
// the caller's work so far, which the device work waits for (Request::readyEvent). Leaves the
// calling thread's CUDA context as it was. Throws Error(UNSUPPORTED) in a build without NCCL.
std::shared_ptr<void> recordCallerWork(int device, void *stream);

// A world of one: copies.
std::unique_ptr<Backend> createSelfBackend();

}  // namespace hora
