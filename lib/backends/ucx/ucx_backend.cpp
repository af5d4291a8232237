// SPDX-License-Identifier: Apache-2.0
// UcxBackend: hora's Backend and negotiation plane on UcxComm and the collectives of
// ucx_collectives.h, reducing through core's kernels.
#include "backends/ucx/ucx_backend.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "backends/ucx/ucx_collectives.h"
#include "backends/ucx/ucx_comm.h"
#include "base/logging.h"
#include "core/kernels.h"

namespace hora {
namespace {

// Wakes this rank's engine between cycles when a peer's first message of the next cycle arrives
// (the worker's event descriptor) or when this rank's own threads queue work (an eventfd).
class UcxBell final : public PeerBell {
 public:
  explicit UcxBell(UcxComm &comm) : comm_(comm), wake_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (wake_ < 0) HORA_THROW(HORA_ERR_BACKEND, "eventfd: ", std::strerror(errno));
  }
  ~UcxBell() override { close(wake_); }
  bool arm(uint32_t *ticket) override {
    *ticket = 0;
    // A caller thread running a cycle holds the worker: no sleep then, the cycle is progress.
    std::unique_lock<std::mutex> hold(comm_.mutex(), std::try_to_lock);
    return hold.owns_lock() && comm_.armForNextCycle();
  }
  void sleep(uint32_t, std::chrono::nanoseconds limit) override {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(limit).count();
    if (ms <= 0 && limit.count() <= 0) return;
    pollfd fds[2] = {{comm_.eventFd(), POLLIN, 0}, {wake_, POLLIN, 0}};
    const timespec ts{static_cast<time_t>(limit.count() / 1000000000),
                      static_cast<long>(limit.count() % 1000000000)};
    ppoll(fds, 2, &ts, nullptr);
    uint64_t drained;
    while (read(wake_, &drained, sizeof drained) > 0) {
    }
  }
  void ring() override {
    const uint64_t one = 1;
    ssize_t ignored = write(wake_, &one, sizeof one);
    (void)ignored;
  }

 private:
  UcxComm &comm_;
  int wake_;
};

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
  void allreduceAnd(std::vector<uint64_t> &words) override {
    std::lock_guard<std::mutex> hold(comm_.mutex());
    ucx::andWords(comm_, words, scratch_);
  }
  std::vector<std::string> gatherToRoot(const std::string &blob) override {
    std::lock_guard<std::mutex> hold(comm_.mutex());
    return ucx::gatherToRoot(comm_, blob);
  }
  void broadcastFromRoot(std::string &blob) override {
    std::lock_guard<std::mutex> hold(comm_.mutex());
    ucx::broadcastFromRoot(comm_, blob);
  }

 private:
  UcxComm &comm_;
  std::vector<uint8_t> scratch_;
};

class UcxBackend final : public Backend {
 public:
  UcxBackend(Group &group, const Knobs &knobs)
      : comm_(group, knobs), negotiation_(comm_), bell_(comm_), tuning_(ucx::Tuning::fromKnobs(knobs)) {
    // Connect every endpoint now (UCX wires up on first use) so that the first collective does not
    // pay for it, and say what UCX chose.
    std::vector<uint64_t> hello(1, ~0ull);
    negotiation_.allreduceAnd(hello);
    std::vector<int64_t> none(static_cast<size_t>(comm_.size()), 0);
    alltoallv(nullptr, none, nullptr, none);
    HORA_LOG(kInfo) << "UCX plane: " << comm_.size() << " ranks; transports to each peer: "
                    << comm_.transports();
  }

  const char *name() const override { return "ucx"; }
  void interrupt(const Status &why) override { comm_.interrupt(why); }
  const BackendCaps &caps() const override {
    static const BackendCaps kCaps = [] {
      // UCX writes to its sockets with MSG_NOSIGNAL: a lost peer is an error, never SIGPIPE.
      return BackendCaps::plain(/*usesSockets=*/false, BackendCaps::Scope::kAnyHost);
    }();
    return kCaps;
  }
  ControlPlane *negotiationPlane() override { return &negotiation_; }
  PeerBell *peerBell() override { return &bell_; }

  void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) override {
    std::lock_guard<std::mutex> hold(comm_.mutex());
    if (count == 0) return;
    if (dtype == DType::kBool) {
      normalizeBools(out, in, count);  // a set of one reduces nothing, yet its result is 0 or 1
    } else if (in != out) {
      copyBytes(out, in, static_cast<size_t>(count) * dtypeSize(dtype));
    }
    ucx::allreduce(comm_, tuning_, out, count, dtypeSize(dtype), combineFor(dtype, op), scratch_);
  }

  void broadcast(void *buf, int64_t bytes, int root) override {
    std::lock_guard<std::mutex> hold(comm_.mutex());
    ucx::broadcast(comm_, tuning_, buf, static_cast<size_t>(bytes), root);
  }

  void allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) override {
    std::lock_guard<std::mutex> hold(comm_.mutex());
    ucx::allgatherv(comm_, in, out, bytesPerRank);
  }

  void alltoallv(const void *in, const std::vector<int64_t> &sendBytes, void *out,
                 const std::vector<int64_t> &recvBytes) override {
    std::lock_guard<std::mutex> hold(comm_.mutex());
    ucx::alltoallv(comm_, in, sendBytes, out, recvBytes);
  }

  void reducescatter(const void *in, void *out, const std::vector<int64_t> &counts, DType dtype,
                     ReduceOp op) override {
    std::lock_guard<std::mutex> hold(comm_.mutex());
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
  UcxBell bell_;
  ucx::Tuning tuning_;
  std::vector<uint8_t> scratch_, work_;
};

}  // namespace

std::unique_ptr<Backend> createUcxBackend(Group &group, const Knobs &knobs) {
  return std::make_unique<UcxBackend>(group, knobs);
}

std::string ucxDescription() { return describeUcx(); }

}  // namespace hora
