// SPDX-License-Identifier: Apache-2.0
// The collectives of the UCX plane, on UcxComm's tagged messages. Every rank calls the same
// function with the same sizes in the same order (the engine's negotiation guarantees it), so
// every rank reserves the same sequence numbers.
//
//  - allreduce, tiny ((P-1) x bytes up to HORA_UCX_DIRECT_KB, 16 KiB by default): every rank
//    sends its vector to every other and reduces all P in rank order itself: one message latency.
//  - allreduce, small (up to HORA_UCX_SMALL_KB, 64 KiB by default): recursive doubling, log2(P)
//    exchanges of the whole vector; with P not a power of two the ranks above the largest power of
//    two fold into a partner first and get the result back last. Each exchange reduces
//    "mine op= theirs" on both sides, so every rank ends with the same bits (the ops commute).
//  - across hosts (ranks grouped by the host UCX sees them on): small allreduce and the
//    negotiation AND gather to each host's lowest rank, which exchange among themselves, so that
//    one message per pair of hosts crosses the network; large allreduce, with the same number of
//    ranks on every host, is a ring reduce-scatter inside each host, a ring allreduce of each
//    slice across hosts, and a ring allgather inside each host.
//  - allreduce, large: a ring reduce-scatter then a ring allgather, each of the P segments cut
//    into chunks (HORA_UCX_CHUNK_KB, 256 KiB by default) that flow independently: a chunk goes on to
//    the next rank the moment it has been reduced, so the steps of the ring overlap and the link
//    stays busy. Every segment is reduced by one rank and copied to the others: bits agree.
//  - reducescatter: the ring's first half on a copy of the input, segments = the blocks.
//  - broadcast: a binomial tree (small), a chunked chain from the root (large).
//  - allgatherv, alltoallv: every pair exchanges its blocks directly, all at once.
//  - the control plane: AND by direct exchange (recursive doubling for long vectors); gather to rank 0 and a binomial broadcast from
//    it, of blobs whose length the receiver learns from the message.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backends/ucx/ucx_comm.h"
#include "base/knobs.h"

namespace hora::ucx {

// dst[i] = dst[i] op src[i] for `count` elements (the op and dtype are bound in).
using Combine = std::function<void(void *dst, const void *src, int64_t count)>;

struct Tuning {
  size_t directBytes = 16 << 10;  // allreduce sends (P-1) x its bytes directly up to here
  size_t smallBytes = 64 << 10;   // up to here allreduce uses recursive doubling
  size_t chunkBytes = 256 << 10;  // pipeline unit of the ring and the broadcast chain
  bool topologyAware = true;      // host-aware small ops and the per-host ring (else flat)
  // HORA_UCX_DIRECT_KB, HORA_UCX_SMALL_KB, HORA_UCX_CHUNK_KB; topologyAware unless
  // HORA_HIERARCHICAL=off.
  static Tuning fromKnobs(const Knobs &knobs);
};

// In place on buf.
void allreduce(UcxComm &c, const Tuning &t, void *buf, int64_t count, size_t esize, const Combine &combine,
               std::vector<uint8_t> &scratch);
// `work` holds every block (counts[r] elements each, in rank order) and is clobbered; on return
// this rank's block in `work` holds the reduction.
void reduceScatterInPlace(UcxComm &c, const Tuning &t, void *work, const std::vector<int64_t> &counts,
                          size_t esize, const Combine &combine, std::vector<uint8_t> &scratch);
void broadcast(UcxComm &c, const Tuning &t, void *buf, size_t bytes, int root);
void allgatherv(UcxComm &c, const void *in, void *out, const std::vector<int64_t> &bytesPerRank);
void alltoallv(UcxComm &c, const void *in, const std::vector<int64_t> &sendBytes, void *out,
               const std::vector<int64_t> &recvBytes);

void andWords(UcxComm &c, std::vector<uint64_t> &words, std::vector<uint8_t> &scratch);
std::vector<std::string> gatherToRoot(UcxComm &c, const std::string &blob);
void broadcastFromRoot(UcxComm &c, std::string &blob);

}  // namespace hora::ucx
