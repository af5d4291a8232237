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

// Waits for non-blocking MPI operations (`count` requests, all of which must complete):
// kPatient spins briefly (a peer is usually just behind), then sleeps with growing pauses so a
// rank waiting for its peers costs almost no CPU (negotiation); kBusy polls without sleeping, as
// a blocking MPI call would, so that a transfer in flight keeps moving (data). Throws
// Error(HORA_ERR_TIMEOUT) naming `what` after `timeoutS`, and at once the error a peer broadcast
// when it gave up (see mpiPlaneBroken). A collective cannot be cancelled, so the operation stays
// posted and may still write its buffers when a late peer arrives: on a timeout `buffers` (what
// the operation reads and writes, if hora owns it) is kept alive until the process exits, and
// hora makes no further MPI call in this process (the plane is broken, see below), so MPI has no
// chance to write into a buffer that was the application's.
enum class MpiWait { kPatient, kBusy };
void waitMpi(MPI_Request *requests, int count, double timeoutS, const char *what,
             const std::shared_ptr<void> &buffers, MpiWait how = MpiWait::kPatient);
inline void waitMpi(MPI_Request *request, double timeoutS, const char *what,
                    const std::shared_ptr<void> &buffers) {
  waitMpi(request, 1, timeoutS, what, buffers, MpiWait::kPatient);
}

// The MPI plane of this process is broken after a timeout or a lost peer: an MPI collective
// cannot be cancelled, so what is posted stays posted, and a peer that comes back (a stopped
// process resumed) would match it. The first call records why and tells every other rank of the
// world (a short message on a private communicator, which their waits look for); from then on
// every hora operation on MPI fails at once with that error, and hora makes no MPI call in this
// process again: not even MPI_Finalize at exit, which would wait for the missing rank (Open
// MPI's launcher then ends the job, as it does when a rank exits without finalizing).
void mpiPlaneBroken(int status, const std::string &why);
// Throws the error that broke the plane, if it is broken (a peer's word included).
void throwIfMpiBroken();
bool mpiPlaneIsBroken();

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
