// SPDX-License-Identifier: Apache-2.0
// How the ranks of a shared segment wait for each other: a barrier, per-rank progress counters
// for the pipelined allreduce, a cache-line round-trip probe, and the bell of an idle engine.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "base/interrupt.h"
#include "core/backend.h"

namespace hora {

// Lives at the start of the shared segment: the segment comes zero-filled, and all zeros is the
// initial state. Each rank publishes the number of the last barrier it reached; a rank waits until
// every rank has reached its own. Waiting spins briefly, then sleeps on a futex: two ranks with
// two threads each may share two cores, and a sleeping waiter gives its core to the rank it waits
// for. Every member is an address-free atomic shared between the processes; none is guarded by a
// lock, each says below who writes it and what its stores publish.
struct ShmBarrierState {
  static constexpr int kMaxRanks = 256;
  // Futex word every waiter (ShmBarrier::block) sleeps on; bumped by every arrival and every
  // progress publication, so a sleeper wakes to re-check. Guards nothing itself.
  alignas(64) std::atomic<uint32_t> wakeups{0};
  // Ranks inside futex_wait on `wakeups`: an arrival issues FUTEX_WAKE only when it is non-zero
  // (seq_cst on both sides, so a waiter that counted itself is either seen or sees the bump).
  std::atomic<uint32_t> sleepers{0};
  // reached[r]: the last barrier rank r arrived at; written only by rank r (release), so a rank
  // that sees every reached[] at its epoch (acquire) sees everything the peers wrote into the
  // segment before arriving: staging halves, negotiation vectors, op descriptors, tables.
  alignas(64) std::atomic<uint64_t> reached[kMaxRanks];  // padding-free: read together
  // Per rank, for its engine sleeping between cycles (ShmBell): bell[r] is the futex word bumped
  // to wake rank r, by its own threads and by any peer's arrival; bellArmed[r], written by rank r,
  // says it sleeps there, which every barrier arrival checks (fences in ShmBarrier::wait and
  // ShmBell::arm order it against reached[]).
  alignas(64) std::atomic<uint32_t> bell[kMaxRanks];
  alignas(64) std::atomic<uint32_t> bellArmed[kMaxRanks];
  // Per rank, written only by it: how far it has got in each stage of the pipelined allreduce
  // (ShmBarrier::publish / awaitPeers), a cache line each so a writer never steals a reader's.
  // A store (release) publishes the ring slots that stage wrote; a peer's acquire load sees them.
  static constexpr int kStages = 4;
  struct alignas(64) Progress {
    std::atomic<uint64_t> stage[kStages];
  };
  Progress progress[kMaxRanks];
  // Per rank r > 0: the cache line rank 0 and rank r bounce to time a transfer between their
  // cores (ShmBarrier::pingPong); rank 0 writes odd values, rank r even ones. Guards nothing.
  struct alignas(64) PingLine {
    std::atomic<uint64_t> value;
  };
  PingLine ping[kMaxRanks];
  // failed[r]: 0, or the hora_status_t with which rank r gave up an operation whose other part
  // its peers wait for (ShmBarrier::fail); written once by rank r, read by waiters.
  alignas(64) std::atomic<int32_t> failed[kMaxRanks];
};

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "the barrier's atomics must be address-free to live in shared memory");

// One rank's side of the barrier. Used by one thread at a time (the backend's callers are
// serialised by the engine's cycle lock).
class ShmBarrier {
 public:
  // pids: every rank's process id, to tell a lost peer from a slow one.
  ShmBarrier(ShmBarrierState *state, int rank, std::vector<int> pids, double timeoutS,
             bool spin);

  // Blocks until every rank has called wait() as often as this one; first wakes any rank whose
  // engine sleeps on its ShmBell, since this arrival is the start of a cycle it must join. Throws
  // Error(HORA_ERR_TIMEOUT) after timeoutS, or Error(HORA_ERR_PEER_LOST) when a rank's process is
  // gone, naming the ranks that had not arrived and `what` the barrier was for.
  void wait(const char *what);

  // Point to point progress, for a pipeline where a rank waits only for the data it needs:
  // publish() sets this rank's counter of `stage` (counters only grow) and wakes sleeping peers;
  // awaitPeers() blocks until every other rank's counter of `stage` is at least `value`, with
  // wait()'s spin, sleep, timeout and lost-peer errors.
  void publish(int stage, uint64_t value);
  void awaitPeers(int stage, uint64_t value, const char *what);
  // This rank has failed (`status`, from a step outside the segment its peers wait on, such as a
  // hierarchical collective's exchange across hosts): every peer waiting for it, now or later,
  // fails at once with that status instead of waiting out HORA_TIMEOUT_S.
  void fail(int status);
  // Any thread (a set's abort): fail(why.code) for the peers, and every wait of this rank, now or
  // later, throws Error(why) within one sleep slice (100 ms).
  void interrupt(const Status &why);

  // Rank 0 and `peer` (called by both, at the same point of their sequence of operations) pass
  // one cache line back and forth about `rounds` times; returns the round trip in nanoseconds as
  // this rank timed it (the mean of the fastest of four batches). About 60 ns where two cores
  // share an L3 here, 310 ns where they do not.
  double pingPong(int peer, int rounds);

 private:
  bool everyoneReached(uint64_t epoch) const;
  // Spins, then sleeps on `wakeups`, until ready(); behind(r) says whether rank r is one of those
  // still waited for, for the lost-peer check and the error.
  template <typename Ready, typename Behind>
  void block(const char *what, Ready ready, Behind behind);
  void wakeSleepers();

  ShmBarrierState *state_;
  int rank_;
  std::vector<int> pids_;
  double timeoutS_;
  bool spin_;
  uint64_t epoch_ = 0;
  std::vector<uint64_t> pinged_;  // per ping line: the last value this rank saw or wrote
  Interrupt interrupted_;
};

// The PeerBell of one rank of a shared segment. A peer's ShmBarrier::wait rings it; the
// arrival's reached[] store and this rank's bellArmed store are each followed by a full fence
// before the other side's load, so either the peer sees the rank armed, or the rank sees the
// peer ahead and does not sleep.
class ShmBell final : public PeerBell {
 public:
  ShmBell(ShmBarrierState *state, int rank, int size) : state_(state), rank_(rank), size_(size) {}
  bool arm(uint32_t *ticket) override;
  void sleep(uint32_t ticket, std::chrono::nanoseconds limit) override;
  void ring() override;

 private:
  ShmBarrierState *state_;
  int rank_;
  int size_;
};

}  // namespace hora
