// SPDX-License-Identifier: Apache-2.0
// The composition root: the one place that knows every layer. It decides how the world is formed
// (lib/bootstrap) and which backends move data (lib/backends), and hands both to the engine
// (lib/core) through core/world.h's Fabric. It also holds the process's running engine for the
// C API, and is the C API's one way to the device plane.
#pragma once

#include <cstdint>
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

// Engine::start on the default fabric. Throws Error with the init status.
std::shared_ptr<Engine> startRuntime(const Knobs &knobs);

// The process's runtime, for the C API: at most one running Engine at a time. hora_init after
// hora_shutdown starts a new one in the same process, and the process's own settings (the join
// mode) are handed to each.

// The running runtime, or null. Any thread, without waiting for a slow start or stop.
std::shared_ptr<Engine> currentRuntime();
// hora_init: nothing when a runtime is running; otherwise reaps one that stopped on its own and
// starts one from the environment's knobs (startRuntime). Throws Error with the init status.
void initRuntime();
// hora_shutdown: stops the running runtime (collective). False when there is none.
bool shutdownRuntime();
// hora_elastic_world_changed (bootstrap's elasticWorldChanged) while a runtime exists, else 0.
int runtimeWorldChanged();
// hora_set_join_mode: the process's join mode (HORA_JOIN_ZERO_FILL, HORA_JOIN_ALLREDUCE_ONLY),
// set also before the first runtime and kept across hora_shutdown; the running runtime's
// requests carry it from now on (Engine::setJoinMode).
void setProcessJoinMode(uint8_t mode);

// The device plane as the C API sees it, without a backend's header: the registry's rules and
// calls for CUDA tensors (NCCL behind them; backends/registry.h says what each does).
namespace devices {
bool available();                                  // this build has a device plane
std::string whyNotUsable(int device);              // "" when a tensor on cuda:`device` can be used
std::string whyNotReduced(DType dtype);            // "" when the device plane reduces `dtype`
std::shared_ptr<void> recordCallerWork(int device, void *stream);  // Request::readyEvent
}  // namespace devices

}  // namespace hora
