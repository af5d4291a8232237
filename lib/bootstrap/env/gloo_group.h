// SPDX-License-Identifier: Apache-2.0
// The env:// and Slurm worlds' transport: a group whose control plane runs on a Gloo context over
// TCP. The Gloo backend (backends/gloo) moves data on the same context.
#pragma once

#include <gloo/context.h>
#include <poll.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/interrupt.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/env/tcp_store.h"
#include "core/link.h"

namespace hora {

// The Gloo plane's Link (core/link.h): hora's own transfers on a Gloo context's TCP pairs,
// driven by the calling thread alone. The collectives are core's (core/collectives/).
//
// After setup (rendezvous, job token, address cards: Gloo's own collectives) every pair is put
// in Gloo's synchronous mode, which takes its socket out of Gloo's device thread, and from then
// on the mesh reads and writes the sockets itself, non-blocking under poll(): every posted
// transfer moves whenever the caller waits for any of them, so a rank sends and receives at once,
// as fast as the kernel takes the bytes, and reduces what has arrived while the rest is on the
// wire. In the asynchronous mode that gloo::allreduce and friends need, the device thread reads
// each message and wakes the caller; when it finds the pair's lock held by the caller it returns
// to a level-triggered epoll_wait at once, and where both threads share one CPU (a launcher that
// binds each rank to a core, hora's own engine-thread binding, or just a busy 2-core host) it
// spins there until the scheduler's next tick preempts it: 4 ms a message at 250 Hz
// (docs/gloo-speed.md). Here a message costs one write and one wake-up of the thread that waits
// for it.
//
// A pair is a byte stream each way: messages are raw bytes matched by order (both sides know
// each length, the Link contract), queued per peer and direction, and consecutive ones go out in
// one writev (come in with one readv). One thread drives it at a time (the set engine's cycle
// lock).
class GlooMesh final : public Link {
 public:
  // Switches every pair of `context` to synchronous mode and takes its socket (for good: Gloo's
  // own collectives can no longer run on this context). peerAddresses[r]: rank r's end of its
  // pair to this rank ("ip:port", as the peers told in their address cards).
  GlooMesh(std::shared_ptr<gloo::Context> context, const std::vector<std::string> &peerAddresses);

  const char *name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const LinkTuning &tuning() const override { return tuning_; }
  Ticket postSend(int peer, const void *data, size_t bytes) override;
  Ticket postRecv(int peer, void *data, size_t bytes) override;
  // A peer that lets nothing move for the context's timeout fails it ("Timed out"), a closed or
  // reset connection too; guard() turns either into hora's words.
  void wait(Ticket ticket) override;
  void drop(Ticket ticket) override;
  void guard(const char *what, const std::function<void()> &body) override;
  // Any thread: every transfer on the mesh, now or later, throws Error(why); the sockets are shut
  // down both ways, so a transfer blocked in poll wakes at once and every peer reads the end of
  // its connection to this rank (their waits end with a lost peer, not a timeout).
  void interrupt(const Status &why) override;

 private:
  // One posted message; `moved` of its bytes have gone out or come in.
  struct Transfer {
    uint8_t *data;
    size_t bytes, moved;
  };
  // A peer's messages one way: posted in order, completed in order.
  struct Queue {
    std::deque<Transfer> pending;
    uint64_t posted = 0, completed = 0;
  };
  Ticket post(int peer, bool send, void *data, size_t bytes);
  bool isDone(Ticket ticket) const;
  // One writev or readv on the head of `queue` (up to a slice, across consecutive messages).
  // Returns the bytes moved.
  size_t pump(int peer, bool send, Queue &queue);
  // Every queue once; whether any bytes moved.
  bool progress();
  // A transfer fails after timeoutMs_ without progress (never if negative).
  struct Deadline {
    explicit Deadline(int64_t timeoutMs)
        : patience(timeoutMs), at(std::chrono::steady_clock::now() + patience) {}
    void progressed();
    std::chrono::milliseconds patience;
    std::chrono::steady_clock::time_point at;
  };
  // Each call moves at most this much, so that sending, receiving and reducing take turns and
  // neither direction idles while the other copies megabytes.
  size_t slice() const { return 4 * tuning_.chunkBytes; }
  // Until a socket with something queued can move bytes; throws past the deadline, naming
  // `peer` (the one waited for). `brief`: a small message whose reply is due, so look for it
  // for spinUs_ (yielding the core between looks) before sleeping in poll.
  void await(int peer, Deadline &deadline, bool brief);
  // Throws the error of a transfer with `peer` (error 0: the peer closed the connection): a
  // MeshError with its status, which glooCall completes with the collective and the peer.
  [[noreturn]] void fail(int peer, const char *what, int error) const;

