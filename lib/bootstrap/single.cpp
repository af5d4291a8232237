// SPDX-License-Identifier: Apache-2.0
// A world of one: every collective of the control plane is the identity.
#include "bootstrap/bootstrap.h"

namespace hora {
namespace {

class SelfControlPlane final : public ControlPlane {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduceAnd(std::vector<uint64_t> &) override {}
  std::vector<std::string> gatherToRoot(const std::string &blob) override { return {blob}; }
  void broadcastFromRoot(std::string &) override {}
};

class SingleBootstrap final : public Bootstrap {
 public:
  const char *launcher() const override { return "single"; }
  const Topology &topology() const override { return topology_; }
  ControlPlane &worldControl() override { return plane_; }
  void poison() override {}

 private:
  Topology topology_;
  SelfControlPlane plane_;
};

}  // namespace

std::unique_ptr<Bootstrap> createSingleBootstrap() { return std::make_unique<SingleBootstrap>(); }

}  // namespace hora
