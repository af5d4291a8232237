// SPDX-License-Identifier: Apache-2.0
// The composition root's one implementation of Fabric, and the process's runtime.
#include "api/runtime.h"

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "backends/registry.h"
#include "base/logging.h"
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

namespace {

// The running runtime. gLifecycle serializes init and shutdown; gEngineMutex guards the pointer
// itself and gJoinMode, so that submitting threads can take a reference without waiting for a
// slow init/shutdown, and a join mode set while a runtime starts reaches it.
std::mutex gLifecycle;
std::mutex gEngineMutex;
std::shared_ptr<Engine> gEngine;
uint8_t gJoinMode = HORA_JOIN_ZERO_FILL;  // per process, kept across hora_shutdown and hora_init

// At process exit: a runtime still running (hora_shutdown was not called, or the program is
// exiting on an error) is stopped first, with a bounded wait since a peer may be gone; only a
// runtime that stopped lets MPI be finalized, as MPI may not be finalized under a thread in it.
void stopAtExit() {
  bool stopped = true;
  std::shared_ptr<Engine> engine = currentRuntime();
  if (engine) {
    // Even a world that a peer stopped may still have set engines finishing their last cycle.
    if (engine->running()) {
      HORA_LOG(kWarning) << "the process is exiting without hora_shutdown; shutting hora down";
    }
    stopped = engine->shutdownWithin(std::chrono::seconds(10));
    if (!stopped) {
      HORA_LOG(kWarning) << "hora did not stop within 10 s; MPI is left unfinalized";
    }
  }
  if (stopped) finalizeAtExit();
}
std::once_flag gAtExitOnce;

}  // namespace

std::shared_ptr<Engine> currentRuntime() {
  std::lock_guard<std::mutex> lock(gEngineMutex);
  return gEngine;
}

void initRuntime() {
  std::lock_guard<std::mutex> lifecycle(gLifecycle);
  std::shared_ptr<Engine> old = currentRuntime();
  if (old && old->running()) return;
  if (old) {  // stopped on its own (a peer shut down, or a fatal error): reap it first
    old->shutdown();
    std::lock_guard<std::mutex> lock(gEngineMutex);
    gEngine.reset();
  }
  KnobReport report;
  Knobs knobs = Knobs::fromEnvironment(&report);
  setLogLevel(knobs.logLevel);
  std::shared_ptr<Engine> engine;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(knobs.timeoutS * 1000.0));
  takeElasticFormationAbandoned();  // what earlier runtimes saw is not this one's
  for (;;) {
    try {
      engine = startRuntime(knobs);
      break;
    } catch (const Error &e) {
      // An elastic worker whose world the agents gave up on while it formed (a member died
      // before joining it): join the next one, as a worker that asked late would.
      if (takeElasticFormationAbandoned() && std::chrono::steady_clock::now() < deadline) {
        HORA_LOG(kInfo) << "elastic: the world this worker was joining is being replaced ("
                        << e.message() << "); joining the next one";
        continue;
      }
      logKnobNotes(report);  // no world, no rank: a misspelt knob may be why, so every rank says it
      throw;
    } catch (...) {
      logKnobNotes(report);
      throw;
    }
  }
  // One copy per host: a host's ranks share their launcher's environment.
  if (engine->topology().localRank == 0) logKnobNotes(report);
  // Registered after the first start, so it runs before any exit handler MPI registered then.
  std::call_once(gAtExitOnce, [] { std::atexit(stopAtExit); });
  std::lock_guard<std::mutex> lock(gEngineMutex);
  engine->setJoinMode(gJoinMode);
  gEngine = std::move(engine);
}

bool shutdownRuntime() {
  std::lock_guard<std::mutex> lifecycle(gLifecycle);
  std::shared_ptr<Engine> engine = currentRuntime();
  if (!engine) return false;
  engine->shutdown();
  std::lock_guard<std::mutex> lock(gEngineMutex);
  gEngine.reset();
  return true;
}

namespace devices {
bool available() { return haveDevicePlane(); }
std::string whyNotUsable(int device) { return whyNoCudaDevice(device); }
std::string whyNotReduced(DType dtype) { return whyCudaCannotReduce(dtype); }
std::shared_ptr<void> recordCallerWork(int device, void *stream) {
  return hora::recordCallerWork(device, stream);
}
}  // namespace devices

int runtimeWorldChanged() { return currentRuntime() ? elasticWorldChanged() : 0; }

void setProcessJoinMode(uint8_t mode) {
  std::lock_guard<std::mutex> lock(gEngineMutex);
  gJoinMode = mode;
  if (gEngine) gEngine->setJoinMode(mode);
}

}  // namespace hora
