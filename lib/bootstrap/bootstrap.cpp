// SPDX-License-Identifier: Apache-2.0
// Which bootstrap forms the world, decided from the environment in DESIGN.md's order.
#include "bootstrap/bootstrap.h"

#include <cstdlib>

#include "base/error.h"
#include "hora_config.h"
#if HORA_HAVE_MPI
#include "bootstrap/mpi/mpi_bootstrap.h"
#endif

namespace hora {
namespace {

bool isSet(const char *name) {
  const char *v = std::getenv(name);
  return v != nullptr && v[0] != '\0';
}

bool launchedByMpi() {
  return isSet("OMPI_COMM_WORLD_SIZE") || isSet("PMI_SIZE") || isSet("PMIX_RANK");
}

bool envRendezvous() {
  return isSet("MASTER_ADDR") && isSet("MASTER_PORT") && isSet("RANK") && isSet("WORLD_SIZE");
}

bool slurmTask() { return isSet("SLURM_PROCID") && isSet("SLURM_NTASKS"); }

std::unique_ptr<Bootstrap> mpiBootstrap(const Knobs &knobs) {
#if HORA_HAVE_MPI
  return createMpiBootstrap(knobs.timeoutS);
#else
  HORA_THROW(HORA_ERR_UNSUPPORTED,
             "hora_init: the MPI bootstrap was asked for (launched by mpirun, or HORA_BOOTSTRAP=mpi) "
             "but this build has no MPI (meson option mpi)");
#endif
}

[[noreturn]] void envNotAvailable(const char *why) {
  HORA_THROW(HORA_ERR_UNSUPPORTED, "hora_init: ", why,
             ", but the env:// and Slurm bootstraps are not available in this build yet "
             "(issue 4); start the job with mpirun, or unset HORA_BOOTSTRAP for a world of one");
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
  if (mode == "env") envNotAvailable("HORA_BOOTSTRAP=env was set");
  if (launchedByMpi()) return mpiBootstrap(knobs);
  if (envRendezvous()) {
    const char *ws = std::getenv("WORLD_SIZE");
    if (std::string(ws) == "1") return createSingleBootstrap();
    envNotAvailable("MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE are set");
  }
  if (slurmTask()) {
    if (std::string(std::getenv("SLURM_NTASKS")) == "1") return createSingleBootstrap();
    envNotAvailable("this is a Slurm task of a multi-task step");
  }
  return createSingleBootstrap();
}

}  // namespace hora
