// SPDX-License-Identifier: Apache-2.0
// The MPI plane: MPI's own collectives where they serve well (small allreduces, broadcast,
// allgather, alltoall and reducescatter within MPI's int counts), and core's algorithm tables over
// MPI's point-to-point messages (MpiLink) where they do not: allreduces from 16 KiB, and any call
// past MPI's int counts. Negotiation has already established that every rank makes this call now,
// but a rank can still be stopped or die in it, so each call is non-blocking and waited for with
// a deadline (HORA_TIMEOUT_S), polling without sleeping as a blocking call would.
// Its factory is declared, and documented, beside the registry's row that calls it (registry.cpp).
#include <algorithm>
#include <climits>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "base/knobs.h"
#include "bootstrap/mpi/mpi_bootstrap.h"
#include "core/backend.h"
#include "core/collectives/link_backend.h"
#include "core/kernels.h"
#include "core/link.h"

namespace hora {
namespace {

constexpr int64_t kMaxChunk = int64_t{1} << 30;  // elements or bytes per MPI call

MPI_Datatype mpiType(DType t) {
  switch (t) {
    case DType::kUInt8: return MPI_UINT8_T;
    case DType::kInt8: return MPI_INT8_T;
    case DType::kInt16: return MPI_INT16_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kBool: return MPI_UINT8_T;  // 0/1 bytes (normalizeBools), reduced by max and min
    case DType::kFloat16:
    case DType::kBFloat16: break;
  }
  HORA_THROW(HORA_ERR_INTERNAL, "the MPI backend has no MPI type for ", dtypeName(t),
             " (the engine widens it to float32)");
}

// Open MPI 4.1's vectorised reductions (its op/avx component) saturate sums of 8- and 16-bit
// integers instead of wrapping (int16 20000 + 20000 gives 32767; open-mpi/ompi#8045, closed as
// "won't fix": MPI leaves overflow undefined). hora's integers wrap on every path, so for these
// types sum and product are user-defined operations that run hora's own kernels.
bool isNarrowInteger(DType t) {
  return t == DType::kUInt8 || t == DType::kInt8 || t == DType::kInt16;
}

template <ReduceOp Op>
void wrappingOp(void *in, void *inout, int *len, MPI_Datatype *type) {
  // Only ever registered for the three types below (isNarrowInteger); MPI hands back the
  // datatype of the call.
  const DType t = *type == MPI_INT16_T ? DType::kInt16
                  : *type == MPI_INT8_T ? DType::kInt8
                                        : DType::kUInt8;
  reduceInto(inout, in, *len, t, Op);
}

// bool travels as uint8 holding 0 or 1: OR is the maximum, AND the minimum.
MPI_Op mpiOp(ReduceOp op, DType dtype) {
  if (dtype == DType::kBool) {
    if (op == ReduceOp::kSum || op == ReduceOp::kMax) return MPI_MAX;
    if (op == ReduceOp::kMin || op == ReduceOp::kProduct) return MPI_MIN;
  }
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    case ReduceOp::kAverage: break;
  }
  HORA_THROW(HORA_ERR_INTERNAL, "the MPI backend was given ", reduceOpName(op));
}

// MPI's point-to-point messages as a Link, on the plane's communicator. One tag: MPI delivers
// the messages of one (source, tag, communicator) in the order they were posted, which is
// Link's matching rule. A message past MPI's int counts travels as several, which both ends cut
// alike (both know its length).
class MpiLink final : public Link {
 public:
  MpiLink(MPI_Comm comm, double timeoutS) : comm_(comm), timeoutS_(timeoutS) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // MPI moves bytes only inside its calls (no progress thread): a chunk that arrives while
    // this rank reduces the one before waits for the next wait, so pipelining in chunks only adds
    // messages. The ring moves whole blocks, as one message each (up to kPiece), and the tables
    // take the ring from the first size they are asked (16 KiB; smaller ones are MPI's own).
    tuning_.smallBytes = 0;
    tuning_.chunkBytes = kPiece;
    tuning_.concurrentPeers = true;
  }

  const char *name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const LinkTuning &tuning() const override { return tuning_; }

  Ticket postSend(int peer, const void *data, size_t bytes) override {
    return post(peer, const_cast<void *>(data), bytes, /*send=*/true);
  }
  Ticket postRecv(int peer, void *data, size_t bytes) override {
    return post(peer, data, bytes, /*send=*/false);
  }
  // waitMpi's deadline and broken-plane rules: a timeout or a lost peer breaks the MPI plane of
  // this process, which then makes no MPI call again, so no dropped transfer can move after.
  void wait(Ticket ticket) override {
    Entry *e = find(ticket);
    if (e == nullptr) return;
    waitMpi(e->requests(), e->count(), timeoutS_, "mpi transfer", nullptr, MpiWait::kBusy);
    forget(ticket);
  }
  void drop(Ticket ticket) override {
    // MPI cannot take back a posted send. The collective failed (a timeout, a lost peer, the
    // set's abort), and the engine then poisons the group, which breaks the MPI plane of this
    // process: no MPI call follows that could move the transfer (MpiCommGroup::poison).
    forget(ticket);
  }
  // MPI's waits check the process's MPI interrupt and fault notices themselves (waitMpi).
  void interrupt(const Status &) override {}

