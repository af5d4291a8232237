// SPDX-License-Identifier: Apache-2.0
// UcxBackend: core's LinkBackend (the collectives of core/collectives/ and the negotiation plane)
// over UcxComm, the UCX plane's Link, plus the bell that wakes the engine between cycles.
// Its factory is declared, and documented, beside the registry's row that calls it (registry.cpp).
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "backends/ucx/ucx_comm.h"
#include "base/logging.h"
#include "core/collectives/link_backend.h"

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

// UCX writes to its sockets with MSG_NOSIGNAL: a lost peer is an error, never SIGPIPE.
const BackendCaps &ucxCaps() {
  static const BackendCaps kCaps = BackendCaps::plain(/*usesSockets=*/false, BackendCaps::Scope::kAnyHost);
  return kCaps;
}

// Negotiation runs on the same worker as the data (LinkBackend's negotiation plane): every call is
// made by the set's cycle thread in the order every rank makes it, like the data collectives.
class UcxBackend final : public LinkBackend {
 public:
  UcxBackend(const std::shared_ptr<UcxComm> &comm, const Knobs &knobs)
      : LinkBackend(comm, ucxCaps(), knobs, /*negotiates=*/true), comm_(*comm), bell_(comm_) {
    // Connect the endpoints now (UCX wires up on first use) so that the first collective does not
    // pay for it, and say what UCX chose.
    std::vector<uint64_t> hello(1, ~0ull);
    negotiationPlane()->allreduceAnd(hello);
    HORA_LOG(kInfo) << "UCX plane: " << comm_.size() << " ranks; transports to each peer: "
                    << comm_.transports();
  }

  PeerBell *peerBell() override { return &bell_; }

 private:
  UcxComm &comm_;  // the link, which LinkBackend owns
  UcxBell bell_;
};

}  // namespace

std::unique_ptr<Backend> createUcxBackend(Group &group, const Knobs &knobs) {
  return std::make_unique<UcxBackend>(std::make_shared<UcxComm>(group, knobs), knobs);
}

std::string ucxDescription() {
  return describeUcx() + "; HORA_LOG_LEVEL=info logs the one each rank chose per peer";
}

}  // namespace hora
