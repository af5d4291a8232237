// SPDX-License-Identifier: Apache-2.0
// The exchange family, for vectors small enough that the number of message latencies decides:
// recursive doubling, the direct allreduce and the host-aware allreduce. Each rank ends with
// every rank's contribution reduced in an order its partners share, so the bits agree (the ops
// commute).
#include <cstring>

#include "core/collectives/algorithms.h"
#include "core/collectives/common.h"

namespace hora::collectives {

// log2(P) exchanges of the whole vector with partners at doubling distance; with P not a power
// of two the ranks above the largest power of two fold into a partner first and get the result
// back last. Each exchange reduces "mine op= theirs" on both sides.
void recursiveDoubling(Link &link, const Call &call) {
  const int n = link.size(), r = link.rank();
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const size_t bytes = static_cast<size_t>(call.count) * call.esize;
  uint8_t *theirs = grow(*call.scratch, bytes);
  const int extra = n - p2;
  if (r >= p2) {  // fold into rank r - p2, get the result back last
    Transfers t(link);
    t.send(r - p2, call.buf, bytes);
    t.recv(r - p2, call.buf, bytes);
    t.waitAll();
    return;
  }
  if (r < extra) {
    Transfers t(link);
    t.recv(r + p2, theirs, bytes);
    t.waitAll();
    (*call.combine)(call.buf, theirs, call.count);
  }
  for (int mask = 1; mask < p2; mask <<= 1) {
    const int peer = r ^ mask;
    Transfers t(link);
    t.recv(peer, theirs, bytes);
    t.send(peer, call.buf, bytes);
    t.waitAll();
    (*call.combine)(call.buf, theirs, call.count);
  }
  if (r < extra) {
    Transfers t(link);
    t.send(r + p2, call.buf, bytes);
    t.waitAll();
  }
}

// Every rank sends its vector to every other and reduces all of them itself, in rank order: one
// message latency instead of log2(P).
void directAllreduce(Link &link, const Call &call) {
  const int n = link.size(), r = link.rank();
  const size_t bytes = static_cast<size_t>(call.count) * call.esize;
  uint8_t *slots = grow(*call.scratch, static_cast<size_t>(n) * bytes);
  auto slot = [&](int p) { return slots + static_cast<size_t>(p) * bytes; };
  std::memcpy(slot(r), call.buf, bytes);
  Transfers t(link);
  for (int i = 1; i < n; ++i) t.recv(mod(r - i, n), slot(mod(r - i, n)), bytes);
  for (int i = 1; i < n; ++i) t.send(mod(r + i, n), slot(r), bytes);
  t.waitAll();
  std::memcpy(call.buf, slot(0), bytes);
  for (int p = 1; p < n; ++p) (*call.combine)(call.buf, slot(p), call.count);
}

// Across hosts with several ranks on some: each host's ranks send their vectors to its lowest
// rank, which reduces them in rank order; these leaders exchange their hosts' results directly
// and each reduces them in host order; each leader sends the result back to its host. Only one
// message per pair of leaders crosses between hosts.
void hostAwareAllreduce(Link &link, const Call &call) {
  const int r = link.rank();
  const std::vector<std::vector<int>> &hosts = link.hosts();
  const auto me = static_cast<size_t>(link.hostIndex());
  const std::vector<int> &mine = hosts[me];
  const int leader = mine[0];
  const size_t bytes = static_cast<size_t>(call.count) * call.esize;
  if (r != leader) {
    Transfers t(link);
    t.send(leader, call.buf, bytes);
    t.recv(leader, call.buf, bytes);  // arrives only after the leader has everyone's vector
    t.waitAll();
    return;
  }
  uint8_t *slots = grow(*call.scratch, std::max(mine.size(), hosts.size()) * bytes);
  auto slot = [&](size_t i) { return slots + i * bytes; };
  {
    Transfers t(link);
    for (size_t i = 1; i < mine.size(); ++i) t.recv(mine[i], slot(i), bytes);
    t.waitAll();
  }
  for (size_t i = 1; i < mine.size(); ++i) (*call.combine)(call.buf, slot(i), call.count);
  {
    Transfers t(link);
    for (size_t h = 0; h < hosts.size(); ++h) {
      if (h != me) t.recv(hosts[h][0], slot(h), bytes);
    }
    for (size_t h = 0; h < hosts.size(); ++h) {
      if (h != me) t.send(hosts[h][0], call.buf, bytes);
    }
    t.waitAll();
  }
  std::memcpy(slot(me), call.buf, bytes);
  std::memcpy(call.buf, slot(0), bytes);
  for (size_t h = 1; h < hosts.size(); ++h) (*call.combine)(call.buf, slot(h), call.count);
  Transfers down(link);
  for (size_t i = 1; i < mine.size(); ++i) down.send(mine[i], call.buf, bytes);
  down.waitAll();
}

// Several hosts, some with several ranks, few hosts.
bool hostAwareFits(const Link &link) {
  const size_t hosts = link.hosts().size();
  return hosts > 1 && hosts < static_cast<size_t>(link.size()) && hosts <= 16;
}

}  // namespace hora::collectives
