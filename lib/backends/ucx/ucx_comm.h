// SPDX-License-Identifier: Apache-2.0
// UcxComm: one UCX worker per process set with an endpoint to every peer, and tagged point-to-point
// messages on it: the UCX plane's Link (core/link.h). The collectives are core's
// (core/collectives/), written once over any Link.
//
// Waiting: a rank that waits for a peer polls the worker for a short while (a reply is usually
// due within microseconds), then sleeps on the worker's event file descriptor until UCX has
// something for it, so that an idle or long-waiting rank costs no CPU. The waits end with
// HORA_ERR_TIMEOUT after HORA_TIMEOUT_S and with HORA_ERR_PEER_LOST when UCX reports a peer's
// endpoint failed.
//
// Tags: [63..48] 16 bits of a job secret that rank 0 draws and sends over the group's control
// plane (which the launcher or the job token protects) | [47..32] the sender's rank | [31..0] a
// sequence number per ordered pair of ranks: the k-th message rank a sends to rank b carries k,
// and the k-th receive b posts from a asks for k, which is the Link's contract (messages between
// two ranks match in posting order). A message is matched only by the exact tag, so traffic of
// another job or of another process set never matches.
#pragma once

#include <sys/types.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "base/interrupt.h"
#include "base/knobs.h"
#include "core/link.h"
#include "core/world.h"

namespace hora {

class UcxComm final : public Link {
 public:
  // Collective over `group`: creates the worker, exchanges worker addresses over the group's
  // control plane, connects to every peer. Throws Error(HORA_ERR_BACKEND) naming UCX's failure.
  // Reads HORA_TIMEOUT_S, HORA_UCX_SPIN_US and the tuning (HORA_UCX_DIRECT_KB, _SMALL_KB,
  // _CHUNK_KB, HORA_HIERARCHICAL) from `knobs`.
  UcxComm(Group &group, const Knobs &knobs);
  ~UcxComm() override;
  UcxComm(const UcxComm &) = delete;
  UcxComm &operator=(const UcxComm &) = delete;

  // Link.
  const char *name() const override { return "ucx"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const LinkTuning &tuning() const override { return tuning_; }
  // The ranks of each host (by UCX's shared-memory reach: host name, boot id, pid namespace),
  // hosts ordered by their lowest rank, ranks ascending; and this rank's host.
  const std::vector<std::vector<int>> &hosts() const override { return hosts_; }
  int hostIndex() const override { return hostIndex_; }
  Ticket postSend(int peer, const void *data, size_t bytes) override;
  Ticket postRecv(int peer, void *data, size_t bytes) override;
  void wait(Ticket ticket) override;
  // Cancels the request and waits for it (bounded: UCX completes cancels at once).
  void drop(Ticket ticket) override;
  // One message each: the receiver probes for the sender's next sequence number and learns the
  // length from it.
  void sendBlob(const std::vector<int> &peers, const std::string &blob) override;
  std::string recvBlob(int peer) override;
  // Names `what` in the timeout and lost-peer errors of the waits within.
  void guard(const char *what, const std::function<void()> &body) override;
  // Any thread (a set's abort): every wait, now or later, throws Error(why) within its next
  // slice (100 ms); the endpoints close when the comm is destroyed, which peers see as a lost
  // peer.
  void interrupt(const Status &why) override { interrupted_.raise(why); }
  // Held by whoever drives the worker: the set's cycle (each collective) and the engine thread
  // while it arms the bell between cycles; the two can be different threads (caller cycles).
  std::mutex *driveLock() override { return &mutex_; }

  // What each endpoint runs on, for the log ("rank 1: tcp/eth0; rank 2: ...").
  std::string transports();

  std::mutex &mutex() { return mutex_; }
  // With mutex() held, between cycles: drives the worker, and returns false if a message of this
  // job is already waiting (a peer has started the next cycle) or UCX has events pending;
  // otherwise arms the worker so that the next message makes eventFd() readable.
  bool armForNextCycle();
  int eventFd() const { return eventFd_; }

  // Called by UCX from progress when an endpoint fails.
  void peerFailed(int peer, ucs_status_t status);

 private:
  // A posted transfer: a slot of the table that tickets index (ticket = slot + 1).
  struct Op {
    void *request = nullptr;  // nullptr once complete (or completed in the call)
    int peer = -1;            // -1: a free slot
    bool isRecv = false;
    size_t bytes = 0;
  };
  uint64_t tagFrom(int peer, uint32_t seq) const;
  uint64_t tagTo(uint32_t seq) const;
  Ticket track(void *request, int peer, bool isRecv, size_t bytes);
  Op &slot(Ticket ticket);
  void release(Ticket ticket);
  // Whether op has completed; frees its request. Throws for a failed transfer or a wrong length.
  bool complete(Op &op);
  // Whether a wait depends on `peer`: it has transfers outstanding with it.
  bool waitsOn(int peer) const { return outstanding_[static_cast<size_t>(peer)] > 0; }
  // Drives the worker until done() is true: a short poll, then sleeps on the event fd. Throws on
  // the deadline or a failed peer; `what` names the wait in the message, and the peers
  // involved(rank) names are those it waits for.
  template <typename Done, typename Involved>
  void progressUntil(Done done, const char *what, Involved involved);
  template <typename Involved>
  void checkPeers(const char *what, Involved involved);
  void startWorker(bool eagerOnly);
  void exchangeAddresses(Group &group);
  void closeEndpoints();
  void startKeeper();
  void stopKeeper();

  int rank_ = 0;
  int size_ = 1;
  double timeoutS_;
  LinkTuning tuning_;
  uint64_t secret_ = 0;  // already shifted into tag bits 63..48
  std::vector<uint32_t> sendSeq_, recvSeq_;  // by peer rank: the next message's sequence number
  std::vector<Op> ops_;                     // the ticket table
  std::vector<size_t> free_;                // free slots of ops_
  std::vector<int> outstanding_;            // by peer rank: transfers posted and not yet done
  const char *what_ = "collective";         // guard()'s name for the waits within
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int eventFd_ = -1;
  std::vector<ucp_ep_h> eps_;    // by peer rank; nullptr for this rank
  std::vector<pid_t> pids_;      // by peer rank
  std::vector<bool> sameHost_;   // by peer rank: shares this host (UCX may use shared memory)
  std::vector<std::vector<int>> hosts_;
  int hostIndex_ = 0;
  std::vector<std::pair<UcxComm *, int>> errArgs_;  // what each endpoint's error handler gets
  std::vector<ucs_status_t> failed_;  // by peer rank: UCS_OK, or what UCX reported
  std::chrono::nanoseconds spin_;
  std::chrono::steady_clock::time_point lastPidCheck_{};
  std::mutex mutex_;
  std::thread keeper_;  // progresses the worker between collectives
  int keeperStop_ = -1;
  Interrupt interrupted_;
};

// One line on UCX for hora-info: version and the transports this machine offers.
std::string describeUcx();

}  // namespace hora
