// SPDX-License-Identifier: Apache-2.0
// The GPU's turn among a process's sets (DeviceTurn), and two process sets' engines on two ranks
// (threads, each rank with its own fake GPU and turn) whose collectives reach the GPUs in
// whatever order the engines' threads run: on "exclusive" fake GPUs (one NCCL kernel at a time,
// held while it waits for its peers) opposite orders deadlock; with the turn every op completes.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backends/nccl/nccl_executor.h"
#include "backends/registry.h"
#include "core/device_turn.h"
#include "core/set_engine.h"
#include "core/wrapping_backend.h"
#include "fake_device.h"
#include "thread_group.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;

TEST(DeviceTurn, OneSetAtATimeHeldWhileInFlightLowestWaitingFirst) {
  DeviceTurn turn;
  EXPECT_TRUE(turn.offer(2));
  EXPECT_FALSE(turn.offer(1)) << "held by set 2 for its round";
  turn.settle(2, /*launchedThrough=*/1);
  EXPECT_EQ(turn.holder(), 2) << "held while its work is in flight";
  EXPECT_TRUE(turn.offer(2)) << "the holder goes on while nobody waits";
  turn.settle(2, 2);
  int woke = 0;
  turn.wait(1, [&] { ++woke; });
  EXPECT_FALSE(turn.offer(2)) << "the holder launches nothing more while set 1 waits";
  EXPECT_FALSE(turn.offer(1));
  turn.finished(2, 1);
  EXPECT_EQ(turn.holder(), 2) << "ticket 2 still runs";
  turn.finished(2, 2);  // a stream callback
  EXPECT_EQ(turn.holder(), -1);
  EXPECT_EQ(woke, 1) << "a waiting set is woken when the turn comes free";
  // A round that launches nothing gives the turn back at its end, and does not make its set the
  // last holder.
  EXPECT_TRUE(turn.offer(1));
  turn.settle(1, 0);
  EXPECT_EQ(turn.holder(), -1);
  turn.wait(3, nullptr);
  turn.wait(2, nullptr);
  EXPECT_FALSE(turn.offer(2)) << "set 2 held it last: 1 and 3 come first";
  EXPECT_FALSE(turn.offer(3)) << "then the lower id";
  EXPECT_TRUE(turn.offer(1));
  // Its work finishes before the round that launched it ends (a fast op): freed at the end.
  turn.finished(1, 5);
  EXPECT_EQ(turn.holder(), 1) << "pinned by its round";
  turn.settle(1, 5);
  EXPECT_EQ(turn.holder(), -1);
  turn.stopWaiting(1);
  EXPECT_FALSE(turn.offer(1)) << "set 1 held it last, 2 and 3 wait";
  EXPECT_TRUE(turn.offer(2));
  turn.leave(2);
  EXPECT_EQ(turn.holder(), -1) << "a set that stops gives it back";
}

// A set alone on its process's GPU holds the turn in any round it offers; a second user of the
// GPU, or a set waiting, ends that.
TEST(DeviceTurn, ASetAloneOffersInAnyRoundUntilAnotherUsesTheGpu) {
  DeviceTurn turn;
  EXPECT_FALSE(turn.offerAlone(1)) << "not a user of the GPU yet";
  turn.uses(1);
  EXPECT_TRUE(turn.offerAlone(1));
  turn.settle(1, /*launchedThrough=*/3);
  EXPECT_EQ(turn.holder(), 1) << "its work in flight";
  EXPECT_TRUE(turn.offerAlone(1)) << "its own turn";
  turn.settle(1, 3);
  turn.uses(2);
  EXPECT_FALSE(turn.offerAlone(1)) << "set 2 uses the GPU too";
  EXPECT_FALSE(turn.offerAlone(2));
  turn.finished(1, 3);
  EXPECT_EQ(turn.holder(), -1);
  turn.leave(2);
  turn.wait(3, nullptr);
  EXPECT_FALSE(turn.offerAlone(1)) << "a set waits for the turn";
  turn.stopWaiting(3);
  EXPECT_TRUE(turn.offerAlone(1));
  turn.settle(1, 0);
  EXPECT_EQ(turn.holder(), -1) << "a round that launched nothing gives it back";
}

// A group of ranks as threads: the set's control plane, nothing else.
class ThreadGroupOfSet final : public Group {
 public:
  ThreadGroupOfSet(test::ThreadGroup &group, int rank) : plane_(group, rank) {}
  ControlPlane &control() override { return plane_; }
  void poison(int, const std::string &) override {}
  bool usesSockets() const override { return false; }

 private:
  test::ThreadControlPlane plane_;
};

