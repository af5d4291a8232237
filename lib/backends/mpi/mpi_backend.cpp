// SPDX-License-Identifier: Apache-2.0
// MPI backend: collectives on a private communicator, in chunks that fit MPI's int counts.
// Negotiation has already established that every rank makes this call now, but a rank can still
// be stopped or die in it, so each is non-blocking and waited for with a deadline (HORA_TIMEOUT_S),
// polling without sleeping as a blocking call would.
// Its factory is declared, and documented, beside the registry's row that calls it (registry.cpp).
#include <algorithm>
#include <climits>
#include <cstring>

#include "base/knobs.h"
#include "bootstrap/mpi/mpi_bootstrap.h"
#include "core/backend.h"
#include "core/kernels.h"

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

class MpiBackend final : public Backend {
 public:
  MpiBackend(MPI_Comm comm, double timeoutS) : comm_(comm), timeoutS_(timeoutS) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
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
  const char *name() const override { return "mpi"; }
  // MPI's own transport: no socket of hora's in a cycle (SIGPIPE cannot reach the engine).
  const BackendCaps &caps() const override {
    static const BackendCaps kCaps =
        BackendCaps::plain(/*usesSockets=*/false, BackendCaps::Scope::kAnyHost);
    return kCaps;
  }

  void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) override {
    throwIfMpiBroken();
    const MPI_Datatype type = mpiType(dtype);
    const MPI_Op mop = opFor(op, dtype);
    if (dtype == DType::kBool) {  // max and min keep 0/1 inputs 0/1; a 2 would stay a 2
      normalizeBools(out, in, count);
      in = out;
    }
    const size_t esize = dtypeSize(dtype);
    if (size_ > 1 && count * static_cast<int64_t>(esize) >= kRingMinBytes) {
      ringAllreduce(in, out, count, dtype, op);
      return;
    }
    for (int64_t off = 0; off < count; off += kMaxChunk) {
      const int n = static_cast<int>(std::min(kMaxChunk, count - off));
      char *o = static_cast<char *>(out) + off * static_cast<int64_t>(esize);
      const void *i = in == out ? MPI_IN_PLACE : static_cast<const char *>(in) + off * static_cast<int64_t>(esize);
      MPI_Request req;
      HORA_CHECK_MPI(MPI_Iallreduce(i, o, n, type, mop, comm_, &req));
      wait(&req, 1, "allreduce");
    }
  }

  void broadcast(void *buf, int64_t bytes, int root) override {
    throwIfMpiBroken();
    for (int64_t off = 0; off < bytes; off += kMaxChunk) {
      const int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
      MPI_Request req;
      HORA_CHECK_MPI(MPI_Ibcast(static_cast<char *>(buf) + off, n, MPI_BYTE, root, comm_, &req));
      wait(&req, 1, "broadcast");
    }
  }

  void allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) override {
    throwIfMpiBroken();
    std::vector<int> counts, displs;
    const bool fits = toIntCounts(bytesPerRank, &counts, &displs);
    char *o = static_cast<char *>(out);
    if (fits) {
      // Send from the output slot so the input may alias nothing in particular.
      const int64_t mine = bytesPerRank[static_cast<size_t>(rank_)];
      char *slot = o + displs[static_cast<size_t>(rank_)];
      if (mine > 0 && slot != in) std::memmove(slot, in, static_cast<size_t>(mine));
      MPI_Request req;
      HORA_CHECK_MPI(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, o, counts.data(), displs.data(),
                                     MPI_BYTE, comm_, &req));
      wait(&req, 1, "allgather");
      return;
    }
    // Past MPI's int counts: each rank broadcasts its block in chunks.
    int64_t off = 0;
    for (int r = 0; r < size_; ++r) {
      const int64_t n = bytesPerRank[static_cast<size_t>(r)];
      if (r == rank_ && n > 0 && o + off != in) std::memmove(o + off, in, static_cast<size_t>(n));
      broadcast(o + off, n, r);
      off += n;
    }
  }

  void alltoallv(const void *in, const std::vector<int64_t> &sendBytes, void *out,
                 const std::vector<int64_t> &recvBytes) override {
    throwIfMpiBroken();
    std::vector<int> sc, sd, rc, rd;
    const bool fits = toIntCounts(sendBytes, &sc, &sd) && toIntCounts(recvBytes, &rc, &rd);
    if (fits) {
      MPI_Request req;
      HORA_CHECK_MPI(MPI_Ialltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(),
                                    MPI_BYTE, comm_, &req));
      wait(&req, 1, "alltoall");
      return;
    }
    // Past MPI's int counts: pairwise exchanges in chunks, rank by rank offset so every step
    // pairs each rank with exactly one sender and one receiver.
    const auto *src = static_cast<const char *>(in);
    auto *dst = static_cast<char *>(out);
    std::vector<int64_t> sOff(static_cast<size_t>(size_), 0), rOff(static_cast<size_t>(size_), 0);
    for (int r = 1; r < size_; ++r) {
      sOff[static_cast<size_t>(r)] = sOff[static_cast<size_t>(r - 1)] + sendBytes[static_cast<size_t>(r - 1)];
      rOff[static_cast<size_t>(r)] = rOff[static_cast<size_t>(r - 1)] + recvBytes[static_cast<size_t>(r - 1)];
    }
    for (int step = 0; step < size_; ++step) {
      const int to = (rank_ + step) % size_;
      const int from = (rank_ - step + size_) % size_;
      const int64_t sn = sendBytes[static_cast<size_t>(to)], rn = recvBytes[static_cast<size_t>(from)];
      for (int64_t off = 0; off < std::max(sn, rn); off += kMaxChunk) {
        const int s = static_cast<int>(std::max<int64_t>(0, std::min(kMaxChunk, sn - off)));
        const int r = static_cast<int>(std::max<int64_t>(0, std::min(kMaxChunk, rn - off)));
        MPI_Request reqs[2];
        HORA_CHECK_MPI(MPI_Irecv(dst + rOff[static_cast<size_t>(from)] + std::min(off, rn), r,
                                 MPI_BYTE, from, 0, comm_, &reqs[0]));
        HORA_CHECK_MPI(MPI_Isend(src + sOff[static_cast<size_t>(to)] + std::min(off, sn), s,
                                 MPI_BYTE, to, 0, comm_, &reqs[1]));
        wait(reqs, 2, "alltoall");
      }
    }
  }

  void reducescatter(const void *in, void *out, const std::vector<int64_t> &counts, DType dtype,
                     ReduceOp op) override {
    throwIfMpiBroken();
    const MPI_Datatype type = mpiType(dtype);
    const MPI_Op mop = opFor(op, dtype);
    if (dtype == DType::kBool) {  // as in allreduce: 0/1 inputs, in a copy (in is the caller's)
      int64_t total = 0;
      for (int64_t c : counts) total += c;
      bools_.resize(static_cast<size_t>(total));
      normalizeBools(bools_.data(), in, total);
      in = bools_.data();
    }
    std::vector<int> c, d;
    if (toIntCounts(counts, &c, &d)) {
      MPI_Request req;
      HORA_CHECK_MPI(MPI_Ireduce_scatter(in, out, c.data(), type, mop, comm_, &req));
      wait(&req, 1, "reducescatter");
      return;
    }
    // Past MPI's int counts: one chunked reduce to each block's owner.
    const int64_t esize = static_cast<int64_t>(dtypeSize(dtype));
    int64_t base = 0;
    for (int r = 0; r < size_; ++r) {
      const int64_t n = counts[static_cast<size_t>(r)];
      for (int64_t off = 0; off < n; off += kMaxChunk) {
        const int k = static_cast<int>(std::min(kMaxChunk, n - off));
        const char *src = static_cast<const char *>(in) + (base + off) * esize;
        char *dst = static_cast<char *>(out) + off * esize;
        MPI_Request req;
        HORA_CHECK_MPI(MPI_Ireduce(src, r == rank_ ? dst : nullptr, k, type, mop, r, comm_, &req));
        wait(&req, 1, "reducescatter");
      }
      base += n;
    }
  }

 private:
  MPI_Op opFor(ReduceOp op, DType dtype) const {
    if (isNarrowInteger(dtype) && op == ReduceOp::kSum) return wrappingSum_;
    if (isNarrowInteger(dtype) && op == ReduceOp::kProduct) return wrappingProduct_;
    return mpiOp(op, dtype);
  }

  // Open MPI's non-blocking allreduce (libnbc) takes about twice as long as its blocking one for
  // large buffers (2 ranks, 16 MiB: 10.3 ms against 4.5 ms), so from this size on hora runs its
  // own ring over non-blocking point-to-point: a reduce-scatter, then an allgather, each segment
  // reduced with hora's kernels. Every rank ends with the same bits (each segment is reduced
  // once, on one rank, and copied to the others).
  static constexpr int64_t kRingMinBytes = 16 * 1024;

  void ringAllreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) {
    const int64_t esize = static_cast<int64_t>(dtypeSize(dtype));
    char *o = static_cast<char *>(out);
    if (in != out) copyBytes(o, in, static_cast<size_t>(count * esize));
    std::vector<int64_t> start(static_cast<size_t>(size_) + 1);
    int64_t widest = 0;
    for (int r = 0; r <= size_; ++r) start[static_cast<size_t>(r)] = count * r / size_;
    for (int r = 0; r < size_; ++r) widest = std::max(widest, start[r + 1] - start[r]);
    scratch_.resize(static_cast<size_t>(widest * esize));
    auto at = [&](int seg) { return o + start[static_cast<size_t>(seg)] * esize; };
    auto bytes = [&](int seg) { return (start[static_cast<size_t>(seg) + 1] - start[static_cast<size_t>(seg)]) * esize; };
    const int n = size_;
    // Reduce-scatter: in step s, pass segment rank-s on and fold segment rank-s-1 in; after n-1
    // steps this rank holds segment rank+1 reduced over every rank.
    for (int s = 0; s < n - 1; ++s) {
      const int give = (rank_ - s + n) % n, take = (rank_ - s - 1 + 2 * n) % n;
      exchange(at(give), bytes(give), scratch_.data(), bytes(take));
      reduceInto(at(take), scratch_.data(), bytes(take) / esize, dtype, op);
    }
    // Allgather: pass the reduced segments round the ring, straight into place.
    for (int s = 0; s < n - 1; ++s) {
      const int give = (rank_ + 1 - s + n) % n, take = (rank_ - s + n) % n;
      exchange(at(give), bytes(give), at(take), bytes(take));
    }
  }

  // Sends to the next rank and receives from the previous one, in chunks MPI's int counts hold.
  void exchange(const char *send, int64_t sendBytes, char *recv, int64_t recvBytes) {
    const int right = (rank_ + 1) % size_, left = (rank_ - 1 + size_) % size_;
    for (int64_t off = 0; off < std::max(sendBytes, recvBytes); off += kMaxChunk) {
      const int s = static_cast<int>(std::max<int64_t>(0, std::min(kMaxChunk, sendBytes - off)));
      const int r = static_cast<int>(std::max<int64_t>(0, std::min(kMaxChunk, recvBytes - off)));
      MPI_Request reqs[2];
      HORA_CHECK_MPI(MPI_Irecv(recv + std::min(off, recvBytes), r, MPI_BYTE, left, kRingTag, comm_, &reqs[0]));
      HORA_CHECK_MPI(MPI_Isend(send + std::min(off, sendBytes), s, MPI_BYTE, right, kRingTag, comm_, &reqs[1]));
      wait(reqs, 2, "allreduce");
    }
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

  static constexpr int kRingTag = 1;  // the large-count alltoall's exchanges use tag 0
  MPI_Comm comm_;
  double timeoutS_;
  MPI_Op wrappingSum_ = MPI_OP_NULL;  // for isNarrowInteger dtypes
  MPI_Op wrappingProduct_ = MPI_OP_NULL;
  std::vector<char> scratch_;  // the ring's incoming segment
  std::vector<uint8_t> bools_;  // a bool reducescatter's input as 0/1 bytes
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Backend> createMpiBackend(MPI_Comm comm, const Knobs &knobs) {
  return std::make_unique<MpiBackend>(comm, knobs.timeoutS);
}

}  // namespace hora
