// SPDX-License-Identifier: Apache-2.0
// The composition root's one implementation of Fabric.
#include "api/runtime.h"

#include "backends/registry.h"
#include "bootstrap/bootstrap.h"

namespace hora {
namespace {

class DefaultFabric final : public Fabric {
 public:
  explicit DefaultFabric(const Knobs &knobs) : knobs_(knobs) {}

  std::unique_ptr<Bootstrap> formWorld() override { return createBootstrap(knobs_); }

  std::unique_ptr<Backend> cpuBackend(Bootstrap &world, Group &group) override {
    return createCpuBackend(knobs_, world, group);
  }

  std::unique_ptr<DeviceExecutor> deviceExecutor(ControlPlane &control, int device,
                                                 DeviceHooks hooks) override {
    return createDeviceExecutor(control, device, std::move(hooks), knobs_);
  }
  int defaultDevice(int localRank) override { return defaultCudaDevice(localRank); }
  std::shared_ptr<void> keepDeviceContext() override { return keepCudaContext(); }

 private:
  const Knobs knobs_;
};

}  // namespace

std::shared_ptr<Fabric> defaultFabric(const Knobs &knobs) {
  return std::make_shared<DefaultFabric>(knobs);
}

std::shared_ptr<Engine> startRuntime(const Knobs &knobs) {
  return Engine::start(knobs, defaultFabric(knobs));
}

namespace devices {
bool available() { return haveDevicePlane(); }
std::string whyNotUsable(int device) { return whyNoCudaDevice(device); }
std::string whyNotReduced(DType dtype) { return whyCudaCannotReduce(dtype); }
std::shared_ptr<void> recordCallerWork(int device, void *stream) {
  return hora::recordCallerWork(device, stream);
}
}  // namespace devices

}  // namespace hora
