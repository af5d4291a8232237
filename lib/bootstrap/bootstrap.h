// SPDX-License-Identifier: Apache-2.0
// Who am I and who are my peers: the world a bootstrap forms, and the groups (process sets) in it.
#pragma once

#include <memory>
#include <string>
#include <vector>

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

// A set of ranks with its own private channels: the world, or a process set. Negotiation runs
// over control(); a backend built for the group (backends/registry.h) moves the data.
class Group {
 public:
  virtual ~Group() = default;
  virtual ControlPlane &control() = 0;
  int rank() { return control().rank(); }
  int size() { return control().size(); }
  // The group is unusable (a peer is lost or a collective timed out): teardown must then not
  // make collective calls that could hang.
  virtual void poison() = 0;
};

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual const char *launcher() const = 0;  // "mpi", "single"
  virtual const Topology &topology() const = 0;
  // Where the world met, for the init log line ("store 10.0.0.1:29500"); empty if nowhere.
  virtual std::string rendezvousPoint() const { return ""; }
  // The world as a group; called once.
  virtual std::unique_ptr<Group> worldGroup() = 0;
  // Collective over the world, from the thread that owns `world`: the group of `ranks` (sorted,
  // distinct world ranks). Ranks outside it get nullptr.
  virtual std::unique_ptr<Group> createGroup(Group &world, const std::vector<int> &ranks) = 0;
};

// Forms the world from the environment (DESIGN.md: MPI launcher, then env://, then Slurm, else a
// world of one; HORA_BOOTSTRAP overrides). Throws Error with a status and what was missing.
std::unique_ptr<Bootstrap> createBootstrap(const Knobs &knobs);

// At process exit, once the runtime has stopped: finalizes MPI if hora initialized it. hora never
// finalizes earlier, so that hora_init after hora_shutdown finds MPI still usable.
void finalizeAtExit();

// A world of one: no launcher, no MPI.
std::unique_ptr<Bootstrap> createSingleBootstrap();

}  // namespace hora
