// SPDX-License-Identifier: Apache-2.0
// A world of one: every collective of the control plane is the identity.
#include "base/error.h"
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

class SelfGroup final : public Group {
 public:
  ControlPlane &control() override { return plane_; }
  void poison(int, const std::string &) override {}
  bool usesSockets() const override { return false; }

 private:
  SelfControlPlane plane_;
};

class SingleBootstrap final : public Bootstrap {
 public:
  const char *launcher() const override { return "single"; }
  const Topology &topology() const override { return topology_; }
  std::unique_ptr<Group> worldGroup() override { return std::make_unique<SelfGroup>(); }
  std::unique_ptr<Group> createGroup(Group &, const std::vector<int> &ranks) override {
    HORA_ENFORCE(ranks.size() == 1 && ranks[0] == 0, "a world of one has only rank 0");
    return std::make_unique<SelfGroup>();
  }
  std::unique_ptr<Group> splitGroup(Group &, int color, int) override {
    if (color < 0) return nullptr;
    return std::make_unique<SelfGroup>();
  }

 private:
  Topology topology_;
};

}  // namespace

std::unique_ptr<Bootstrap> createSingleBootstrap() { return std::make_unique<SingleBootstrap>(); }

}  // namespace hora
