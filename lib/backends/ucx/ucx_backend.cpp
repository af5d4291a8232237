// SPDX-License-Identifier: Apache-2.0
// UcxBackend: hora's Backend and negotiation plane on UcxComm and the collectives of
// ucx_collectives.h, reducing through core's kernels.
#include "backends/ucx/ucx_backend.h"

#include <cstring>

#include "backends/ucx/ucx_collectives.h"
#include "backends/ucx/ucx_comm.h"
#include "base/logging.h"
#include "core/kernels.h"

namespace hora {
namespace {

ucx::Combine combineFor(DType dtype, ReduceOp op) {
  return [dtype, op](void *dst, const void *src, int64_t count) { reduceInto(dst, src, count, dtype, op); };
}

// Negotiation on the same worker: every call is made by the set's cycle thread in the order every
// rank makes it, like the data collectives, so they share the sequence numbers.
class UcxNegotiation final : public ControlPlane {
 public:
  explicit UcxNegotiation(UcxComm &comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void allreduceAnd(std::vector<uint64_t> &words) override { ucx::andWords(comm_, words, scratch_); }
  std::vector<std::string> gatherToRoot(const std::string &blob) override {
    return ucx::gatherToRoot(comm_, blob);
  }
  void broadcastFromRoot(std::string &blob) override { ucx::broadcastFromRoot(comm_, blob); }

 private:
  UcxComm &comm_;
  std::vector<uint8_t> scratch_;
};

class UcxBackend final : public Backend {
 public:
  UcxBackend(Group &group, double timeoutS)
      : comm_(group, timeoutS), negotiation_(comm_), tuning_(ucx::Tuning::fromEnvironment()) {
    // Connect every endpoint now (UCX wires up on first use) so that the first collective does not
    // pay for it, and say what UCX chose.
    std::vector<uint64_t> hello(1, ~0ull);
    negotiation_.allreduceAnd(hello);
    std::vector<int64_t> none(static_cast<size_t>(comm_.size()), 0);
    ucx::alltoallv(comm_, nullptr, none, nullptr, none);
    HORA_LOG(kInfo) << "UCX plane: " << comm_.size() << " ranks; transports to each peer: "
                    << comm_.transports();
  }

  const char *name() const override { return "ucx"; }
  const BackendCaps &caps() const override {
    static const BackendCaps kCaps = [] {
      BackendCaps c = BackendCaps::plain(/*usesSockets=*/true, BackendCaps::Scope::kAnyHost);
      return c;
    }();
    return kCaps;
  }
  ControlPlane *negotiationPlane() override { return &negotiation_; }

  void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) override {
    if (count == 0) return;
    if (dtype == DType::kBool) {
      normalizeBools(out, in, count);  // a set of one reduces nothing, yet its result is 0 or 1
    } else if (in != out) {
      copyBytes(out, in, static_cast<size_t>(count) * dtypeSize(dtype));
    }
    ucx::allreduce(comm_, tuning_, out, count, dtypeSize(dtype), combineFor(dtype, op), scratch_);
  }

  void broadcast(void *buf, int64_t bytes, int root) override {
    ucx::broadcast(comm_, tuning_, buf, static_cast<size_t>(bytes), root);
  }

  void allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) override {
    ucx::allgatherv(comm_, in, out, bytesPerRank);
  }

  void alltoallv(const void *in, const std::vector<int64_t> &sendBytes, void *out,
                 const std::vector<int64_t> &recvBytes) override {
    ucx::alltoallv(comm_, in, sendBytes, out, recvBytes);
  }

  void reducescatter(const void *in, void *out, const std::vector<int64_t> &counts, DType dtype,
                     ReduceOp op) override {
    const size_t esize = dtypeSize(dtype);
    int64_t total = 0, before = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      if (static_cast<int>(r) < comm_.rank()) before += counts[r];
      total += counts[r];
    }
    work_.resize(static_cast<size_t>(total) * esize + 1);
    if (dtype == DType::kBool) {
      normalizeBools(work_.data(), in, total);
    } else if (total > 0) {
      copyBytes(work_.data(), in, static_cast<size_t>(total) * esize);
    }
    ucx::reduceScatterInPlace(comm_, tuning_, work_.data(), counts, esize, combineFor(dtype, op), scratch_);
    const int64_t mine = counts[static_cast<size_t>(comm_.rank())];
    if (mine > 0) copyBytes(out, work_.data() + static_cast<size_t>(before) * esize, static_cast<size_t>(mine) * esize);
  }

 private:
  UcxComm comm_;
  UcxNegotiation negotiation_;
  ucx::Tuning tuning_;
  std::vector<uint8_t> scratch_, work_;
};

}  // namespace

std::unique_ptr<Backend> createUcxBackend(Group &group, double timeoutS) {
  return std::make_unique<UcxBackend>(group, timeoutS);
}

std::string ucxDescription() { return describeUcx(); }

}  // namespace hora
