// SPDX-License-Identifier: Apache-2.0
// The collectives, written once over a Link, and one table of named algorithms per collective.
//
// Each table lists its algorithms in the order their size rules are tried: the first whose rule
// picks the call runs it, and the last always can. The rules read the link's LinkTuning, so a
// plane states how it likes to be driven and never spells an algorithm itself. HORA_ALGORITHM
// ("allreduce=ring,broadcast=chain") forces a named algorithm wherever it can run; the backend
// tells the timeline which one ran (Backend::lastAlgorithm), and hora-info prints the tables.
//
// The families (one file each): ring.cpp (ring reduce-scatter and allgather, the ring and the
// two-level ring allreduce, the ring allgatherv), exchange.cpp (recursive doubling, the direct
// and the host-aware allreduce), tree.cpp (binomial tree and chain broadcast, the control
// plane's blob gather and broadcast), alltoall.cpp (pairwise and direct alltoallv, direct
// allgatherv). table.cpp holds the tables. Every rank calls the same collective with the same
// sizes in the same order (the engine's negotiation sees to it) and gets the same bits.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/link.h"

namespace hora::collectives {

// dst[i] = dst[i] op src[i] for `count` elements; op and dtype bound in. Must commute.
using Combine = std::function<void(void *dst, const void *src, int64_t count)>;

enum class Collective : uint8_t { kAllreduce, kReducescatter, kBroadcast, kAllgatherv, kAlltoallv };
constexpr size_t kNumCollectives = 5;
const char *collectiveName(Collective c);

// One call. The fields a collective does not read stay unset:
//   allreduce      buf (in place), count, esize, combine
//   reducescatter  buf (every block, in rank order; clobbered: on return this rank's block holds
//                  the result), counts (elements per rank), esize, combine
//   broadcast      buf, bytes, root
//   allgatherv     in, out, sizes (bytes per rank)
//   alltoallv      in, out, sizes (bytes to each rank), recvSizes (bytes from each)
struct Call {
  void *buf = nullptr;
  const void *in = nullptr;
  void *out = nullptr;
  int64_t count = 0;
  size_t esize = 1;
  size_t bytes = 0;  // the payload the size rules read; set by the entry points below
  int root = 0;
  const Combine *combine = nullptr;
  const std::vector<int64_t> *sizes = nullptr;
  const std::vector<int64_t> *recvSizes = nullptr;
  std::vector<uint8_t> *scratch = nullptr;  // grows to what an algorithm needs; kept between calls
};

struct Algorithm {
  const char *name;
  const char *rule;  // the size rule in words, for hora-info
  // Whether it can run this call on this link at all, and whether its size rule picks it.
  bool (*fits)(const Link &link, const Call &call);
  bool (*picks)(const Link &link, const Call &call);
  void (*run)(Link &link, const Call &call);
};

const std::vector<Algorithm> &table(Collective c);

// HORA_ALGORITHM: per collective, an algorithm that runs wherever it fits (else the rule
// decides).
class Choices {
 public:
  Choices() { forced_.fill(-1); }
  // "allreduce=ring,broadcast=chain"; "" forces nothing. Throws Error(HORA_ERR_INVALID_ARGUMENT)
  // naming the knob and what the tables hold.
  static Choices parse(const std::string &spec);
  const Algorithm &choose(Collective c, const Link &link, const Call &call) const;

 private:
  std::array<int, kNumCollectives> forced_;
};

// The tables in words, for hora-info: a line per collective.
std::string describeTables();

// The entry points: each picks by the table and runs; returns the algorithm's name (static).
const char *allreduce(Link &link, const Choices &choices, void *buf, int64_t count, size_t esize,
                      const Combine &combine, std::vector<uint8_t> &scratch);
const char *reducescatter(Link &link, const Choices &choices, void *work,
                          const std::vector<int64_t> &counts, size_t esize, const Combine &combine,
                          std::vector<uint8_t> &scratch);
const char *broadcast(Link &link, const Choices &choices, void *buf, size_t bytes, int root);
const char *allgatherv(Link &link, const Choices &choices, const void *in, void *out,
                       const std::vector<int64_t> &bytesPerRank);
const char *alltoallv(Link &link, const Choices &choices, const void *in,
                      const std::vector<int64_t> &sendBytes, void *out,
                      const std::vector<int64_t> &recvBytes);

// The control plane's messages whose length only the sender knows: every rank's blob to rank 0
// (rank order), and rank 0's blob to every rank (a binomial tree).
std::vector<std::string> gatherBlobs(Link &link, const std::string &blob);
void broadcastBlob(Link &link, std::string &blob);

}  // namespace hora::collectives
