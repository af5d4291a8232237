// SPDX-License-Identifier: Apache-2.0
// The personalised exchanges: alltoallv peer by peer (pairwise) or with every peer at once
// (direct), and allgatherv with every peer at once (direct).
#include <cstring>

#include "core/collectives/algorithms.h"
#include "core/collectives/common.h"

namespace hora::collectives {
namespace {

// This rank's own block of an alltoallv: a local copy.
void keepOwnBlock(const Link &link, const Call &call, const std::vector<int64_t> &sendAt,
                  const std::vector<int64_t> &recvAt) {
  const auto me = static_cast<size_t>(link.rank());
  const auto bytes = static_cast<size_t>((*call.sizes)[me]);
  if (bytes > 0) {
    std::memmove(at(call.out, recvAt[me], 1), at(const_cast<void *>(call.in), sendAt[me], 1), bytes);
  }
}

}  // namespace

// size-1 steps; at step s every rank sends to rank+s and receives from rank-s, one pair at a
// time on each socket.
void pairwiseAlltoallv(Link &link, const Call &call) {
  const int n = link.size(), r = link.rank();
  const std::vector<int64_t> sendAt = offsetsOf(*call.sizes), recvAt = offsetsOf(*call.recvSizes);
  keepOwnBlock(link, call, sendAt, recvAt);
  for (int step = 1; step < n; ++step) {
    const auto to = static_cast<size_t>(mod(r + step, n)), from = static_cast<size_t>(mod(r - step, n));
    Transfers t(link);
    t.recv(static_cast<int>(from), at(call.out, recvAt[from], 1), static_cast<size_t>((*call.recvSizes)[from]));
    t.send(static_cast<int>(to), at(const_cast<void *>(call.in), sendAt[to], 1),
           static_cast<size_t>((*call.sizes)[to]));
    t.waitAll();
  }
}

// Every block at once: one message latency, the link schedules the rest.
void directAlltoallv(Link &link, const Call &call) {
  const int n = link.size(), r = link.rank();
  const std::vector<int64_t> sendAt = offsetsOf(*call.sizes), recvAt = offsetsOf(*call.recvSizes);
  keepOwnBlock(link, call, sendAt, recvAt);
  Transfers t(link);
  for (int i = 1; i < n; ++i) {
    const auto p = static_cast<size_t>(mod(r - i, n));
    t.recv(static_cast<int>(p), at(call.out, recvAt[p], 1), static_cast<size_t>((*call.recvSizes)[p]));
  }
  for (int i = 1; i < n; ++i) {
    const auto p = static_cast<size_t>(mod(r + i, n));
    t.send(static_cast<int>(p), at(const_cast<void *>(call.in), sendAt[p], 1), static_cast<size_t>((*call.sizes)[p]));
  }
  t.waitAll();
}

// This rank's block to every peer at once, every peer's block straight into place.
void directAllgatherv(Link &link, const Call &call) {
  const int n = link.size(), r = link.rank();
  const std::vector<int64_t> off = offsetsOf(*call.sizes);
  const auto me = static_cast<size_t>(r);
  const auto mine = static_cast<size_t>((*call.sizes)[me]);
  uint8_t *myOut = at(call.out, off[me], 1);
  if (mine > 0 && myOut != call.in) std::memmove(myOut, call.in, mine);
  Transfers t(link);
  for (int i = 1; i < n; ++i) {
    const auto p = static_cast<size_t>(mod(r - i, n));
    t.recv(static_cast<int>(p), at(call.out, off[p], 1), static_cast<size_t>((*call.sizes)[p]));
  }
  for (int i = 1; i < n; ++i) t.send(mod(r + i, n), myOut, mine);
  t.waitAll();
}

}  // namespace hora::collectives
