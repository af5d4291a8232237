// SPDX-License-Identifier: Apache-2.0
// Which bootstrap forms the world, decided from the environment in the documented order.
#include "bootstrap/bootstrap.h"

#include <cstdlib>
#include <string>

#include "base/error.h"
#include "base/knobs.h"
#include "bootstrap/env/env_bootstrap.h"
#include "bootstrap/env/launch_config.h"
#include "hora_config.h"
#if HORA_HAVE_MPI
#include "bootstrap/mpi/mpi_bootstrap.h"
#endif

namespace hora {
namespace {

// The launcher's variables (base/knobs.h: environmentValue); empty reads as unset.
const char *lookup(const char *name) {
  const char *v = environmentValue(name);
  return v != nullptr && v[0] != '\0' ? v : nullptr;
}

bool launchedByMpi() {
  return lookup("OMPI_COMM_WORLD_SIZE") || lookup("PMI_SIZE") || lookup("PMIX_RANK");
}

bool envRendezvous() {
  return lookup("MASTER_ADDR") && lookup("MASTER_PORT") && lookup("RANK") && lookup("WORLD_SIZE");
}

bool slurmTask() { return lookup("SLURM_PROCID") && lookup("SLURM_NTASKS"); }

// Where two sources give a world size, they must agree: an MPI world of 4 under WORLD_SIZE=2
// is a launch mistake that would otherwise surface as a hang or a wrong average.
void checkWorldSize(const Topology &t, const char *source) {
  for (const char *var : {"WORLD_SIZE", "SLURM_NTASKS"}) {
    const char *v = lookup(var);
    // SLURM_NTASKS describes this process's step only when srun started it (SLURM_PROCID set);
    // an mpirun inside an allocation may rightly use fewer ranks than the allocation has.
    if (v == nullptr || (std::string(var) == "SLURM_NTASKS" && !lookup("SLURM_PROCID"))) continue;
    if (std::string(v) != std::to_string(t.size)) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_init: the world formed by ", source, " has ",
                 t.size, " ranks but ", var, "=", v,
                 "; launch with matching sizes or unset the stale variable");
    }
  }
}

std::unique_ptr<Bootstrap> mpiBootstrap(const Knobs &knobs) {
#if HORA_HAVE_MPI
  std::unique_ptr<Bootstrap> b = createMpiBootstrap(knobs.timeoutS);
  checkWorldSize(b->topology(), "mpi");
  return b;
#else
  (void)knobs;
  HORA_THROW(HORA_ERR_UNSUPPORTED,
             "hora_init: the MPI bootstrap was asked for (launched by mpirun, or HORA_BOOTSTRAP=mpi) "
             "but this build has no MPI (meson option mpi)");
#endif
}

}  // namespace

void finalizeAtExit() {
#if HORA_HAVE_MPI
  finalizeMpiIfOurs();
#endif
}

std::unique_ptr<Bootstrap> createBootstrap(const Knobs &knobs) {
  const std::string &mode = knobs.bootstrap;
  if (mode == "mpi") return mpiBootstrap(knobs);
  if (mode == "single") return createSingleBootstrap();
  // An elastic worker has no RANK: the agents place it (before the MPI check: horarun removed
  // launcher variables from its environment, so none can be stale).
  if (elasticWorker(lookup) && (mode == "env" || mode == "auto")) {
    return createEnvBootstrap(readElasticConfig(lookup), knobs);
  }
  if (mode == "env") {
    // Explicit env: torchrun variables, else a Slurm task's.
    if (!envRendezvous() && slurmTask()) return createEnvBootstrap(readSlurmConfig(lookup), knobs);
    return createEnvBootstrap(readEnvConfig(lookup), knobs);
  }
  if (launchedByMpi()) return mpiBootstrap(knobs);
  if (envRendezvous()) return createEnvBootstrap(readEnvConfig(lookup), knobs);
  if (slurmTask()) return createEnvBootstrap(readSlurmConfig(lookup), knobs);
  checkNotPartOfAWorld(lookup);  // RANK=1 WORLD_SIZE=2 without MASTER_ADDR: not a world of one
  return createSingleBootstrap();
}

}  // namespace hora
