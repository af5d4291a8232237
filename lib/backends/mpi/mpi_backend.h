// SPDX-License-Identifier: Apache-2.0
// The MPI data plane.
#pragma once

#include <mpi.h>

#include <memory>

#include "core/backend.h"

namespace hora {

std::unique_ptr<Backend> createMpiBackend(MPI_Comm comm, double timeoutS);

}  // namespace hora
