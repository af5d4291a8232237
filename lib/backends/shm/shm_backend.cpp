// SPDX-License-Identifier: Apache-2.0
// ShmBackend: the Backend face of the intra-host path; the work is done by the pieces it holds.
#include "backends/shm/shm_backend.h"

#include <unistd.h>


#include "backends/shm/shm_allreduce.h"
#include "backends/shm/shm_channel.h"
#include "backends/shm/shm_negotiation.h"
#include "backends/shm/shm_segment.h"
#include "base/error.h"
#include "base/process.h"
#include "core/forming.h"
#include "core/wrapping_backend.h"

namespace hora {
namespace {

// Allreduce (and the negotiation AND, and the bell) through the segment; every other call goes
// to the inner backend (WrappingBackend). Called like any Backend: one thread at a time, in the
// set's cycles.
class ShmBackend final : public WrappingBackend {
 public:
  ShmBackend(std::unique_ptr<Backend> inner, std::unique_ptr<ShmSegment> segment, int rank,
             int size, const Knobs &knobs)
      : WrappingBackend(std::move(inner)),
        channel_(std::move(segment), rank, size, knobs.timeoutS),
        allreduce_(channel_, knobs.shm == "cma", knobs.shmStream),
        negotiation_(channel_),
        name_(std::string(this->inner().name()) + "+shm") {
    // Allreduce here, in place and with half types; everything else as the inner backend does it.
    caps_ = this->inner().caps();
    caps_.reducesSpansInPlace = true;
    caps_.negotiationWords = ShmNegotiation::kWords;
    caps_.scope = BackendCaps::Scope::kOneHost;
  }

  // Collective over `control`, once, before the first call.
  void connect(ControlPlane &control) {
    channel_.connect(control);
    if (allreduce_.connect(control)) name_ += "/single-copy";
  }

  const char *name() const override { return name_.c_str(); }
  void interrupt(const Status &why) override {
    channel_.barrier().interrupt(why);
    WrappingBackend::interrupt(why);
  }
  PeerBell *peerBell() override { return channel_.bell(); }
  const BackendCaps &caps() const override { return caps_; }

  void allreduceSpans(const std::vector<Span> &spans, DType dtype, ReduceOp op, double prescale,
                      double postscale) override {
    ranHere(nullptr);
    allreduce_.run(spans, dtype, op, prescale, postscale);
  }
  void andWords(std::vector<uint64_t> &words) override { negotiation_.andWords(words); }
  void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) override {
    ranHere(nullptr);
    allreduce_.run({{in, out, count}}, dtype, op, 1.0, 1.0);
  }

 private:
  ShmChannel channel_;  // before the pieces that hold a reference to it
  ShmAllreduce allreduce_;
  ShmNegotiation negotiation_;
  std::string name_;  // "<inner>+shm", with "/single-copy" once connect() found it possible
  BackendCaps caps_;
};

}  // namespace

std::unique_ptr<Backend> wrapWithShm(std::unique_ptr<Backend> inner, Group &group,
                                     const Knobs &knobs, std::string *why) {
  ControlPlane &control = group.control();
  if (knobs.shm == "off") {
    *why = "HORA_SHM=off";
    return inner;
  }
  if (control.size() == 1) {
    *why = "a group of one";
    return inner;
  }
  if (control.size() > ShmBarrierState::kMaxRanks) {
    *why = detail::concat("more than ", ShmBarrierState::kMaxRanks, " ranks");
    return inner;
  }
  // All on one host? Rank 0 compares host names and boot ids and tells the others.
  std::string verdict;
  formingPhase(group, "checking whether every rank is on one host", [&] {
    std::vector<std::string> hosts = control.gatherToRoot(hostIdentity());
    if (control.rank() == 0) {
      for (size_t r = 1; r < hosts.size() && verdict.empty(); ++r) {
        if (hosts[r] != hosts[0]) {
          verdict = detail::concat("rank ", r, " is on another host (", hostOfIdentity(hosts[r]),
                                   ", rank 0 on ", hostOfIdentity(hosts[0]), ")");
        }
      }
    }
    control.broadcastFromRoot(verdict);
  });
  if (!verdict.empty()) {
    *why = verdict;
    return inner;
  }
  std::unique_ptr<ShmBackend> shm;
  formingPhase(group, "setting up the shared-memory segment", [&] {
    std::unique_ptr<ShmSegment> segment =
        ShmSegment::create(control, ShmChannel::segmentBytes(control.size()), why);
    if (!segment) return;
    shm = std::make_unique<ShmBackend>(std::move(inner), std::move(segment), control.rank(),
                                       control.size(), knobs);
    shm->connect(control);
  });
  if (!shm) return inner;
  return shm;
}

}  // namespace hora