class FakeFabric final : public Fabric {
 public:
  FakeFabric(gpu::DeviceApi &api, double timeoutS) : api_(api), timeoutS_(timeoutS) {}
  std::unique_ptr<Bootstrap> formWorld() override { return nullptr; }
  std::unique_ptr<Backend> cpuBackend(Bootstrap &, Group &) override { return nullptr; }
  std::unique_ptr<DeviceExecutor> deviceExecutor(ControlPlane &control, int device, DeviceHooks hooks) override {
    return createNcclExecutor(api_, control, device, timeoutS_, std::move(hooks));
  }
  int defaultDevice(int localRank) override { return defaultCudaDevice(api_, localRank); }
  std::shared_ptr<void> keepDeviceContext() override { return api_.keepContext(); }

 private:
  gpu::DeviceApi &api_;
  double timeoutS_;
};

RequestPtr allreduce(const std::string &name, int32_t set, int device, std::vector<float> &data) {
  RequestMsg m;
  m.name = name;
  m.op = OpType::kAllreduce;
  m.dtype = DType::kFloat32;
  m.device = Device{2, device};
  m.shapes = {{static_cast<int64_t>(data.size())}};
  return std::make_shared<Request>(m, set,
                                   std::vector<TensorArg>{{data.data(), data.data(), static_cast<int64_t>(data.size())}});
}

