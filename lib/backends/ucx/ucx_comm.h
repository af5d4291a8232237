// SPDX-License-Identifier: Apache-2.0
// UcxComm: one UCX worker per process set with an endpoint to every peer, and tagged point-to-point
// messages on it. The collectives (ucx_collectives.h) are written against this and nothing else.
//
// Waiting: a rank that waits for a peer polls the worker for a short while (a reply is usually
// due within microseconds), then sleeps on the worker's event file descriptor until UCX has
// something for it, so that an idle or long-waiting rank costs no CPU. The waits end with
// HORA_ERR_TIMEOUT after HORA_TIMEOUT_S and with HORA_ERR_PEER_LOST when UCX reports a peer's
// endpoint failed.
//
// Tags: [63..48] 16 bits of a job secret that rank 0 draws and sends over the group's control
// plane (which the launcher or the job token protects) | [47..32] the sender's rank | [31..0] a
// message sequence number that every rank advances alike (reserve()). A message is matched only by
// the exact tag, so traffic of another job or of another process set never matches.
#pragma once

#include <sys/types.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "base/interrupt.h"
#include "base/knobs.h"
#include "core/world.h"

namespace hora {

class UcxComm {
 public:
  // Collective over `group`: creates the worker, exchanges worker addresses over the group's
  // control plane, connects to every peer. Throws Error(HORA_ERR_BACKEND) naming UCX's failure.
  // Reads HORA_TIMEOUT_S and HORA_UCX_SPIN_US from `knobs`.
  UcxComm(Group &group, const Knobs &knobs);
  ~UcxComm();
  UcxComm(const UcxComm &) = delete;
  UcxComm &operator=(const UcxComm &) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // The ranks of each host (by UCX's shared-memory reach: host name, boot id, pid namespace),
  // hosts ordered by their lowest rank, ranks ascending; and this rank's host.
  const std::vector<std::vector<int>> &hosts() const { return hosts_; }
  int hostIndex() const { return hostIndex_; }

  // `n` consecutive sequence numbers for one collective; every rank reserves alike.
  uint32_t reserve(uint32_t n) {
    const uint32_t first = seq_;
    seq_ += n;
    return first;
  }

  // Outstanding operations of one collective. Destroying it cancels what has not completed (a
  // collective that throws leaves no request writing into freed memory).
  class Batch {
   public:
    explicit Batch(UcxComm &comm) : comm_(comm) {}
    ~Batch();
    Batch(const Batch &) = delete;
    Batch &operator=(const Batch &) = delete;
    // Returns the index of the operation, for waitOne().
    size_t send(int peer, uint32_t seq, const void *buf, size_t bytes);
    size_t recv(int peer, uint32_t seq, void *buf, size_t bytes);
    void waitOne(size_t index);
    void waitAll();

   private:
    struct Op {
      void *request;  // nullptr once complete
      int peer;
      bool isRecv;
      size_t bytes;
    };
    bool complete(Op &op);
    UcxComm &comm_;
    std::vector<Op> ops_;
  };

  // A message of unknown length from `peer` (control plane blobs).
  std::string recvAny(int peer, uint32_t seq);

  // What each endpoint runs on, for the log ("rank 1: tcp/eth0; rank 2: ...").
  std::string transports();

  // Held by whoever drives the worker: the set's cycle (each collective) and the engine thread
  // while it arms the bell between cycles; the two can be different threads (caller cycles).
  std::mutex &mutex() { return mutex_; }
  // With mutex() held, between cycles: drives the worker, and returns false if a message of this
  // job is already waiting (a peer has started the next cycle) or UCX has events pending;
  // otherwise arms the worker so that the next message makes eventFd() readable.
  bool armForNextCycle();
  int eventFd() const { return eventFd_; }

  // Called by UCX from progress when an endpoint fails.
  void peerFailed(int peer, ucs_status_t status);
  // Any thread (a set's abort): every wait, now or later, throws Error(why) within its next
  // slice (100 ms); the endpoints close when the comm is destroyed, which peers see as a lost
  // peer.
  void interrupt(const Status &why) { interrupted_.raise(why); }

 private:
  friend class Batch;
  uint64_t tagFrom(int peer, uint32_t seq) const;
  uint64_t tagTo(uint32_t seq) const;
  // Drives the worker until done() is true: a short poll, then sleeps on the event fd. Throws on
  // the deadline or a failed peer; `what` and `peer` name the wait in the message.
  // Throws for a failed peer among those involved(rank) names.
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
  uint64_t secret_ = 0;  // already shifted into tag bits 63..48
  uint32_t seq_ = 0;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int eventFd_ = -1;
  std::vector<ucp_ep_h> eps_;
  std::vector<pid_t> pids_;      // by peer rank
  std::vector<bool> sameHost_;
  std::vector<std::vector<int>> hosts_;
  int hostIndex_ = 0;   // by peer rank: shares this host (UCX may use shared memory)           // by peer rank; nullptr for this rank
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
