// SPDX-License-Identifier: Apache-2.0
// The GPU data plane: one NCCL communicator per process set and device, behind DeviceExecutor.
#pragma once

#include <memory>

#include "core/control_plane.h"
#include "core/device_executor.h"

namespace hora {

// Collective over `control` (every rank of the set calls it at the same response): rank 0 makes
// NCCL's unique id, the control plane (MPI or hora's TCP store) carries it to the others, and
// every rank joins a non-blocking communicator on `device`, waiting at most timeoutS before
// aborting it with HORA_ERR_TIMEOUT. Throws Error(HORA_ERR_BACKEND) naming NCCL's error.
// device < 0: this rank has no tensor naming one (it joined): local rank modulo the GPUs.
std::unique_ptr<DeviceExecutor> createNcclExecutor(ControlPlane &control, int device, int localRank,
                                                   double timeoutS);

}  // namespace hora
