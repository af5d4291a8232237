// SPDX-License-Identifier: Apache-2.0
// The collectives negotiation needs, over the ranks of one process set. Implemented by each
// bootstrap (MPI, env:// store, a world of one); the engine sees only this.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hora {

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Each call is collective over the set and blocks until every rank has joined it; waiting for
  // a peer longer than HORA_TIMEOUT_S throws Error(HORA_ERR_TIMEOUT).

  // Bitwise AND of `words` across ranks, in place (every rank passes the same length).
  virtual void allreduceAnd(std::vector<uint64_t> &words) = 0;
  // Rank 0 gets every rank's blob, in rank order; other ranks get an empty vector.
  virtual std::vector<std::string> gatherToRoot(const std::string &blob) = 0;
  // Rank 0's blob replaces everyone else's.
  virtual void broadcastFromRoot(std::string &blob) = 0;
};

}  // namespace hora
