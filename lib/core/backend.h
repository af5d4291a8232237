// SPDX-License-Identifier: Apache-2.0
// The data plane behind one small interface: what the engine asks of MPI, Gloo or NCCL.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "core/control_plane.h"
#include "core/kernels.h"
#include "core/types.h"

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

// What a backend can do, stated once when it is made. The engine plans every operation from this
// description (which path an allreduce takes, which channel negotiation uses, whether a cycle may
// write to a socket) and never probes a backend or falls back after a refusal. A description may
// depend only on what every rank of the set agrees on, so that all ranks plan alike.
struct BackendCaps {
  enum class Scope : uint8_t {
    kOneHost,  // every rank of the set on this host (shared memory)
    kAnyHost,  // ranks anywhere the transport reaches
  };
  // Collectives it runs, one bit per OpType (kAllreduce ... kReducescatter).
  uint32_t collectives = 0;
  // dtypes allreduce and reducescatter take as they are, one bit per DType; the engine widens
  // float16/bfloat16 to float32 around the call for a dtype without its bit.
  uint32_t reduceDtypes = 0;
  // allreduceSpans reduces a whole fused response where its tensors lie, with pre/post scaling
  // and float32 accumulation of float16/bfloat16: the engine neither packs nor scales.
  bool reducesSpansInPlace = false;
  // Negotiation's per-cycle AND fits this backend's own channel (andWords) up to this many
  // 64-bit words; 0: negotiation runs on the group's control plane.
  size_t negotiationWords = 0;
  // A cycle on this backend writes to sockets (a lost peer then means EPIPE/SIGPIPE).
  bool usesSockets = true;
  Scope scope = Scope::kAnyHost;

  // Every collective, every dtype but float16/bfloat16, nothing more: a transport's plain offer.
  static BackendCaps plain(bool usesSockets, Scope scope);

  bool runs(OpType op) const { return (collectives >> static_cast<unsigned>(op)) & 1u; }
  bool reduces(DType t) const { return (reduceDtypes >> static_cast<unsigned>(t)) & 1u; }
};

// The five backend calls that move tensors (OpSpec::backendCall), as BackendCaps::collectives
// bits.
constexpr uint32_t kAllDataCollectives =
    (1u << static_cast<unsigned>(OpType::kAllreduce)) | (1u << static_cast<unsigned>(OpType::kBroadcast)) |
    (1u << static_cast<unsigned>(OpType::kAllgather)) | (1u << static_cast<unsigned>(OpType::kAlltoall)) |
    (1u << static_cast<unsigned>(OpType::kReducescatter));
// Every dtype but float16/bfloat16: what a backend reduces with its transport's own operators.
constexpr uint32_t kAllButHalfDtypes =
    ((1u << kNumDTypes) - 1) & ~((1u << static_cast<unsigned>(DType::kFloat16)) |
                                 (1u << static_cast<unsigned>(DType::kBFloat16)));

// One backend instance serves one process set. Every call is collective over the set and is made
// in the set's cycles only (one thread at a time: SetEngine's cycle lock), after negotiation has
// established that every rank makes the same call; counts are 64-bit and the backend splits them
// if its transport cannot. The engine calls only what caps() says the backend can do.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char *name() const = 0;
  // Fixed for the backend's life.
  virtual const BackendCaps &caps() const = 0;

  // out[i] = op over ranks of in[i]; in == out means in place. op is never kAverage (the engine
  // turns it into kSum and a scale).
  virtual void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) = 0;
  // One tensor of a fused allreduce, reduced where it lies (in == out means in place).
  struct Span {
    const void *in;
    void *out;
    int64_t count;
  };
  // Only when caps().reducesSpansInPlace: the spans, concatenated, are one vector, and every
  // element becomes postscale * (op over ranks of prescale * element); float16/bfloat16
  // accumulate in float32 with one rounding. op is never kAverage.
  virtual void allreduceSpans(const std::vector<Span> &spans, DType dtype, ReduceOp op,
                              double prescale, double postscale);
  // Only when caps().negotiationWords >= words.size(): bitwise AND of `words` across ranks, in
  // place, on the backend's own channel.
  virtual void andWords(std::vector<uint64_t> &words);
  // The backend's own channel for all of negotiation (the per-cycle AND, the gather of new
  // requests to rank 0, the broadcast of its answer), or nullptr: negotiation then runs on the
  // group's control plane, with the AND through andWords where caps().negotiationWords allows.
  // Calls on it are made by the set's cycles, in the same order on every rank, interleaved with
  // the data collectives. Owned by the backend and valid while it lives.
  virtual ControlPlane *negotiationPlane() { return nullptr; }
  // The bell for this rank's engine, or nullptr (the engine then backs off on a timer). Owned by
  // the backend and valid while it lives.
  virtual PeerBell *peerBell() { return nullptr; }
  // Any thread (a set's abort): as Group::interrupt, for the backend's own channels. A backend
  // that wraps another forwards it. Default: nothing (the waits end at their deadline).
  virtual void interrupt(const Status &why) { (void)why; }
  // How the last collective ran, where the backend chooses among algorithms ("ring",
  // "hierarchical", "mpi_library"): static text for the timeline, or nullptr.
  virtual const char *lastAlgorithm() const { return nullptr; }
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
