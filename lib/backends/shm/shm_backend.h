// SPDX-License-Identifier: Apache-2.0
// The intra-host data path: allreduce among the ranks of one host through a shared segment,
// wrapped around the MPI or Gloo backend, which keeps every other collective.
#pragma once

#include <memory>
#include <string>

#include "base/knobs.h"
#include "bootstrap/bootstrap.h"
#include "core/backend.h"

namespace hora {

// Collective over `group`. When every rank of the group is on this host and a shared segment can
// be mapped, returns a backend that runs allreduce itself and forwards the rest to `inner`;
// otherwise returns `inner` unchanged, with the reason in *why.
//
// Allreduce of N bytes on P ranks, reduced where the tensors lie (no packing, nothing allocated
// per call):
//  - small (N <= 32 KiB): every rank copies its input into its staging slot; after one barrier
//    every rank reduces all slots itself, in rank order.
//  - large: a pipeline over 512 KiB windows of the vector, each cut into P shares. Every rank
//    copies each peer's share of its input into its export ring; rank r reduces share r (its
//    own input and the peers' exports) into its output and its result ring; every rank copies
//    the peers' results into its output. Ranks wait only for the progress counters of the data
//    they need, a window apart, not for barriers. Where the ranks' cores share a cache the rings
//    hand data over through it, so memory sees about one read of the input and one write of the
//    output per rank; where they share none (HORA_SHM_STREAM=auto probes that) the rings are
//    written with non-temporal stores and read from memory, which here is 3-4 times faster
//    than pulling each line out of the other core's cache.
//  - HORA_SHM=cma, large: no staging. Every rank publishes where its tensors lie; rank r reads
//    the peers' share r straight from their tensors (process_vm_readv, 128 KiB at a time) and
//    reduces it into its own output; then every rank reads each owner's reduced share from the
//    owner's output into its own. About 2.5x the vector's bytes move per rank instead of 4.5x,
//    but on this machine class the kernel copies at 6-9 GB/s where memcpy does 20-40, so it is
//    slower (64 MiB: 5.7 against 8.3 GB/s algbw) and not the default. Falls back to staging when
//    a rank cannot read its peers' memory or has more than 4096 tensors in one operation.
// Waiting blocks on a futex after a short spin; a lost peer or HORA_TIMEOUT_S ends it with an
// error naming the ranks that did not arrive.
std::unique_ptr<Backend> wrapWithShm(std::unique_ptr<Backend> inner, Group &group,
                                     const Knobs &knobs, std::string *why);

}  // namespace hora
