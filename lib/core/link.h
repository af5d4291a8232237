// SPDX-License-Identifier: Apache-2.0
// Link: a rank's point-to-point connection to every other rank of its group. It is all that a
// network plane provides (the Gloo mesh's TCP pairs, UCX's tagged messages); the collectives
// (core/collectives/) are written once against it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"

namespace hora {

// How a link likes to be driven: the figures the algorithm tables' size rules read
// (core/collectives/algorithms.h). Each plane fills its own from its knobs.
struct LinkTuning {
  size_t directBytes = 0;        // allreduce "direct" while (size-1) x bytes fit here; 0: never
  size_t smallBytes = 64 << 10;  // latency-bound up to here: recursive doubling, binomial tree
  size_t chunkBytes = 64 << 10;  // pipeline unit: a ring's or a chain's chunk
  // Transfers with every peer at once cost about what one costs (allgather and alltoall then
  // exchange with all peers at once, a large broadcast runs down a chain); else peer by peer.
  bool concurrentPeers = false;
  // Small allreduces gather to one rank per host, and large ones with equal hosts run a ring
  // inside each host around a ring across hosts (needs hosts()).
  bool topologyAware = false;
};

class Link {
 public:
  using Ticket = uint64_t;

  virtual ~Link() = default;
  // "gloo", "ucx": in messages.
  virtual const char *name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const LinkTuning &tuning() const = 0;
  // The ranks of each host, hosts ordered by their lowest rank, ranks ascending; and this rank's
  // host. Default: every rank on a host of its own.
  virtual const std::vector<std::vector<int>> &hosts() const;
  virtual int hostIndex() const;

  // Messages between two ranks match in the order they are posted on each side: the k-th send
  // rank a posts to rank b lands in the k-th receive b posts from a, and the two give the same
  // length. The buffer must stay put until the ticket completes or is dropped. A posted transfer
  // moves whenever the link is driven (any wait), so a collective posts what it can before it
  // waits.
  virtual Ticket postSend(int peer, const void *data, size_t bytes) = 0;
  virtual Ticket postRecv(int peer, void *data, size_t bytes) = 0;
  // Drives every posted transfer until `ticket` has completed. Throws Error: HORA_ERR_TIMEOUT when
  // nothing moves for the link's timeout, HORA_ERR_PEER_LOST for a lost peer, the interrupt's
  // status after interrupt().
  virtual void wait(Ticket ticket) = 0;
  // Forgets a transfer that has not completed (a collective that threw): nothing touches its
  // buffer after this returns. The link is then fit only to fail.
  virtual void drop(Ticket ticket) = 0;

  // A message whose length only the sender knows (the control plane's blobs), to each of `peers`
  // at once. Default: two messages a peer, the 8-byte length and then the bytes, all posted
  // before the first wait.
  virtual void sendBlob(const std::vector<int> &peers, const std::string &blob);
  virtual std::string recvBlob(int peer);

  // Runs `body`, one collective on this link, turning the link's failures into hora's Error
  // naming `what`. Default: as it is.
  virtual void guard(const char *what, const std::function<void()> &body);
  // Any thread: every wait, now or later, throws Error(why).
  virtual void interrupt(const Status &why) = 0;
  // Held by whoever drives the link, where that can be another thread than the set's cycle (UCX
  // arms its worker between cycles); nullptr where the cycle lock suffices.
  virtual std::mutex *driveLock() { return nullptr; }

 private:
  mutable std::vector<std::vector<int>> alone_;  // hosts() by default
};

// The transfers of one step of a collective. What has not completed when it is destroyed (the
// collective threw) is dropped.
class Transfers {
 public:
  explicit Transfers(Link &link) : link_(link) {}
  ~Transfers();
  Transfers(const Transfers &) = delete;
  Transfers &operator=(const Transfers &) = delete;

  // Each returns the transfer's index, for waitOne. An empty message is not sent: both ends
  // know its length, so both skip it.
  size_t send(int peer, const void *data, size_t bytes);
  size_t recv(int peer, void *data, size_t bytes);
  void waitOne(size_t index);
  void waitAll();

 private:
  Link &link_;
  std::vector<Link::Ticket> tickets_;
  std::vector<bool> done_;
};

}  // namespace hora
