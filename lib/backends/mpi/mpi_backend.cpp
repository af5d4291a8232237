// SPDX-License-Identifier: Apache-2.0
// MPI backend: blocking collectives on a private communicator, in chunks that fit MPI's int
// counts. Blocking is safe here: negotiation has already established that every rank makes this
// call now.
#include "backends/mpi/mpi_backend.h"

#include <algorithm>
#include <climits>

#include "bootstrap/mpi/mpi_bootstrap.h"

namespace hora {
namespace {

constexpr int64_t kMaxChunk = int64_t{1} << 30;  // elements or bytes per MPI call

MPI_Datatype mpiType(DType t) {
  switch (t) {
    case DType::kUInt8: return MPI_UINT8_T;
    case DType::kInt8: return MPI_INT8_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kFloat16:
    case DType::kBFloat16: break;
  }
  HORA_THROW(HORA_ERR_INTERNAL, "the MPI backend has no MPI type for ", dtypeName(t),
             " (the engine widens it to float32)");
}

MPI_Op mpiOp(ReduceOp op) {
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
  explicit MpiBackend(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  const char *name() const override { return "mpi"; }

  void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) override {
    const MPI_Datatype type = mpiType(dtype);
    const MPI_Op mop = mpiOp(op);
    const size_t esize = dtypeSize(dtype);
    for (int64_t off = 0; off < count; off += kMaxChunk) {
      const int n = static_cast<int>(std::min(kMaxChunk, count - off));
      char *o = static_cast<char *>(out) + off * static_cast<int64_t>(esize);
      const void *i = in == out ? MPI_IN_PLACE : static_cast<const char *>(in) + off * static_cast<int64_t>(esize);
      HORA_CHECK_MPI(MPI_Allreduce(i, o, n, type, mop, comm_));
    }
  }

  void broadcast(void *buf, int64_t bytes, int root) override {
    for (int64_t off = 0; off < bytes; off += kMaxChunk) {
      const int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
      HORA_CHECK_MPI(MPI_Bcast(static_cast<char *>(buf) + off, n, MPI_BYTE, root, comm_));
    }
  }

  void allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) override {
    std::vector<int> counts, displs;
    int64_t total = 0;
    bool fits = true;
    for (int64_t n : bytesPerRank) {
      fits = fits && n <= INT_MAX && total <= INT_MAX;
      counts.push_back(static_cast<int>(std::min<int64_t>(n, INT_MAX)));
      displs.push_back(static_cast<int>(std::min<int64_t>(total, INT_MAX)));
      total += n;
    }
    char *o = static_cast<char *>(out);
    if (fits) {
      // Send from the output slot so the input may alias nothing in particular.
      const int64_t mine = bytesPerRank[static_cast<size_t>(rank_)];
      if (mine > 0) std::copy_n(static_cast<const char *>(in), mine, o + displs[static_cast<size_t>(rank_)]);
      HORA_CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, o, counts.data(), displs.data(),
                                    MPI_BYTE, comm_));
      return;
    }
    // Past MPI's int counts: each rank broadcasts its block in chunks.
    int64_t off = 0;
    for (int r = 0; r < size_; ++r) {
      const int64_t n = bytesPerRank[static_cast<size_t>(r)];
      if (r == rank_ && n > 0) std::copy_n(static_cast<const char *>(in), n, o + off);
      broadcast(o + off, n, r);
      off += n;
    }
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Backend> createMpiBackend(MPI_Comm comm) { return std::make_unique<MpiBackend>(comm); }

}  // namespace hora
