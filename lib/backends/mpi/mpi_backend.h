// SPDX-License-Identifier: Apache-2.0
// The MPI data plane.
#pragma once

#include <mpi.h>

#include <memory>

#include "base/knobs.h"
#include "core/backend.h"

namespace hora {

// Over `comm` (the bootstrap's data communicator); waits for peers up to HORA_TIMEOUT_S.
std::unique_ptr<Backend> createMpiBackend(MPI_Comm comm, const Knobs &knobs);

}  // namespace hora
