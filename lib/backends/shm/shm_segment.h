// SPDX-License-Identifier: Apache-2.0
// A POSIX shared-memory segment mapped by every rank of one group on one host, and the barrier the
// intra-host data path synchronises with.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/control_plane.h"

namespace hora {

// Created by rank 0, opened by the others, unlinked as soon as everyone has it mapped: nothing is
// left in /dev/shm even if a rank dies later.
class ShmSegment {
 public:
  // Collective over `control`. Returns nullptr on every rank (with *why set) if any rank could not
  // create or map it; never throws for that, so the caller can fall back.
  static std::unique_ptr<ShmSegment> create(ControlPlane &control, size_t bytes, std::string *why);
  ~ShmSegment();
  ShmSegment(const ShmSegment &) = delete;
  ShmSegment &operator=(const ShmSegment &) = delete;

  void *base() const { return base_; }
  size_t size() const { return bytes_; }

 private:
  ShmSegment(void *base, size_t bytes) : base_(base), bytes_(bytes) {}
  void *base_;
  size_t bytes_;
};

// Lives in shared memory: the segment comes zero-filled, and all zeros is the initial state.
// Each rank publishes the number of the last barrier it reached; a rank waits until every rank
// has reached its own. Waiting spins briefly, then sleeps on a futex: two ranks with two threads
// each may share two cores, and a sleeping waiter gives its core to the rank it waits for.
struct ShmBarrierState {
  static constexpr int kMaxRanks = 256;
  alignas(64) std::atomic<uint32_t> wakeups{0};  // futex word: bumped by every arrival
  std::atomic<uint32_t> sleepers{0};             // ranks inside futex_wait
  alignas(64) std::atomic<uint64_t> reached[kMaxRanks];  // padding-free: read together
  // Per rank, for its engine sleeping between cycles (ShmBell): a futex word bumped to wake it,
  // and whether it sleeps there, which every barrier arrival checks.
  alignas(64) std::atomic<uint32_t> bell[kMaxRanks];
  alignas(64) std::atomic<uint32_t> bellArmed[kMaxRanks];
};

class ShmBarrier {
 public:
  // pids: every rank's process id, to tell a lost peer from a slow one.
  ShmBarrier(ShmBarrierState *state, int rank, std::vector<int> pids, double timeoutS,
             bool spin);

  // Blocks until every rank has called wait() as often as this one; first wakes any rank whose
  // engine sleeps on its ShmBell, since this arrival is the start of a cycle it must join. Throws Error(HORA_ERR_TIMEOUT)
  // after timeoutS, or Error(HORA_ERR_PEER_LOST) when a rank's process is gone, naming the ranks
  // that had not arrived and `what` the barrier was for.
  void wait(const char *what);

 private:
  bool everyoneReached(uint64_t epoch) const;
  std::string missing(uint64_t epoch) const;

  ShmBarrierState *state_;
  int rank_;
  std::vector<int> pids_;
  double timeoutS_;
  bool spin_;
  uint64_t epoch_ = 0;
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