// `kSets` process sets on two ranks (threads), each rank with its own "exclusive" fake GPU and
// turn; every round each rank submits to every set, the ranks in opposite orders. Checks every
// result and that the turn is given back; returns the device launches the sets deferred.
uint64_t runSetsOnExclusiveGpus(int kSets, int kRounds) {
  constexpr int kRanks = 2;
  test::FakeCluster cluster;
  std::vector<std::unique_ptr<test::FakeDevice>> gpus;
  std::vector<std::unique_ptr<DeviceTurn>> turns;  // one per rank: one per process
  std::vector<std::unique_ptr<FakeFabric>> fabrics;
  for (int r = 0; r < kRanks; ++r) {
    gpus.push_back(std::make_unique<test::FakeDevice>(cluster, r, /*deviceCount=*/kRanks));
    gpus.back()->exclusive(true);
    turns.push_back(std::make_unique<DeviceTurn>());
    fabrics.push_back(std::make_unique<FakeFabric>(*gpus.back(), 30));
  }
  std::vector<std::unique_ptr<test::ThreadGroup>> groups;
  for (int s = 0; s < kSets; ++s) groups.push_back(std::make_unique<test::ThreadGroup>(kRanks));
  Knobs knobs;
  knobs.timeoutS = 30;
  knobs.stallWarningS = 0;
  // engines[s][r]: set s + 1 on rank r, each with its own thread, as in a process.
  std::vector<std::vector<std::shared_ptr<SetEngine>>> engines(kSets);
  test::runRanks(kRanks * kSets, [&](int i) {
    const int s = i / kRanks, r = i % kRanks;
    auto setup = [&, s, r] {
      SetEngine::Parts parts;
      parts.group = std::make_unique<ThreadGroupOfSet>(*groups[s], r);
      parts.backend = createSelfBackend();
      parts.fabric = fabrics[r].get();
      parts.localRank = r;
      parts.turn = turns[r].get();
      return parts;
    };
    auto engine = SetEngine::start(s + 1, knobs, setup, nullptr);
    static std::mutex m;
    std::lock_guard<std::mutex> lock(m);
    engines[s].resize(kRanks);
    engines[s][r] = engine;
  });
  // Each round, every rank submits to both sets at once, rank 0 set 1 first, rank 1 set 2
  // first: the engines' threads then launch in whatever order they run.
  std::vector<std::vector<std::vector<float>>> data(kRounds * kSets, std::vector<std::vector<float>>(kRanks));
  std::vector<RequestPtr> requests;
  std::mutex requestsMutex;
  const auto start = Clock::now();
  test::runRanks(kRanks, [&](int r) {
    for (int round = 0; round < kRounds; ++round) {
      std::vector<RequestPtr> mine;
      for (int k = 0; k < kSets; ++k) {
        const int s = r == 0 ? k : kSets - 1 - k;
        std::vector<float> &d = data[round * kSets + s][r];
        d.assign(64, float(r + 1));
        RequestPtr req = allreduce("g" + std::to_string(round), s + 1, r, d);
        engines[s][r]->submit(req);
        mine.push_back(req);
      }
      for (const RequestPtr &req : mine) EXPECT_TRUE(req->wait().ok()) << req->status().message;
      std::lock_guard<std::mutex> lock(requestsMutex);
      requests.insert(requests.end(), mine.begin(), mine.end());
    }
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
  for (const auto &perRank : data) {
    for (const auto &d : perRank) EXPECT_EQ(d, std::vector<float>(64, 3.0f));  // 1 + 2
  }
  // The last callback gives the turn back (on a driver thread, as the caller wakes).
  for (int r = 0; r < kRanks; ++r) {
    const auto end = Clock::now() + std::chrono::seconds(5);
    while (turns[r]->holder() != -1 && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(turns[r]->holder(), -1) << "the turn is given back";
  }
  uint64_t deferred = 0;
  for (auto &set : engines) {
    for (auto &e : set) deferred += e->deviceLaunchesDeferred();
  }
  for (auto &set : engines) {
    for (auto &e : set) e->requestShutdown();
  }
  for (auto &set : engines) {
    for (auto &e : set) e->join();
  }
  engines.clear();
  return deferred;
}

TEST(DeviceTurn, TwoSetsOnExclusiveGpusNeverDeadlock) {
  EXPECT_GT(runSetsOnExclusiveGpus(2, 40), 0u) << "two sets on a GPU: launches wait for the turn";
}

// Alone on its GPU, a set launches device work in the round that agrees it.
TEST(DeviceTurn, ASetAloneLaunchesInTheRoundThatAgreesTheWork) {
  EXPECT_EQ(runSetsOnExclusiveGpus(1, 40), 0u);
}

// A bell for a set's engine (a waiting caller runs a set's cycles only where its engine has one):
// rung by the queue, slept on with a condition variable.
class CvBell final : public PeerBell {
 public:
  bool arm(uint32_t *ticket) override {
    std::lock_guard<std::mutex> lock(mutex_);
    *ticket = rings_;
    return true;
  }
  void sleep(uint32_t ticket, std::chrono::nanoseconds limit) override {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, limit, [&] { return rings_ != ticket; });
  }
  void ring() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++rings_;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  uint32_t rings_ = 0;
};

// The world-of-one backend with a bell (the sets here move no CPU data).
class BelledBackend final : public WrappingBackend {
 public:
  BelledBackend() : WrappingBackend(createSelfBackend()) {}
  PeerBell *peerBell() override { return &bell_; }

 private:
  CvBell bell_;
};

// A caller waiting on a CUDA op (SetEngine::drive) runs the set's cycle itself and launches the
// device work on its own thread, in the round that agrees it, with its CUDA context put back
// afterwards. The set's threads wait a long batch window, so the callers' cycles come first.
TEST(DeviceTurn, AWaitingCallerLaunchesDeviceWorkOnItsOwnThread) {
  constexpr int kRanks = 2, kOps = 8;
  test::FakeCluster cluster;
  std::vector<std::unique_ptr<test::FakeDevice>> gpus;
  std::vector<std::unique_ptr<DeviceTurn>> turns;
  std::vector<std::unique_ptr<FakeFabric>> fabrics;
  for (int r = 0; r < kRanks; ++r) {
    gpus.push_back(std::make_unique<test::FakeDevice>(cluster, r, kRanks));
    turns.push_back(std::make_unique<DeviceTurn>());
    fabrics.push_back(std::make_unique<FakeFabric>(*gpus.back(), 30));
  }
  test::ThreadGroup group(kRanks);
  Knobs knobs;
  knobs.timeoutS = 30;
  knobs.stallWarningS = 0;
  knobs.cycleTimeMs = 300;  // the set's thread waits this long for more work before its cycle
  std::vector<std::shared_ptr<SetEngine>> engines(kRanks);
  test::runRanks(kRanks, [&](int r) {
    engines[r] = SetEngine::start(1, knobs, [&, r] {
      SetEngine::Parts parts;
      parts.group = std::make_unique<ThreadGroupOfSet>(group, r);
      parts.backend = std::make_unique<BelledBackend>();
      parts.fabric = fabrics[r].get();
      parts.localRank = r;
      parts.turn = turns[r].get();
      return parts;
    }, nullptr);
  });
  std::vector<int> callerLaunches(kRanks, 0);
  test::runRanks(kRanks, [&](int r) {
    ASSERT_EQ(gpus[r]->currentDevice(), -1) << "this thread starts with no device";
    for (int k = 0; k < kOps; ++k) {
      std::vector<float> d(16, float(r + 1 + k));
      RequestPtr req = allreduce("c" + std::to_string(k), 1, r, d);
      engines[r]->submit(req);
      engines[r]->drive(*req);
      EXPECT_EQ(gpus[r]->currentDevice(), -1) << "op " << k << ": the caller's context is put back";
      ASSERT_TRUE(req->wait().ok()) << req->status().message;
      EXPECT_EQ(d, std::vector<float>(16, float(3 + 2 * k)));
    }
    for (const std::string &call : gpus[r]->callsFrom(std::this_thread::get_id())) {
      if (call.rfind("allReduce", 0) == 0) ++callerLaunches[r];
    }
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_GE(callerLaunches[r], 1) << "rank " << r << ": the waiting caller launched the work";
    EXPECT_EQ(engines[r]->deviceLaunchesDeferred(), 0u);
  }
  for (auto &e : engines) e->requestShutdown();
  for (auto &e : engines) e->join();
}

}  // namespace
}  // namespace hora