 private:
  static constexpr size_t kPiece = size_t{1} << 30;  // bytes per MPI message

  // A posted message: one MPI request, or several past kPiece bytes.
  struct Entry {
    MPI_Request first = MPI_REQUEST_NULL;
    std::vector<MPI_Request> more;  // with `first` at [0], past kPiece
    bool done = false;
    MPI_Request *requests() { return more.empty() ? &first : more.data(); }
    int count() const { return more.empty() ? 1 : static_cast<int>(more.size()); }
  };

  Ticket post(int peer, void *data, size_t bytes, bool send) {
    Entry &e = entries_.emplace_back();
    for (size_t off = 0; off == 0 || off < bytes; off += kPiece) {
      const int n = static_cast<int>(std::min(kPiece, bytes - off));
      char *at = static_cast<char *>(data) + off;
      MPI_Request r;
      if (send) {
        HORA_CHECK_MPI(MPI_Isend(at, n, MPI_BYTE, peer, kTag, comm_, &r));
      } else {
        HORA_CHECK_MPI(MPI_Irecv(at, n, MPI_BYTE, peer, kTag, comm_, &r));
      }
      if (off == 0) {
        e.first = r;
      } else {
        if (e.more.empty()) e.more.push_back(e.first);
        e.more.push_back(r);
      }
    }
    return base_ + entries_.size() - 1;
  }
  // Tickets count up from base_, the oldest that has not completed; entries_[t - base_].
  Entry *find(Ticket ticket) {
    if (ticket < base_ || ticket - base_ >= entries_.size()) return nullptr;
    Entry &e = entries_[ticket - base_];
    return e.done ? nullptr : &e;
  }
  void forget(Ticket ticket) {
    entries_[ticket - base_].done = true;
    while (!entries_.empty() && entries_.front().done) {
      entries_.pop_front();
      ++base_;
    }
  }

  static constexpr int kTag = 1;
  MPI_Comm comm_;
  double timeoutS_;
  int rank_ = 0, size_ = 1;
  LinkTuning tuning_;
  std::deque<Entry> entries_;
  Ticket base_ = 1;
};

class MpiBackend final : public LinkBackend {
 public:
  MpiBackend(MPI_Comm comm, const Knobs &knobs)
      // MPI's own transport: no socket of hora's in a cycle (SIGPIPE cannot reach the engine).
      : LinkBackend(std::make_shared<MpiLink>(comm, knobs.timeoutS),
                    BackendCaps::plain(/*usesSockets=*/false, BackendCaps::Scope::kAnyHost), knobs,
                    /*negotiates=*/false),
        comm_(comm), timeoutS_(knobs.timeoutS) {
    HORA_CHECK_MPI(MPI_Op_create(&wrappingOp<ReduceOp::kSum>, /*commute=*/1, &wrappingSum_));
    HORA_CHECK_MPI(MPI_Op_create(&wrappingOp<ReduceOp::kProduct>, /*commute=*/1, &wrappingProduct_));
  }
  ~MpiBackend() override {
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (finalized) return;  // the operations went with MPI
    MPI_Op_free(&wrappingSum_);
    MPI_Op_free(&wrappingProduct_);
  }
  MpiBackend(const MpiBackend &) = delete;
  MpiBackend &operator=(const MpiBackend &) = delete;

