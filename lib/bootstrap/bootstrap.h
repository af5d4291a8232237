// SPDX-License-Identifier: Apache-2.0
// Who am I and who are my peers: the world a bootstrap forms, and its control plane.
#pragma once

#include <memory>
#include <string>

#include "base/knobs.h"
#include "core/control_plane.h"

namespace hora {

struct Topology {
  int rank = 0;
  int size = 1;
  int localRank = 0;  // among the ranks of this host
  int localSize = 1;
  int crossRank = 0;  // among the ranks with this local rank, one per host
  int crossSize = 1;
};

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual const char *launcher() const = 0;  // "mpi", "single"
  virtual const Topology &topology() const = 0;
  // Negotiation over the whole world.
  virtual ControlPlane &worldControl() = 0;
  // Marks the world unusable (a peer is lost or a collective timed out): teardown must then not
  // make collective calls that could hang.
  virtual void poison() = 0;
};

// Forms the world from the environment (DESIGN.md: MPI launcher, then env://, then Slurm, else a
// world of one; HORA_BOOTSTRAP overrides). Throws Error with a status and what was missing.
std::unique_ptr<Bootstrap> createBootstrap(const Knobs &knobs);

// A world of one: no launcher, no MPI.
std::unique_ptr<Bootstrap> createSingleBootstrap();

}  // namespace hora
