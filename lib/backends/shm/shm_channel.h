// SPDX-License-Identifier: Apache-2.0
// The shared segment as the intra-host algorithms see it: its layout, who the peers are, and the
// barrier and bell that live at its start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/shm/shm_barrier.h"
#include "backends/shm/shm_segment.h"
#include "core/control_plane.h"

namespace hora {

// The segment, in this order: the ShmBarrierState, one Slot per rank, then one area per rank
// holding two eager staging halves, the export and the result ring of the pipeline (kSlots
// windows each), two negotiation bit vectors and the single-copy table. Each rank writes only its
// own slot and area; the barrier's counters say when a peer may read them.
class ShmChannel {
 public:
  static constexpr int64_t kEagerBytes = 32 << 10;    // largest op that goes through the staging halves
  static constexpr int64_t kWindowBytes = 512 << 10;  // bytes of the vector per pipeline window
  static constexpr int kSlots = 4;                    // pipeline windows a rank's export/result rings hold
  static constexpr int64_t kAndBytes = 64 << 10;      // largest negotiation bit vector taken here
  static constexpr uint32_t kTableEntries = 4096;     // single copy: most tensors one op can publish
  static constexpr uint32_t kTableOverflow = ~0u;     // OpDescriptor::spans of a rank that had more

  // One per rank, written only by its rank: who it is and the operation it is running, which
  // peers check after the first barrier of each operation. A peer can be at most one operation
  // ahead (it cannot pass that operation's barrier alone), so two descriptors, by sequence
  // parity, keep its next one from overwriting the one being checked.
  struct OpDescriptor {
    uint64_t seq;
    int64_t total;
    uint32_t dtype;
    uint32_t op;
    uint32_t spans;  // single copy: entries in the rank's table, or kTableOverflow
  };
  // Written by its rank before connect()'s exchange (pid, probeAddr) and before each operation's
  // first barrier (ops[]); read by the peers after it.
  struct alignas(64) Slot {
    int32_t pid;
    uint64_t probeAddr;  // where this rank's cross-memory-attach probe value lives, in its memory
    OpDescriptor ops[2];
  };
  // Single copy: one tensor of a rank's operation, at addresses in that rank's process.
  struct TableEntry {
    uint64_t in;
    uint64_t out;
    int64_t count;
  };

  static size_t segmentBytes(int size) { return areasOffset(size) + static_cast<size_t>(size) * areaBytes(); }

  // Writes this rank's pid into its slot.
  ShmChannel(std::unique_ptr<ShmSegment> segment, int rank, int size, double timeoutS);

  // Collective over `control`, once, after this rank's slot is filled in: every rank learns the
  // peers' pids (so the barrier can tell a lost peer) and gets its barrier and bell.
  void connect(ControlPlane &control);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int pid(int r) const { return pids_[static_cast<size_t>(r)]; }
  // At least as many CPUs as ranks: spinning before sleeping pays (set by connect()).
  bool coreEach() const { return coreEach_; }
  ShmBarrier &barrier() const { return *barrier_; }
  ShmBell *bell() const { return bell_.get(); }

  Slot &slot(int r) const { return slots_[r]; }
  char *eagerHalf(int r, uint64_t parity) const {
    return area(r) + static_cast<size_t>(parity) * kEagerBytes;
  }
  char *exportSlot(int r, uint64_t window) const {
    return area(r) + kExportAt + static_cast<size_t>(window % kSlots) * kWindowBytes;
  }
  char *resultSlot(int r, uint64_t window) const {
    return area(r) + kResultAt + static_cast<size_t>(window % kSlots) * kWindowBytes;
  }
  uint64_t *andVector(int r, uint64_t parity) const {
    return reinterpret_cast<uint64_t *>(area(r) + kAndAt + static_cast<size_t>(parity) * kAndBytes);
  }
  TableEntry *table(int r) const { return reinterpret_cast<TableEntry *>(area(r) + kTableAt); }

 private:
  static constexpr size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }
  // Offsets within a rank's area.
  static constexpr size_t kExportAt = 2 * kEagerBytes;
  static constexpr size_t kResultAt = kExportAt + kSlots * kWindowBytes;
  static constexpr size_t kAndAt = kResultAt + kSlots * kWindowBytes;
  static constexpr size_t kTableAt = kAndAt + 2 * kAndBytes;
  static constexpr size_t areaBytes() { return roundUp(kTableAt + kTableEntries * sizeof(TableEntry), 4096); }
  static constexpr size_t slotsOffset() { return roundUp(sizeof(ShmBarrierState), 4096); }
  static constexpr size_t areasOffset(int size) {
    return roundUp(slotsOffset() + sizeof(Slot) * static_cast<size_t>(size), 4096);
  }
  char *area(int r) const { return areas_ + static_cast<size_t>(r) * areaBytes(); }

  std::unique_ptr<ShmSegment> segment_;
  const int rank_;
  const int size_;
  const double timeoutS_;
  ShmBarrierState *state_;
  Slot *slots_;
  char *areas_;
  std::vector<int> pids_;  // every rank's, from connect()
  bool coreEach_ = false;
  std::unique_ptr<ShmBarrier> barrier_;
  std::unique_ptr<ShmBell> bell_;
};

}  // namespace hora
