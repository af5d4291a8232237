// SPDX-License-Identifier: Apache-2.0
// The UCX plane (Debian libucx-dev): data and negotiation for CPU tensors over whatever transports
// UCX picks (TCP, shared memory, InfiniBand/RoCE verbs; UCX_TLS and friends narrow the choice).
// Worker addresses travel over the group's own control plane, so it serves worlds formed by any
// launcher: mpirun, env:// variables, Slurm.
#pragma once

#include <memory>
#include <string>

#include "base/knobs.h"
#include "core/backend.h"
#include "core/world.h"

namespace hora {

// Collective over `group`. Throws Error(HORA_ERR_BACKEND) when UCX cannot start or connect.
// From `knobs`: HORA_TIMEOUT_S, the HORA_UCX_* tuning, and HORA_HIERARCHICAL: unless it is off,
// small allreduces gather to one rank per host first, and large ones with the same number of
// ranks on every host run a ring inside each host around the ring across hosts (off: every
// collective over all ranks alike).
std::unique_ptr<Backend> createUcxBackend(Group &group, const Knobs &knobs);

// UCX's version and the transports this machine offers it, for hora-info.
std::string ucxDescription();

}  // namespace hora
