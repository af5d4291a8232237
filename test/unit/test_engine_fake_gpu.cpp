// SPDX-License-Identifier: Apache-2.0
// The whole engine (a world of one) with CUDA tensors on the fake device: device ops are queued
// and completed by ticket, so the engine keeps negotiating and running CPU ops while the "GPU"
// works; an orderly shutdown waits for queued device work.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "api/runtime.h"
#include "backends/nccl/nccl_executor.h"
#include "fake_device.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;

// The default fabric for the world and the CPU, the fake device for CUDA tensors.
class FakeGpuFabric final : public Fabric {
 public:
  FakeGpuFabric(const Knobs &knobs, gpu::DeviceApi &api) : inner_(defaultFabric(knobs)), api_(api), knobs_(knobs) {}
  std::unique_ptr<Bootstrap> formWorld() override { return inner_->formWorld(); }
  std::unique_ptr<Backend> cpuBackend(Bootstrap &world, Group &group) override {
    return inner_->cpuBackend(world, group);
  }
  std::unique_ptr<DeviceExecutor> deviceExecutor(ControlPlane &control, int device, DeviceHooks hooks) override {
    return createNcclExecutor(api_, control, device, knobs_.timeoutS, std::move(hooks));
  }
  int defaultDevice(int localRank) override { return defaultCudaDevice(api_, localRank); }

 private:
  std::shared_ptr<Fabric> inner_;
  gpu::DeviceApi &api_;
  Knobs knobs_;
};

RequestPtr allreduce(const std::string &name, std::vector<float> &data, Device device, double prescale = 1.0) {
  RequestMsg m;
  m.name = name;
  m.op = OpType::kAllreduce;
  m.dtype = DType::kFloat32;
  m.device = device;
  m.prescale = prescale;
  m.shapes = {{static_cast<int64_t>(data.size())}};
  return std::make_shared<Request>(
      m, 0, std::vector<TensorArg>{{data.data(), data.data(), static_cast<int64_t>(data.size())}});
}

bool doneWithin(const Request &r, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (!r.done() && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return r.done();
}

struct World {
  World() {
    Knobs k;
    k.bootstrap = "single";
    k.timeoutS = 20;
    engine = Engine::start(k, std::make_shared<FakeGpuFabric>(k, device));
  }
  ~World() {
    device.hold(false);
    engine->shutdown();
    engine.reset();
  }
  test::FakeCluster cluster;
  test::FakeDevice device{cluster, 0, 1};
  std::shared_ptr<Engine> engine;
};

TEST(EngineFakeGpu, CpuOpsRunWhileDeviceWorkIsQueued) {
  World w;
  const Device cuda{2, 0};
  std::vector<float> g1(10, 1.0f), g2(3, 5.0f), cpu(4, 7.0f);
  // The first CUDA op makes the communicator; then the "GPU" is held busy.
  std::vector<float> warm(2, 1.0f);
  RequestPtr first = allreduce("warm", warm, cuda);
  w.engine->submit(first);
  ASSERT_TRUE(doneWithin(*first, std::chrono::seconds(10)));
  w.device.hold(true);
  RequestPtr a = allreduce("g1", g1, cuda, 2.0), b = allreduce("g2", g2, cuda, 2.0);
  w.engine->submit(a);
  w.engine->submit(b);
  const auto queuedBy = Clock::now() + std::chrono::seconds(10);
  while (w.device.count("allReduce") < 2 && Clock::now() < queuedBy) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(a->done()) << "completed before the device ran it";
  // The engine is not waiting for the device: a CPU op goes through meanwhile.
  RequestPtr c = allreduce("cpu", cpu, Device{});
  w.engine->submit(c);
  w.engine->drive(*c);
  EXPECT_TRUE(doneWithin(*c, std::chrono::seconds(10))) << "a CPU op waited for device work";
  EXPECT_TRUE(c->status().ok()) << c->status().message;
  EXPECT_FALSE(a->done());
  w.device.hold(false);
  ASSERT_TRUE(doneWithin(*a, std::chrono::seconds(10)));
  ASSERT_TRUE(doneWithin(*b, std::chrono::seconds(10)));
  EXPECT_TRUE(a->status().ok()) << a->status().message;
  EXPECT_EQ(g1, std::vector<float>(10, 2.0f)) << "prescale 2 in a world of one";
  EXPECT_EQ(g2, std::vector<float>(3, 10.0f));
  EXPECT_EQ(cpu, std::vector<float>(4, 7.0f));
}

TEST(EngineFakeGpu, ShutdownWaitsForQueuedDeviceWork) {
  World w;
  const Device cuda{2, 0};
  std::vector<float> warm(2, 1.0f), g(6, 3.0f);
  RequestPtr first = allreduce("warm", warm, cuda);
  w.engine->submit(first);
  ASSERT_TRUE(doneWithin(*first, std::chrono::seconds(10)));
  w.device.hold(true);
  RequestPtr a = allreduce("g", g, cuda, 0.5);
  w.engine->submit(a);
  const auto queuedBy = Clock::now() + std::chrono::seconds(10);
  while (w.device.count("allReduce") < 2 && Clock::now() < queuedBy) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    w.device.hold(false);
  });
  w.engine->shutdown();
  releaser.join();
  ASSERT_TRUE(a->done());
  EXPECT_TRUE(a->status().ok()) << a->status().message;
  EXPECT_EQ(g, std::vector<float>(6, 1.5f));
}

// A stream-ordered wait returns once the engine has queued the op, with the caller's stream
// behind it: the caller's copy of the result runs after the op although the host never waited.
TEST(EngineFakeGpu, AStreamOrderedWaitReturnsOnceTheOpIsQueued) {
  World w;
  const Device cuda{2, 0};
  std::vector<float> warm(2, 1.0f), g(8, 4.0f), seen(8, -1.0f);
  RequestPtr first = allreduce("warm", warm, cuda);
  w.engine->submit(first);
  ASSERT_TRUE(doneWithin(*first, std::chrono::seconds(10)));
  w.device.hold(true);
  RequestPtr a = allreduce("g", g, cuda, 0.25);
  w.engine->submit(a);
  gpu::StreamHandle caller = w.device.createStream();
  EXPECT_TRUE(a->waitOnStream(caller).ok());
  EXPECT_FALSE(a->done()) << "the device is held: launched, not finished";
  w.device.copy(seen.data(), g.data(), g.size() * sizeof(float), caller);
  w.device.hold(false);
  ASSERT_TRUE(doneWithin(*a, std::chrono::seconds(10)));
  w.device.drain();
  EXPECT_EQ(seen, std::vector<float>(8, 1.0f)) << "the caller's stream ran after the op";
  EXPECT_TRUE(a->waitOnStream(caller).ok()) << "a completed request: its status";
  w.device.destroyStream(caller);
}

}  // namespace
}  // namespace hora
