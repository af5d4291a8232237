// SPDX-License-Identifier: Apache-2.0
// The data plane behind one small interface: what the engine asks of MPI, Gloo or NCCL.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "core/kernels.h"

namespace hora {

// Wakes an engine that sleeps between cycles because its peers have not yet submitted what it
// waits for: its own threads ring when they queue work, and a peer's engine rings the moment it
// starts the next cycle, so neither waits out a back-off timer. Backends whose ranks share memory
// provide one; without it the engine backs off on a timer alone.
class PeerBell {
 public:
  virtual ~PeerBell() = default;
  // Engine thread: announce a sleep. False when a peer has already started the next cycle (then
  // do not sleep); otherwise *ticket is what sleep() compares against.
  virtual bool arm(uint32_t *ticket) = 0;
  // Engine thread, after a true arm(): sleep until rung or for `limit` (may be zero); disarms.
  virtual void sleep(uint32_t ticket, std::chrono::nanoseconds limit) = 0;
  // Any thread of this rank: wake this rank's armed engine.
  virtual void ring() = 0;
};

// One backend instance serves one process set. Every call is collective over the set and is made
// in the set's cycles only (one thread at a time: SetEngine's cycle lock), after negotiation has
// established that every rank makes the same call; counts are 64-bit and the backend splits them
// if its transport cannot.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char *name() const = 0;
  // Whether allreduce accepts float16/bfloat16 with float32 accumulation itself. When false, the
  // engine widens to float32 around the call.
  virtual bool reducesHalfNatively() const { return false; }

  // out[i] = op over ranks of in[i]; in == out means in place. op is never kAverage (the engine
  // turns it into kSum and a scale).
  virtual void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) = 0;
  // One tensor of a fused allreduce, reduced where it lies (in == out means in place).
  struct Span {
    const void *in;
    void *out;
    int64_t count;
  };
  // The fast path for a whole response: the spans, concatenated, are one vector, and every
  // element becomes postscale * (op over ranks of prescale * element); float16/bfloat16
  // accumulate in float32 with one rounding. op is never kAverage. Returns false, touching
  // nothing, when this backend cannot: the engine then packs and calls allreduce(). The answer
  // may depend only on what every rank agrees on (dtype, op, number of spans, total count), so
  // that all ranks take the same path.
  virtual bool allreduceSpans(const std::vector<Span> &spans, DType dtype, ReduceOp op,
                              double prescale, double postscale) {
    (void)spans, (void)dtype, (void)op, (void)prescale, (void)postscale;
    return false;
  }
  // Negotiation's one collective per cycle, when this backend has a faster channel for it than
  // the group's control plane: bitwise AND of `words` across ranks, in place. Returns false,
  // touching nothing, when it has none; like allreduceSpans the answer may depend only on what
  // every rank agrees on (the length).
  virtual bool allreduceAnd(std::vector<uint64_t> &words) {
    (void)words;
    return false;
  }
  // The bell for this rank's engine, or nullptr (the engine then backs off on a timer). Owned by
  // the backend and valid while it lives.
  virtual PeerBell *peerBell() { return nullptr; }
  // root's bytes replace everyone else's.
  virtual void broadcast(void *buf, int64_t bytes, int root) = 0;
  // out = concatenation over ranks of each rank's in; bytesPerRank[r] is rank r's length.
  virtual void allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) = 0;
  // Rank r's block of `in` (sendBytes[r] bytes, blocks in rank order) goes to rank r; out gets
  // the blocks every rank sent here, in rank order (recvBytes[r] from rank r).
  virtual void alltoallv(const void *in, const std::vector<int64_t> &sendBytes, void *out,
                         const std::vector<int64_t> &recvBytes) = 0;
  // `in` holds one block per rank, in rank order, counts[r] elements each; out (counts[rank]
  // elements) = op over ranks of their block for this rank. op is never kAverage.
  virtual void reducescatter(const void *in, void *out, const std::vector<int64_t> &counts,
                             DType dtype, ReduceOp op) = 0;
};

}  // namespace hora
