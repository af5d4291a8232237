// SPDX-License-Identifier: Apache-2.0
// The env:// and Slurm worlds' transport: a group whose control plane runs on a Gloo context over
// TCP. The Gloo backend (backends/gloo) moves data on the same context.
#pragma once

#include <gloo/context.h>

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/env/tcp_store.h"

namespace hora {

// Rendezvous through hora's TCP store (keys under `prefix`), then a full mesh of TCP pairs.
// Every collective of the control plane waits at most timeoutS for a peer.
class GlooGroup final : public Group {
 public:
  // localAddress: the address peers reach this rank at (see routeAddressTo in
  // bootstrap/env/env_bootstrap.h).
  GlooGroup(std::shared_ptr<TcpStoreClient> store, const std::string &prefix, int rank, int size,
            const std::string &localAddress, double timeoutS);
  ~GlooGroup() override;

  ControlPlane &control() override { return *plane_; }
  void poison(int, const std::string &) override {}
  bool usesSockets() const override { return true; }
  Presence *presence() override { return presence_.get(); }
  // The side channel the bootstrap gives the group (words through the store).
  void setPresence(std::unique_ptr<Presence> presence) { presence_ = std::move(presence); }
  const std::shared_ptr<gloo::Context> &context() const { return context_; }
  double timeoutS() const { return timeoutS_; }

 private:
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<ControlPlane> plane_;
  double timeoutS_;
  std::vector<std::string> peerAddresses_;  // by peer rank: its pair to this rank listens there
  std::unique_ptr<Presence> presence_;
};

// Runs `body`, turning Gloo's exceptions into hora's: timeouts -> HORA_ERR_TIMEOUT, a closed or
// reset connection -> HORA_ERR_PEER_LOST, anything else -> HORA_ERR_BACKEND, naming `what`.
template <typename F>
void glooCall(const char *what, int rank, F &&body);

}  // namespace hora

#include "bootstrap/env/gloo_call.inl"