  void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) override {
    throwIfMpiBroken();
    const size_t esize = dtypeSize(dtype);
    if (link().size() > 1 && count * static_cast<int64_t>(esize) >= kTablesFromBytes) {
      LinkBackend::allreduce(in, out, count, dtype, op);
      return;
    }
    const MPI_Datatype type = mpiType(dtype);
    const MPI_Op mop = opFor(op, dtype);
    if (dtype == DType::kBool) {  // max and min keep 0/1 inputs 0/1; a 2 would stay a 2
      normalizeBools(out, in, count);
      in = out;
    }
    for (int64_t off = 0; off < count; off += kMaxChunk) {
      const int n = static_cast<int>(std::min(kMaxChunk, count - off));
      char *o = static_cast<char *>(out) + off * static_cast<int64_t>(esize);
      const void *i = in == out ? MPI_IN_PLACE : static_cast<const char *>(in) + off * static_cast<int64_t>(esize);
      MPI_Request req;
      HORA_CHECK_MPI(MPI_Iallreduce(i, o, n, type, mop, comm_, &req));
      wait(&req, 1, "allreduce");
    }
    ranOwn(kLibrary);
  }

  void broadcast(void *buf, int64_t bytes, int root) override {
    throwIfMpiBroken();
    for (int64_t off = 0; off < bytes; off += kMaxChunk) {
      const int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
      MPI_Request req;
      HORA_CHECK_MPI(MPI_Ibcast(static_cast<char *>(buf) + off, n, MPI_BYTE, root, comm_, &req));
      wait(&req, 1, "broadcast");
    }
    ranOwn(kLibrary);
  }

  void allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) override {
    throwIfMpiBroken();
    std::vector<int> counts, displs;
    if (!toIntCounts(bytesPerRank, &counts, &displs)) {
      LinkBackend::allgatherv(in, out, bytesPerRank);
      return;
    }
    // Send from the output slot so the input may alias nothing in particular.
    char *o = static_cast<char *>(out);
    const auto me = static_cast<size_t>(link().rank());
    const int64_t mine = bytesPerRank[me];
    char *slot = o + displs[me];
    if (mine > 0 && slot != in) std::memmove(slot, in, static_cast<size_t>(mine));
    MPI_Request req;
    HORA_CHECK_MPI(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, o, counts.data(), displs.data(),
                                   MPI_BYTE, comm_, &req));
    wait(&req, 1, "allgather");
    ranOwn(kLibrary);
  }

  void alltoallv(const void *in, const std::vector<int64_t> &sendBytes, void *out,
                 const std::vector<int64_t> &recvBytes) override {
    throwIfMpiBroken();
    std::vector<int> sc, sd, rc, rd;
    if (!toIntCounts(sendBytes, &sc, &sd) || !toIntCounts(recvBytes, &rc, &rd)) {
      LinkBackend::alltoallv(in, sendBytes, out, recvBytes);
      return;
    }
    MPI_Request req;
    HORA_CHECK_MPI(MPI_Ialltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(),
                                  MPI_BYTE, comm_, &req));
    wait(&req, 1, "alltoall");
    ranOwn(kLibrary);
  }

  void reducescatter(const void *in, void *out, const std::vector<int64_t> &counts, DType dtype,
                     ReduceOp op) override {
    throwIfMpiBroken();
    std::vector<int> c, d;
    if (!toIntCounts(counts, &c, &d)) {
      LinkBackend::reducescatter(in, out, counts, dtype, op);
      return;
    }
    if (dtype == DType::kBool) {  // as in allreduce: 0/1 inputs, in a copy (in is the caller's)
      int64_t total = 0;
      for (int64_t n : counts) total += n;
      bools_.resize(static_cast<size_t>(total));
      normalizeBools(bools_.data(), in, total);
      in = bools_.data();
    }
    MPI_Request req;
    HORA_CHECK_MPI(MPI_Ireduce_scatter(in, out, c.data(), mpiType(dtype), opFor(op, dtype), comm_, &req));
    wait(&req, 1, "reducescatter");
    ranOwn(kLibrary);
  }

 private:
  // What the timeline's "algorithm" says of a call MPI's library ran.
  static constexpr const char *kLibrary = "mpi_library";
  // Open MPI's non-blocking allreduce (libnbc) takes about twice as long as its blocking one for
  // large buffers (2 ranks, 16 MiB: 10.3 ms against 4.5 ms), so from this size on the allreduce
  // table runs over MPI's point-to-point messages instead (its ring from here up).
  static constexpr int64_t kTablesFromBytes = 16 * 1024;

  MPI_Op opFor(ReduceOp op, DType dtype) const {
    if (isNarrowInteger(dtype) && op == ReduceOp::kSum) return wrappingSum_;
    if (isNarrowInteger(dtype) && op == ReduceOp::kProduct) return wrappingProduct_;
    return mpiOp(op, dtype);
  }

  // Waits with the deadline; the plane is broken after a timeout (see waitMpi).
  void wait(MPI_Request *requests, int count, const char *op) {
    waitMpi(requests, count, timeoutS_, op, nullptr, MpiWait::kBusy);
  }

  // Counts and displacements as MPI ints; false if any does not fit.
  static bool toIntCounts(const std::vector<int64_t> &n, std::vector<int> *counts,
                          std::vector<int> *displs) {
    int64_t total = 0;
    for (int64_t x : n) {
      if (x > INT_MAX || total > INT_MAX) return false;
      counts->push_back(static_cast<int>(x));
      displs->push_back(static_cast<int>(total));
      total += x;
    }
    return true;
  }

  MPI_Comm comm_;
  double timeoutS_;
  MPI_Op wrappingSum_ = MPI_OP_NULL;  // for isNarrowInteger dtypes
  MPI_Op wrappingProduct_ = MPI_OP_NULL;
  std::vector<uint8_t> bools_;  // a bool reducescatter's input as 0/1 bytes
};

}  // namespace

std::unique_ptr<Backend> createMpiBackend(MPI_Comm comm, const Knobs &knobs) {
  return std::make_unique<MpiBackend>(comm, knobs);
}

}  // namespace hora
