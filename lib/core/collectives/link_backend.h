// SPDX-License-Identifier: Apache-2.0
// One backend for every plane that is a Link: the collectives of the algorithm tables over the
// plane's link, reducing with core's kernels; and the control plane's three collectives over
// the same link.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "base/knobs.h"
#include "core/backend.h"
#include "core/collectives/algorithms.h"
#include "core/control_plane.h"
#include "core/link.h"

namespace hora {

// Negotiation over a link: the AND by the allreduce table (with no algorithm forced), the blobs
// by the control plane's gather and binomial broadcast. Errors name the engine's purpose, or
// while a group forms (core/forming.h) the phase's.
class LinkControlPlane final : public ControlPlane {
 public:
  explicit LinkControlPlane(std::shared_ptr<Link> link) : link_(std::move(link)) {}
  int rank() const override { return link_->rank(); }
  int size() const override { return link_->size(); }
  void allreduceAnd(std::vector<uint64_t> &words) override;
  std::vector<std::string> gatherToRoot(const std::string &blob) override;
  void broadcastFromRoot(std::string &blob) override;

 private:
  std::shared_ptr<Link> link_;
  std::vector<uint8_t> scratch_;
};

// A plane that is a link: each collective picks its algorithm by the tables (HORA_ALGORITHM may
// force one) and says which it ran (lastAlgorithm). A plane derives from it only to keep what
// its link needs alive, to add a bell, or (MPI) to hand some calls to its own library.
class LinkBackend : public Backend {
 public:
  // `negotiates`: negotiation runs on the link too (negotiationPlane), where the group's own
  // control plane is another channel. Throws Error for a bad HORA_ALGORITHM.
  LinkBackend(std::shared_ptr<Link> link, const BackendCaps &caps, const Knobs &knobs, bool negotiates);

  const char *name() const override { return link_->name(); }
  const BackendCaps &caps() const override { return caps_; }
  ControlPlane *negotiationPlane() override { return negotiates_ ? &control_ : nullptr; }
  void interrupt(const Status &why) override { link_->interrupt(why); }
  const char *lastAlgorithm() const override { return last_; }

  void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) override;
  void broadcast(void *buf, int64_t bytes, int root) override;
  void allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) override;
  void alltoallv(const void *in, const std::vector<int64_t> &sendBytes, void *out,
                 const std::vector<int64_t> &recvBytes) override;
  void reducescatter(const void *in, void *out, const std::vector<int64_t> &counts, DType dtype,
                     ReduceOp op) override;

 protected:
  Link &link() { return *link_; }
  // A collective the subclass ran by other means (MPI's library): lastAlgorithm() says
  // `algorithm` (static text).
  void ranOwn(const char *algorithm) { last_ = algorithm; }

 private:
  // Runs one collective under the link's drive lock and failure words.
  template <typename Body>
  void drive(const char *what, Body &&body);

  std::shared_ptr<Link> link_;
  BackendCaps caps_;
  collectives::Choices choices_;
  bool negotiates_;
  LinkControlPlane control_;
  const char *last_ = nullptr;
  std::vector<uint8_t> scratch_, work_;
};

}  // namespace hora
