// SPDX-License-Identifier: Apache-2.0
// The MPI world: initialization, private communicators, topology, and MPI call checking.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "base/error.h"
#include "bootstrap/bootstrap.h"

namespace hora {

// "MPI_Allreduce failed on rank 3: MPI_ERR_TRUNCATE: message truncated" as Error(BACKEND).
[[noreturn]] void throwMpiError(const char *call, int code, const char *file, int line);

// Waits for a non-blocking MPI operation: spins briefly (a peer is usually just behind), then
// sleeps with growing pauses so a rank waiting for its peers costs almost no CPU. Throws
// Error(HORA_ERR_TIMEOUT) naming `what` after `timeoutS`. A collective cannot be cancelled, so
// the operation stays posted and may still write its buffers when a late peer arrives: on a
// timeout `buffers` (what the operation reads and writes) is kept alive until the process exits.
void waitMpi(MPI_Request *request, double timeoutS, const char *what,
             const std::shared_ptr<void> &buffers);

// A group's two private communicators: negotiation and data never share a communicator with
// each other or with the application.
class MpiGroup : public Group {
 public:
  virtual MPI_Comm dataComm() const = 0;
};

std::unique_ptr<Bootstrap> createMpiBootstrap(double timeoutS);

// MPI_Finalize, if hora called MPI_Init (see finalizeAtExit).
void finalizeMpiIfOurs();

}  // namespace hora

#define HORA_CHECK_MPI(call)                                                     \
  do {                                                                           \
    const int hora_mpi_rc_ = (call);                                             \
    if (hora_mpi_rc_ != MPI_SUCCESS)                                             \
      ::hora::throwMpiError(#call, hora_mpi_rc_, __FILE__, __LINE__);            \
  } while (0)
