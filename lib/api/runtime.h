// SPDX-License-Identifier: Apache-2.0
// The composition root: the one place that knows every layer. It decides how the world is formed
// (lib/bootstrap) and which backends move data (lib/backends), and hands both to the engine
// (lib/core) through core/world.h's Fabric. It is also the C API's one way to the device plane.
#pragma once

#include <memory>
#include <string>

#include "base/dtype.h"
#include "base/knobs.h"
#include "core/engine.h"

namespace hora {

// The fabric the environment and `knobs` call for: the bootstrap createBootstrap picks (MPI,
// env://, Slurm or a world of one), the CPU backend the registry picks for each group, and NCCL
// for CUDA tensors.
std::shared_ptr<Fabric> defaultFabric(const Knobs &knobs);

// Engine::start on the default fabric: what hora_init runs. Throws Error with the init status.
std::shared_ptr<Engine> startRuntime(const Knobs &knobs);

// The device plane as the C API sees it, without a backend's header: the registry's rules and
// calls for CUDA tensors (NCCL behind them; backends/registry.h says what each does).
namespace devices {
bool available();                                  // this build has a device plane
std::string whyNotUsable(int device);              // "" when a tensor on cuda:`device` can be used
std::string whyNotReduced(DType dtype);            // "" when the device plane reduces `dtype`
std::shared_ptr<void> recordCallerWork(int device, void *stream);  // Request::readyEvent
}  // namespace devices

}  // namespace hora
