// SPDX-License-Identifier: Apache-2.0
// Forming the world: which launcher started this process, and the Bootstrap (core/world.h) it
// gives. Each launcher's world lives in its folder (mpi/, env/) with its own transport.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/knobs.h"
#include "core/world.h"

namespace hora {

// Forms the world from the environment (in this order: MPI launcher, then env://, then Slurm, else a
// world of one; HORA_BOOTSTRAP overrides). Throws Error with a status and what was missing.
std::unique_ptr<Bootstrap> createBootstrap(const Knobs &knobs);

// At process exit, once the runtime has stopped: finalizes MPI if hora initialized it. hora never
// finalizes earlier, so that hora_init after hora_shutdown finds MPI still usable.
void finalizeAtExit();

// hora_elastic_world_changed: 1 when horarun's agents are forming a new world for this elastic
// worker, 0 when not or outside an elastic job; throws Error when their store cannot be asked.
// (bootstrap/env/elastic.cpp)
int elasticWorldChanged();
// Whether a world this process was forming since the last call was given up by horarun's agents
// while it formed (its waits ended for that reason); resets the answer. hora_init then joins the
// agents' next world instead of failing. (bootstrap/env/elastic.cpp)
bool takeElasticFormationAbandoned();

// A world of one: no launcher, no MPI.
std::unique_ptr<Bootstrap> createSingleBootstrap();

}  // namespace hora