  std::shared_ptr<gloo::Context> context_;
  // Doubling up to 64 KiB, reduced in 64 KiB chunks: docs/gloo-speed.md measured the sizes
  // around them. One peer at a time, no host awareness (the hierarchy composes the shared
  // segment with this plane instead).
  LinkTuning tuning_;
  int rank_;
  int size_;
  int64_t timeoutMs_;              // without progress, a transfer fails after this; -1: never
  std::chrono::microseconds spinUs_{30};  // await(brief): how long to look (docs/gloo-speed.md)
  std::vector<int> sockets_;       // by peer rank: the pair's socket
  std::vector<std::string> peerNames_;  // by peer rank: the socket's remote address, for errors
  std::vector<Queue> sends_, recvs_;    // by peer rank
  size_t pendingBytes_ = 0;        // posted and not yet moved, every queue
  std::vector<pollfd> pollFds_;    // await's, kept between calls
  bool outOfStep_ = false;         // a transfer was dropped half-moved: the streams are lost
  Interrupt interrupted_;
};

// The connected inet socket of this process with each pair of ends (local "ip:port", remote
// "ip:port"), -1 where there is none or the local end is "". For GlooMesh; exposed for its test.
std::vector<int> socketsByEnds(const std::vector<std::pair<std::string, std::string>> &ends);

// Rendezvous through hora's TCP store (keys under `prefix`), then a full mesh of TCP pairs.
// Every collective of the control plane waits at most timeoutS for a peer.
class GlooGroup final : public Group {
 public:
  // localAddress: the address peers reach this rank at (see routeAddressTo in
  // bootstrap/env/env_bootstrap.h).
  // presence: the group's side channel (through the same store), on which each phase of
  // forming it is said (core/forming.h); may be null.
  GlooGroup(std::shared_ptr<TcpStoreClient> store, const std::string &prefix, int rank, int size,
            const std::string &localAddress, double timeoutS, std::unique_ptr<Presence> presence);
  ~GlooGroup() override;

  ControlPlane &control() override { return *plane_; }
  void poison(int, const std::string &) override {}
  bool usesSockets() const override { return true; }
  Presence *presence() override { return presence_.get(); }
  void interrupt(const Status &why) override {
    if (mesh_) mesh_->interrupt(why);
  }
  // The mesh every collective of this group runs on (control plane and Gloo backend alike).
  const std::shared_ptr<GlooMesh> &mesh() const { return mesh_; }
  double timeoutS() const { return timeoutS_; }

 private:
  std::shared_ptr<gloo::Context> context_;
  std::shared_ptr<GlooMesh> mesh_;
  std::unique_ptr<ControlPlane> plane_;
  double timeoutS_;
  std::unique_ptr<Presence> presence_;
  std::vector<std::string> peerAddresses_;  // by peer rank: its pair to this rank listens there
};

// Runs `body`, turning Gloo's exceptions into hora's: timeouts -> HORA_ERR_TIMEOUT, a closed or
// reset connection -> HORA_ERR_PEER_LOST, anything else -> HORA_ERR_BACKEND, naming `what`.
template <typename F>
void glooCall(const char *what, int rank, F &&body);

}  // namespace hora

#include "bootstrap/env/gloo_call.inl"
