// SPDX-License-Identifier: Apache-2.0
// Large allreduce without staging (HORA_SHM=cma): each rank reads its peers' tensors straight from
// their memory with process_vm_readv.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/shm/cma.h"
#include "backends/shm/shm_channel.h"
#include "backends/shm/shm_op.h"

namespace hora {

// One thread at a time (the backend's caller).
class CmaAllreduce {
 public:
  // Publishes in this rank's slot where its probe value lies, for the peers to test at connect;
  // ShmChannel::connect's exchange makes it visible to them, so construct this before that.
  explicit CmaAllreduce(ShmChannel &channel);
  CmaAllreduce(const CmaAllreduce &) = delete;  // peers read probe_ at its address
  CmaAllreduce &operator=(const CmaAllreduce &) = delete;

  // Collective over `control`, after ShmChannel::connect: whether every rank can read every
  // peer's memory (all take single copy or none does). `want`: HORA_SHM=cma. Logs why not when
  // wanted and refused.
  bool agree(ControlPlane &control, bool want);

  // What this rank publishes in its op descriptor for an op of `spans` tensors.
  static uint32_t published(size_t spans) {
    return spans <= ShmChannel::kTableEntries ? static_cast<uint32_t>(spans) : ShmChannel::kTableOverflow;
  }
  // The operation after announce(o, published(...)). Returns false, having passed only the first
  // barrier (and checked the peers), when some rank has more tensors than its table holds; every
  // rank then sees that and stages instead.
  bool run(const ShmOp &o, const SpanTable &table);

 private:
  // A peer's published tensors (addresses in its process) as one vector of elements.
  class PeerTable {
   public:
    void assign(const ShmChannel::TableEntry *entries, uint32_t n);
    // The peer's input (or output) bytes holding elements [a, b), appended to a cleared `into`.
    void ranges(int64_t a, int64_t b, size_t esize, bool out, cma::IovList &into) const;

   private:
    const ShmChannel::TableEntry *entries_ = nullptr;
    std::vector<int64_t> start_;
  };

  void reduceChunk(const ShmOp &o, const SpanTable &table, int64_t a, int64_t b);

  ShmChannel &channel_;
  uint64_t probe_ = 0;  // read by peers at connect to tell whether they can read this process
  // The peers' tables of this op, a peer's chunk and (float16/bfloat16) this rank's, the float32
  // accumulator, and the two sides of a process_vm_readv.
  std::vector<PeerTable> peers_;
  std::vector<char> peerChunk_, ownChunk_;
  std::vector<float> acc_;
  cma::IovList local_, remote_;
};

}  // namespace hora
