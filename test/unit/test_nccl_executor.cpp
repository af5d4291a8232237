// SPDX-License-Identifier: Apache-2.0
// The NCCL backend's logic (nccl_executor.cpp) against the fake device: ranks are threads, device
// memory is host memory, NCCL is a rendezvous. Every result is checked against values computed
// here; each test also checks one decision of the backend: completion by ticket while the device
// works, the cancel flag before an abort, the setup agreement, the CTA cap, affinity, memory
// returned to the engine, lost peers.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "backends/nccl/nccl_executor.h"
#include "base/error.h"
#include "core/request.h"
#include "fake_device.h"
#include "thread_group.h"

namespace hora {
namespace {

using test::FakeCluster;
using test::FakeDevice;
using test::runRanks;
using test::ThreadControlPlane;
using test::ThreadGroup;
using Clock = std::chrono::steady_clock;

constexpr int kDevices = 4;  // each rank on device `rank`: the CTA cap counts per device

RequestMsg message(const std::string &name, OpType op, DType dtype, int device,
                   std::vector<Shape> shapes) {
  RequestMsg m;
  m.name = name;
  m.op = op;
  m.dtype = dtype;
  m.device = Device{2, device};
  m.shapes = std::move(shapes);
  return m;
}

Response responseFor(const RequestMsg &m) {
  Response r;
  r.agreed = m;
  return r;
}

// Polls until `ticket` is done, the way the engine does (a bound keeps a bug from hanging).
uint64_t waitFor(DeviceExecutor &ex, uint64_t ticket) {
  const auto end = Clock::now() + std::chrono::seconds(20);
  uint64_t done = ex.poll();
  while (done < ticket) {
    if (Clock::now() > end) ADD_FAILURE() << "ticket " << ticket << " not done after 20 s";
    if (Clock::now() > end) return done;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    done = ex.poll();
  }
  return done;
}

// Whether `pred` holds within 10 s (for what another thread does after a result is visible).
bool eventually(const std::function<bool()> &pred) {
  const auto end = Clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

struct Ranks {
  explicit Ranks(int n, double timeoutS = 20) : group(n), timeoutS(timeoutS) {
    for (int r = 0; r < n; ++r) devices.push_back(std::make_unique<FakeDevice>(cluster, r, kDevices));
    executors.resize(static_cast<size_t>(n));
    wakes = std::make_unique<std::atomic<int>[]>(static_cast<size_t>(n));
  }
  void start(const std::function<std::string(int)> &lostPeer = nullptr) {
    runRanks(group.size(), [&](int r) {
      ThreadControlPlane control(group, r);
      DeviceHooks hooks;
      hooks.wake = [this, r] { wakes[static_cast<size_t>(r)].fetch_add(1); };
      if (lostPeer) hooks.lostPeer = [lostPeer, r] { return lostPeer(r); };
      NcclOptions o = options;
      o.timeoutS = timeoutS;
      o.initTimeoutS = std::min(o.initTimeoutS, timeoutS);
      executors[static_cast<size_t>(r)] =
          createNcclExecutor(*devices[static_cast<size_t>(r)], control, r, o, std::move(hooks));
    });
  }
  NcclOptions options;  // but timeoutS from the constructor
  FakeDevice &dev(int r) { return *devices[static_cast<size_t>(r)]; }
  DeviceExecutor &ex(int r) { return *executors[static_cast<size_t>(r)]; }
  ~Ranks() {
    executors.clear();  // before the devices
  }

  FakeCluster cluster;
  ThreadGroup group;
  double timeoutS;
  std::vector<std::unique_ptr<FakeDevice>> devices;
  std::vector<std::unique_ptr<DeviceExecutor>> executors;
  std::unique_ptr<std::atomic<int>[]> wakes;
};

TEST(NcclExecutor, FusedAverageCompletesByTicketWhileTheDeviceWorks) {
  constexpr int n = 3;
  Ranks ranks(n);
  ranks.start();
  // Three tensors of odd sizes, fused; rank r holds (r + 1) * (i + 1) at element i.
  const std::vector<int64_t> sizes = {5, 1000, 33};
  std::vector<std::vector<std::vector<float>>> data(n);
  for (int r = 0; r < n; ++r) ranks.dev(r).hold(true);  // the GPU is "busy"
  runRanks(n, [&](int r) {
    std::vector<TensorArg> tensors;
    std::vector<Shape> shapes;
    for (int64_t size : sizes) {
      data[r].emplace_back(static_cast<size_t>(size));
      for (int64_t i = 0; i < size; ++i) data[r].back()[static_cast<size_t>(i)] = float((r + 1) * (i + 1));
      tensors.push_back(TensorArg{data[r].back().data(), data[r].back().data(), size});
      shapes.push_back({size});
    }
    RequestMsg m = message("grads", OpType::kAllreduce, DType::kFloat32, r, shapes);
    m.reduceOp = ReduceOp::kAverage;
    Request req(m, 0, tensors);
    ranks.ex(r).allreduce({&req}, responseFor(m), n);
    EXPECT_EQ(ranks.ex(r).queued(), 1u);
    // Queued, not done: the engine is free while the device holds it.
    EXPECT_EQ(ranks.ex(r).poll(), 0u);
  });
  for (int r = 0; r < n; ++r) ranks.dev(r).hold(false);
  for (int r = 0; r < n; ++r) EXPECT_EQ(waitFor(ranks.ex(r), 1), 1u);
  // average of (r + 1) * (i + 1) over r = 0..2: 2 * (i + 1)
  for (int r = 0; r < n; ++r) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      for (int64_t i = 0; i < sizes[t]; ++i) {
        ASSERT_FLOAT_EQ(data[r][t][static_cast<size_t>(i)], 2.0f * float(i + 1)) << "rank " << r << " tensor " << t;
      }
    }
    EXPECT_TRUE(eventually([&] { return ranks.wakes[r].load() >= 1; }))
        << "the completion thread wakes the engine (poll() may see the op done first)";
    EXPECT_EQ(ranks.dev(r).count("batchedCopy"), 2) << "one pack and one unpack launch";
  }
}

// Completion by event: no host function on the stream, events from a pool, the engine woken by
// the completion thread; a stream-ordered wait lets the caller's stream go on after the op while
// the host does not wait at all.
TEST(NcclExecutor, CompletionIsByPooledEventsAndAStreamMayWaitForTheOp) {
  constexpr int n = 2;
  Ranks ranks(n);
  ranks.start();
  std::vector<std::vector<float>> x(n, std::vector<float>(64)), seen(n, std::vector<float>(64, -1));
  for (int r = 0; r < n; ++r) ranks.dev(r).hold(true);
  std::vector<std::unique_ptr<Request>> req(n);
  std::vector<gpu::StreamHandle> callerStream(n);
  runRanks(n, [&](int r) {
    for (int i = 0; i < 64; ++i) x[r][i] = float(r * 100 + i);
    RequestMsg m = message("w", OpType::kAllreduce, DType::kFloat32, r, {{64}});
    req[r] = std::make_unique<Request>(m, 0, std::vector<TensorArg>{TensorArg{x[r].data(), x[r].data(), 64}});
    ranks.ex(r).allreduce({req[r].get()}, responseFor(m), n);
    req[r]->launched(ranks.ex(r).lastEnd());
    // The caller's stream waits for the op; the host returns at once, the device still held.
    callerStream[r] = ranks.dev(r).createStream();
    EXPECT_TRUE(req[r]->waitOnStream(callerStream[r]).ok());
    EXPECT_EQ(ranks.ex(r).poll(), 0u) << "launched, not finished";
    ranks.dev(r).copy(seen[r].data(), x[r].data(), 64 * sizeof(float), callerStream[r]);
  });
  for (int r = 0; r < n; ++r) ranks.dev(r).hold(false);
  for (int r = 0; r < n; ++r) {
    waitFor(ranks.ex(r), 1);
    req[r]->complete(Status::success());
    ranks.dev(r).drain();
    for (int i = 0; i < 64; ++i) ASSERT_EQ(seen[r][i], float(100 + 2 * i)) << "rank " << r << " element " << i;
    ranks.dev(r).destroyStream(callerStream[r]);
  }
  // Many ops, one after another: a handful of events, reused.
  runRanks(n, [&](int r) {
    for (int k = 0; k < 40; ++k) {
      RequestMsg m = message("k" + std::to_string(k), OpType::kAllreduce, DType::kFloat32, r, {{64}});
      Request q(m, 0, {TensorArg{x[r].data(), x[r].data(), 64}});
      const int wakes = ranks.wakes[r].load();
      ranks.ex(r).allreduce({&q}, responseFor(m), n);
      waitFor(ranks.ex(r), ranks.ex(r).queued());
      // and the completion thread has let its event go (it does before it wakes the engine):
      // otherwise, on a loaded machine, a lagging thread would hold events the next ops need
      EXPECT_TRUE(eventually([&] { return ranks.wakes[r].load() > wakes; })) << "op " << k;
    }
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ranks.dev(r).count("hostCallback"), 0) << "no host function on the stream";
    EXPECT_LE(ranks.dev(r).count("createEvent"), 4) << "41 ops, events from the pool";
    EXPECT_TRUE(eventually([&] { return ranks.wakes[r].load() >= 1; }))
        << "the completion thread wakes the engine (poll() may see the op done first)";
    EXPECT_GE(ranks.dev(r).count("commAsyncError"), 41) << "each launch at 2 ranks settles (ncclInProgress)";
  }
}

// Zero-copy fusion: in a fused allreduce the tensors of at least HORA_CUDA_DIRECT_BYTES are
// reduced where they lie, in one NCCL group with the packed small ones; only those are copied,
// through the registered fusion buffer.
TEST(NcclExecutor, FusedAllreduceCopiesOnlyTheSmallTensors) {
  constexpr int n = 2;
  Ranks ranks(n);
  ranks.options.directBytes = 256;  // 64 floats and more go as they are
  ranks.options.fusionBytes = 1 << 16;
  ranks.start();
  const std::vector<int64_t> sizes = {10, 100, 3, 64, 7};  // small, big, small, big, small
  std::vector<std::vector<std::vector<float>>> in(n), out(n);
  auto submit = [&](int r, const char *name, ReduceOp op, double prescale, double postscale, uint64_t ticket) {
    in[r].clear();
    out[r].clear();
    std::vector<TensorArg> tensors;
    std::vector<Shape> shapes;
    for (size_t t = 0; t < sizes.size(); ++t) {
      in[r].emplace_back(static_cast<size_t>(sizes[t]));
      out[r].emplace_back(static_cast<size_t>(sizes[t]), -1.0f);
      for (int64_t i = 0; i < sizes[t]; ++i) in[r][t][static_cast<size_t>(i)] = float((r + 1) * (i + 1) + t);
    }
    for (size_t t = 0; t < sizes.size(); ++t) {
      tensors.push_back(TensorArg{in[r][t].data(), out[r][t].data(), sizes[t]});
      shapes.push_back({sizes[t]});
    }
    RequestMsg m = message(name, OpType::kAllreduce, DType::kFloat32, r, shapes);
    m.reduceOp = op;
    m.prescale = prescale;
    m.postscale = postscale;
    Request req(m, 0, tensors);
    ranks.ex(r).allreduce({&req}, responseFor(m), n);
    waitFor(ranks.ex(r), ticket);
  };
  // Average, out of place: every output the mean (postscaled), every input as it was.
  runRanks(n, [&](int r) { submit(r, "mixed", ReduceOp::kAverage, 1.0, 3.0, 1); });
  for (int r = 0; r < n; ++r) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      for (int64_t i = 0; i < sizes[t]; ++i) {
        // the mean over r of (r + 1)(i + 1) + t is 1.5 (i + 1) + t
        ASSERT_FLOAT_EQ(out[r][t][static_cast<size_t>(i)], 3.0f * (1.5f * float(i + 1) + float(t)))
            << "rank " << r << " tensor " << t << " element " << i;
        ASSERT_FLOAT_EQ(in[r][t][static_cast<size_t>(i)], float((r + 1) * (i + 1) + t)) << "input kept";
      }
    }
    FakeDevice &d = ranks.dev(r);
    EXPECT_EQ(d.count("batchedCopy items=3"), 2) << "the three small tensors packed and unpacked, no more";
    EXPECT_EQ(d.count("allReduce"), 3) << "the packed buffer and the two big tensors";
    EXPECT_EQ(d.count("groupEnd"), 1) << "one launch";
    EXPECT_EQ(d.count("memAlloc 65536"), 1) << "the fusion buffer: HORA_FUSION_THRESHOLD bytes of NCCL memory";
    EXPECT_EQ(d.count("commRegister 65536"), 1) << "registered with the communicator";
  }
  // A kernel prescale (MIN has no PreMulSum) packs every tensor: the inputs stay untouched.
  for (int r = 0; r < n; ++r) ranks.dev(r).clearCalls();
  runRanks(n, [&](int r) { submit(r, "min", ReduceOp::kMin, 2.0, 1.0, 2); });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ranks.dev(r).count("allReduce"), 1) << "everything packed";
    for (size_t t = 0; t < sizes.size(); ++t) {
      for (int64_t i = 0; i < sizes[t]; ++i) {
        ASSERT_FLOAT_EQ(out[r][t][static_cast<size_t>(i)], 2.0f * float((i + 1) + t)) << "rank 0's, doubled";
        ASSERT_FLOAT_EQ(in[r][t][static_cast<size_t>(i)], float((r + 1) * (i + 1) + t));
      }
    }
  }
  ranks.executors.clear();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ranks.dev(r).liveRegistrations(), 0) << "deregistered before the communicator went";
    EXPECT_EQ(ranks.dev(r).liveNcclMemory(), 0) << "and freed after";
  }
}

// Without NCCL's memory (ncclMemAlloc fails) or its registration, fusion goes on: stream-ordered
// memory, or an unregistered buffer.
TEST(NcclExecutor, FusionWithoutNcclMemoryOrRegistration) {
  for (const std::string failing : {"memAlloc", "commRegister"}) {
    constexpr int n = 2;
    Ranks ranks(n);
    ranks.start();
    for (int r = 0; r < n; ++r) ranks.dev(r).failNext(failing, 5);
    std::vector<std::vector<int32_t>> a(n, std::vector<int32_t>(9)), b(n, std::vector<int32_t>(4));
    runRanks(n, [&](int r) {
      for (int i = 0; i < 9; ++i) a[r][i] = r * 10 + i;
      for (int i = 0; i < 4; ++i) b[r][i] = -r - i;
      RequestMsg m = message("ab", OpType::kAllreduce, DType::kInt32, r, {{9}, {4}});
      Request req(m, 0, {TensorArg{a[r].data(), a[r].data(), 9}, TensorArg{b[r].data(), b[r].data(), 4}});
      ranks.ex(r).allreduce({&req}, responseFor(m), n);
      waitFor(ranks.ex(r), 1);
    });
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < 9; ++i) EXPECT_EQ(a[r][i], 10 + 2 * i) << failing;
      for (int i = 0; i < 4; ++i) EXPECT_EQ(b[r][i], -1 - 2 * i) << failing;
      EXPECT_EQ(ranks.dev(r).count("commRegister"), failing == "memAlloc" ? 0 : 1) << failing;
    }
    ranks.executors.clear();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ranks.dev(r).liveRegistrations(), 0) << failing;
      EXPECT_EQ(ranks.dev(r).liveNcclMemory(), 0) << failing;
      EXPECT_EQ(ranks.dev(r).liveAllocations(), 0) << failing;
    }
  }
}

TEST(NcclExecutor, ScaledMinAndPremultipliedSum) {
  constexpr int n = 2;
  Ranks ranks(n);
  ranks.start();
  std::vector<std::vector<double>> a(n, std::vector<double>(7)), b(n, std::vector<double>(7));
  runRanks(n, [&](int r) {
    for (int i = 0; i < 7; ++i) {
      a[r][i] = (r == 0 ? 1.0 : -2.0) * (i + 1);
      b[r][i] = r + i;
    }
    RequestMsg m = message("min", OpType::kAllreduce, DType::kFloat64, r, {{7}});
    m.reduceOp = ReduceOp::kMin;
    m.prescale = 3.0;
    m.postscale = 0.5;
    Request req(m, 0, {TensorArg{a[r].data(), a[r].data(), 7}});
    ranks.ex(r).allreduce({&req}, responseFor(m), n);
    RequestMsg s = message("sum", OpType::kAllreduce, DType::kFloat64, r, {{7}});
    s.prescale = 2.0;
    Request sreq(s, 0, {TensorArg{b[r].data(), b[r].data(), 7}});
    ranks.ex(r).allreduce({&sreq}, responseFor(s), n);
    waitFor(ranks.ex(r), 2);
  });
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < 7; ++i) {
      EXPECT_DOUBLE_EQ(a[r][i], std::min(3.0 * (i + 1), 3.0 * -2.0 * (i + 1)) * 0.5);
      EXPECT_DOUBLE_EQ(b[r][i], 2.0 * (0 + i) + 2.0 * (1 + i));
    }
    EXPECT_EQ(ranks.dev(r).count("createPreMulSum"), 1) << "the sum's prescale rides on NCCL";
  }
}

TEST(NcclExecutor, FusedAllgatherIsOneGroupAndOutputsGoBackToTheEngine) {
  constexpr int n = 2;
  Ranks ranks(n);
  ranks.start();
  // Two allgathers in one fused group: uniform rows (ncclAllGather) and uneven (broadcasts).
  std::vector<std::vector<int32_t>> x(n), y(n);
  std::vector<std::vector<int32_t>> gotX(n), gotY(n);
  runRanks(n, [&](int r) {
    x[r] = {10 * r + 1, 10 * r + 2};                     // 2 rows of 1
    y[r].assign(static_cast<size_t>(r + 1), 100 + r);    // r + 1 rows
    RequestMsg mx = message("x", OpType::kAllgather, DType::kInt32, r, {{2}});
    RequestMsg my = message("y", OpType::kAllgather, DType::kInt32, r, {{r + 1}});
    Response rx = responseFor(mx), ry = responseFor(my);
    rx.firstDims = {2, 2};
    ry.firstDims = {1, 2};
    auto qx = std::make_shared<Request>(mx, 0, std::vector<TensorArg>{{x[r].data(), nullptr, 2}});
    auto qy = std::make_shared<Request>(my, 0, std::vector<TensorArg>{{y[r].data(), nullptr, r + 1}});
    const int groupsBefore = ranks.dev(r).count("groupStart");
    ranks.ex(r).allgather({qx.get(), qy.get()}, {&rx, &ry});
    EXPECT_EQ(ranks.dev(r).count("groupStart") - groupsBefore, 1) << "one NCCL group for the fused pair";
    waitFor(ranks.ex(r), 1);
    const auto *ox = static_cast<const int32_t *>(qx->output()->data);
    const auto *oy = static_cast<const int32_t *>(qy->output()->data);
    gotX[r].assign(ox, ox + 4);
    gotY[r].assign(oy, oy + 3);
    // Dropped on this thread: no CUDA call here; the engine frees it at its next op.
    const int releasesBefore = ranks.dev(r).releases();
    qx.reset();
    qy.reset();
    EXPECT_TRUE(ranks.dev(r).callsFrom(std::this_thread::get_id()).empty() ||
                ranks.dev(r).releases() == releasesBefore);
    EXPECT_EQ(ranks.dev(r).releases(), releasesBefore) << "no free on the dropping thread";
    // The next op reclaims them, after the legacy stream's work.
    std::vector<float> z(4, 1.0f);
    RequestMsg mz = message("z", OpType::kAllreduce, DType::kFloat32, r, {{4}});
    Request qz(mz, 0, {TensorArg{z.data(), z.data(), 4}});
    ranks.ex(r).allreduce({&qz}, responseFor(mz), n);
    EXPECT_GE(ranks.dev(r).releases(), releasesBefore + 2);
    waitFor(ranks.ex(r), 2);
    EXPECT_EQ(z, std::vector<float>(4, 2.0f));
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(gotX[r], (std::vector<int32_t>{1, 2, 11, 12}));
    EXPECT_EQ(gotY[r], (std::vector<int32_t>{100, 101, 101}));
  }
}

// bool on the GPU: ncclUint8 with max for SUM (OR) and min for PRODUCT (AND), fused tensors
// included; int16 allgather moves bytes (NCCL has no 16-bit integer type).
TEST(NcclExecutor, BoolReducesAsOrAndAndInt16GathersAsBytes) {
  constexpr int n = 3;
  Ranks ranks(n);
  ranks.start();
  // Element i of rank r is true when bit r of i % 8 is set: OR over 3 ranks is i % 8 != 0, AND
  // is i % 8 == 7.
  const std::vector<int64_t> sizes = {5, 300};
  std::vector<std::vector<std::vector<uint8_t>>> any(n), all(n);
  std::vector<std::vector<int16_t>> gathered(n);
  runRanks(n, [&](int r) {
    std::vector<TensorArg> tensors;
    std::vector<Shape> shapes;
    for (int64_t size : sizes) {
      any[r].emplace_back(static_cast<size_t>(size));
      for (int64_t i = 0; i < size; ++i) any[r].back()[static_cast<size_t>(i)] = ((i % 8) >> r) & 1;
      tensors.push_back(TensorArg{any[r].back().data(), any[r].back().data(), size});
      shapes.push_back({size});
    }
    all[r] = any[r];
    RequestMsg m = message("any", OpType::kAllreduce, DType::kBool, r, shapes);
    m.reduceOp = ReduceOp::kSum;
    Request req(m, 0, tensors);
    ranks.ex(r).allreduce({&req}, responseFor(m), n);
    std::vector<TensorArg> allTensors;
    for (size_t t = 0; t < sizes.size(); ++t)
      allTensors.push_back(TensorArg{all[r][t].data(), all[r][t].data(), sizes[t]});
    RequestMsg ma = message("all", OpType::kAllreduce, DType::kBool, r, shapes);
    ma.reduceOp = ReduceOp::kProduct;
    Request reqAll(ma, 0, allTensors);
    ranks.ex(r).allreduce({&reqAll}, responseFor(ma), n);
    // int16 values past int8's range, rows of 2.
    std::vector<int16_t> rows = {static_cast<int16_t>(1000 * (r + 1)), static_cast<int16_t>(-300 - r)};
    RequestMsg mg = message("g", OpType::kAllgather, DType::kInt16, r, {{1, 2}});
    Response rg = responseFor(mg);
    rg.firstDims = {1, 1, 1};
    Request qg(mg, 0, {TensorArg{rows.data(), nullptr, 2}});
    ranks.ex(r).allgather({&qg}, {&rg});
    waitFor(ranks.ex(r), 3);
    const auto *o = static_cast<const int16_t *>(qg.output()->data);
    gathered[r].assign(o, o + 2 * n);
  });
  for (int r = 0; r < n; ++r) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      for (int64_t i = 0; i < sizes[t]; ++i) {
        ASSERT_EQ(any[r][t][static_cast<size_t>(i)], i % 8 != 0 ? 1 : 0) << r << " " << t << " " << i;
        ASSERT_EQ(all[r][t][static_cast<size_t>(i)], i % 8 == 7 ? 1 : 0) << r << " " << t << " " << i;
      }
    }
    EXPECT_EQ(ranks.dev(r).count("allReduce count=556 op=2 dtype=bool"), 1) << "SUM as max, fused";
    EXPECT_EQ(ranks.dev(r).count("allReduce count=556 op=3 dtype=bool"), 1) << "PRODUCT as min";
    EXPECT_EQ(ranks.dev(r).count("allGather bytes=4"), 1) << "int16 rows as bytes";
    EXPECT_EQ(gathered[r], (std::vector<int16_t>{1000, -300, 2000, -301, 3000, -302}));
  }
}

TEST(NcclExecutor, FusedReducescatterKeepsItsPrescaledInput) {
  constexpr int n = 2;
  Ranks ranks(n);
  ranks.start();
  std::vector<std::vector<float>> in(n), in2(n);
  std::vector<std::vector<float>> out(n), out2(n);
  runRanks(n, [&](int r) {
    in[r] = {1.0f + r, 2.0f + r, 3.0f + r};  // 3 rows: rank 0 gets 2, rank 1 gets 1
    in2[r] = {10.0f * (r + 1), 20.0f * (r + 1)};
    RequestMsg m = message("a", OpType::kReducescatter, DType::kFloat32, r, {{3}});
    RequestMsg m2 = message("b", OpType::kReducescatter, DType::kFloat32, r, {{2}});
    m.prescale = m2.prescale = 0.5;
    Response ra = responseFor(m), rb = responseFor(m2);
    Request qa(m, 0, {TensorArg{in[r].data(), nullptr, 3}});
    Request qb(m2, 0, {TensorArg{in2[r].data(), nullptr, 2}});
    ranks.ex(r).reducescatter({&qa, &qb}, {&ra, &rb}, n);
    waitFor(ranks.ex(r), 1);
    const auto *oa = static_cast<const float *>(qa.output()->data);
    const auto *ob = static_cast<const float *>(qb.output()->data);
    out[r].assign(oa, oa + (r == 0 ? 2 : 1));
    out2[r].assign(ob, ob + 1);
  });
  // 0.5 * (rank 0's + rank 1's) row by row
  EXPECT_EQ(out[0], (std::vector<float>{0.5f * (1 + 2), 0.5f * (2 + 3)}));
  EXPECT_EQ(out[1], (std::vector<float>{0.5f * (3 + 4)}));
  EXPECT_EQ(out2[0], (std::vector<float>{0.5f * (10 + 20)}));
  EXPECT_EQ(out2[1], (std::vector<float>{0.5f * (20 + 40)}));
  EXPECT_EQ(in[0], (std::vector<float>{1, 2, 3})) << "the caller's input is not scaled in place";
}

// One cycle's device ops (between beginCycle and endCycle) are one NCCL group, one launch: two
// fused allreduces (each packed into its own part of the fusion buffer), a premultiplied
// reducescatter and a broadcast. Nothing reaches NCCL until endCycle;
// each op keeps its own ticket, and every result is right.
TEST(NcclExecutor, OneCycleIsOneNcclGroup) {
  constexpr int n = 2;
  Ranks ranks(n);
  ranks.options.directBytes = 256;   // 64 floats and more go as they are
  ranks.options.fusionBytes = 2048;  // both packs fit (540 and 336 bytes with their tensors aligned)
  ranks.start();
  std::vector<std::vector<std::vector<float>>> f(n);   // 10, 3, 7 (packed) and 64 (direct) floats
  std::vector<std::vector<std::vector<int32_t>>> k(n);  // 30 and 20 ints, packed
  std::vector<std::vector<float>> rsIn(n), rsOut(n), bc(n);
  runRanks(n, [&](int r) {
    DeviceExecutor &ex = ranks.ex(r);
    FakeDevice &d = ranks.dev(r);
    d.clearCalls();
    std::vector<TensorArg> ft, kt;
    std::vector<Shape> fs, ks;
    for (int64_t size : {10, 3, 7, 64}) {
      f[r].emplace_back(static_cast<size_t>(size));
      for (int64_t i = 0; i < size; ++i) f[r].back()[static_cast<size_t>(i)] = float((r + 1) * (i + size));
      ft.push_back(TensorArg{f[r].back().data(), f[r].back().data(), size});
      fs.push_back({size});
    }
    for (int64_t size : {30, 20}) {
      k[r].emplace_back(static_cast<size_t>(size));
      for (int64_t i = 0; i < size; ++i) k[r].back()[static_cast<size_t>(i)] = int32_t(r * 1000 + i * size);
      kt.push_back(TensorArg{k[r].back().data(), k[r].back().data(), size});
      ks.push_back({size});
    }
    rsIn[r] = {1.0f + r, 2.0f + r, 3.0f + r, 4.0f + r};  // 4 rows: 2 per rank
    bc[r] = {r == 1 ? 7.0f : 0.0f, r == 1 ? 8.0f : 0.0f};
    RequestMsg mf = message("floats", OpType::kAllreduce, DType::kFloat32, r, fs);
    RequestMsg mk = message("ints", OpType::kAllreduce, DType::kInt32, r, ks);
    RequestMsg ms = message("scatter", OpType::kReducescatter, DType::kFloat32, r, {{4}});
    ms.prescale = 0.25;  // a PreMulSum, destroyed only after the group
    RequestMsg mb = message("bcast", OpType::kBroadcast, DType::kFloat32, r, {{2}});
    mb.root = 1;
    Response rs = responseFor(ms), rb = responseFor(mb);
    Request qf(mf, 0, ft), qk(mk, 0, kt);
    Request qs(ms, 0, {TensorArg{rsIn[r].data(), nullptr, 4}});
    Request qb(mb, 0, {TensorArg{bc[r].data(), bc[r].data(), 2}});
    ex.beginCycle();
    ex.allreduce({&qf}, responseFor(mf), n);
    EXPECT_EQ(ex.queued(), 1u);
    ex.allreduce({&qk}, responseFor(mk), n);
    EXPECT_EQ(ex.queued(), 2u);
    ex.reducescatter({&qs}, {&rs}, n);
    ex.broadcast(qb, rb);
    EXPECT_EQ(ex.queued(), 4u) << "a ticket each, known before the launch";
    EXPECT_EQ(d.count("groupStart"), 0) << "nothing reaches NCCL before endCycle";
    EXPECT_EQ(d.count("allReduce") + d.count("reduceScatter") + d.count("broadcast"), 0);
    EXPECT_EQ(d.count("batchedCopy"), 2) << "but both packs are queued";
    ex.endCycle();
    EXPECT_EQ(d.count("groupStart"), 1) << "one group for the cycle";
    EXPECT_EQ(d.count("groupEnd"), 1);
    EXPECT_EQ(d.count("allReduce"), 3) << "two packed buffers and the 64-float tensor";
    EXPECT_EQ(d.count("reduceScatter"), 1);
    EXPECT_EQ(d.count("broadcast"), 1);
    EXPECT_EQ(d.count("createPreMulSum"), 1);
    EXPECT_EQ(d.count("memAlloc 2048"), 1) << "the fusion buffer, once";
    EXPECT_EQ(d.count("allocate"), 1) << "and no scratch for the packs: only the reducescatter's output";
    EXPECT_EQ(waitFor(ex, 4), 4u);
    const auto *o = static_cast<const float *>(qs.output()->data);
    rsOut[r].assign(o, o + 2);
  });
  for (int r = 0; r < n; ++r) {
    for (size_t t = 0; t < 4; ++t) {
      const int64_t size = int64_t{t == 0 ? 10 : t == 1 ? 3 : t == 2 ? 7 : 64};
      for (int64_t i = 0; i < size; ++i) {
        ASSERT_FLOAT_EQ(f[r][t][static_cast<size_t>(i)], float(3 * (i + size))) << "floats " << t << "[" << i << "]";
      }
    }
    for (size_t t = 0; t < 2; ++t) {
      const int64_t size = t == 0 ? 30 : 20;
      for (int64_t i = 0; i < size; ++i) {
        ASSERT_EQ(k[r][t][static_cast<size_t>(i)], int32_t(1000 + 2 * i * size)) << "ints " << t << "[" << i << "]";
      }
    }
    EXPECT_EQ(bc[r], (std::vector<float>{7.0f, 8.0f})) << "rank 1's";
  }
  // 0.25 * (rank 0's + rank 1's) row by row: rows 0, 1 to rank 0, rows 2, 3 to rank 1
  EXPECT_EQ(rsOut[0], (std::vector<float>{0.25f * (1 + 2), 0.25f * (2 + 3)}));
  EXPECT_EQ(rsOut[1], (std::vector<float>{0.25f * (3 + 4), 0.25f * (4 + 5)}));
}

// A process set's communicator is split from the world's (ncclCommSplit, every world rank taking
// part, non-members without a color) and taken by the set's executor: no unique id, no init. Where
// one member has none, every member drops its split and makes a new communicator instead.
TEST(NcclExecutor, ProcessSetCommunicatorIsSplitFromTheWorlds) {
  constexpr int n = 3;
  const std::vector<int> members = {2, 0};  // set rank 0 is world rank 2, set rank 1 world rank 0
  for (const bool everyMemberHasOne : {true, false}) {
    Ranks world(n);
    world.start();
    std::vector<std::shared_ptr<DeviceSeed>> seeds(n);
    runRanks(n, [&](int r) {
      world.dev(r).clearCalls();
      const auto it = std::find(members.begin(), members.end(), r);
      const bool member = it != members.end();
      seeds[static_cast<size_t>(r)] = world.ex(r).split(member, member ? static_cast<int>(it - members.begin()) : 0);
      EXPECT_EQ(seeds[static_cast<size_t>(r)] != nullptr, member) << "rank " << r;
      EXPECT_EQ(world.dev(r).count("commSplit"), 1) << "every world rank takes part";
      EXPECT_EQ(world.dev(r).count(member ? "commSplit color=0" : "commSplit color=-1"), 1);
    });
    if (!everyMemberHasOne) seeds[0].reset();  // world rank 0 (set rank 1) has none
    ThreadGroup setGroup(2);
    std::vector<std::unique_ptr<DeviceExecutor>> set(2);
    std::vector<std::vector<float>> data(2);
    runRanks(2, [&](int s) {
      const int r = members[static_cast<size_t>(s)];
      ThreadControlPlane control(setGroup, s);
      DeviceHooks hooks;
      hooks.seed = seeds[static_cast<size_t>(r)];
      seeds[static_cast<size_t>(r)].reset();
      const int initsBefore = world.dev(r).count("commInit");
      set[static_cast<size_t>(s)] = createNcclExecutor(world.dev(r), control, r, 20.0, std::move(hooks));
      EXPECT_EQ(world.dev(r).count("commInit") - initsBefore, everyMemberHasOne ? 0 : 1)
          << "world rank " << r << ": the split taken, or a communicator of the set's own";
      data[static_cast<size_t>(s)] = {1.0f + r, 10.0f * (r + 1)};
      RequestMsg m = message("set", OpType::kAllreduce, DType::kFloat32, r, {{2}});
      Request q(m, 0, {TensorArg{data[static_cast<size_t>(s)].data(), data[static_cast<size_t>(s)].data(), 2}});
      set[static_cast<size_t>(s)]->allreduce({&q}, responseFor(m), 2);
      waitFor(*set[static_cast<size_t>(s)], 1);
    });
    for (int s = 0; s < 2; ++s) {  // world ranks 2 and 0: (1 + 2) + (1 + 0), 10 * 3 + 10 * 1
      EXPECT_EQ(data[static_cast<size_t>(s)], (std::vector<float>{4.0f, 40.0f})) << everyMemberHasOne;
    }
    // The world's communicator is as it was.
    std::vector<std::vector<int32_t>> w(n);
    runRanks(n, [&](int r) {
      w[static_cast<size_t>(r)] = {r};
      RequestMsg m = message("world", OpType::kAllreduce, DType::kInt32, r, {{1}});
      Request q(m, 0, {TensorArg{w[static_cast<size_t>(r)].data(), w[static_cast<size_t>(r)].data(), 1}});
      world.ex(r).allreduce({&q}, responseFor(m), n);
      waitFor(world.ex(r), 1);
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(w[static_cast<size_t>(r)], std::vector<int32_t>{0 + 1 + 2});
    runRanks(2, [&](int s) { set[static_cast<size_t>(s)].reset(); });  // finalized together
  }
}

TEST(NcclExecutor, JoinedRankTakesPartWithZeros) {
  constexpr int n = 2;
  Ranks ranks(n);
  ranks.start();
  std::vector<float> mine = {1, 2, 3};
  runRanks(n, [&](int r) {
    RequestMsg m = message("g", OpType::kAllreduce, DType::kFloat32, r, {{3}});
    m.reduceOp = ReduceOp::kAverage;
    Response resp = responseFor(m);
    resp.joined = {1};
    if (r == 0) {
      Request q(m, 0, {TensorArg{mine.data(), mine.data(), 3}});
      ranks.ex(r).allreduce({&q}, resp, 1);
      waitFor(ranks.ex(r), 1);
    } else {
      std::shared_ptr<Request> standIn = Request::standIn(resp, 0);
      ranks.ex(r).allreduce({standIn.get()}, resp, 1);
      waitFor(ranks.ex(r), 1);
    }
  });
  EXPECT_EQ(mine, (std::vector<float>{1, 2, 3})) << "average over the one contributor";
}

TEST(NcclExecutor, TimeoutCancelsTheQueuedUnpackBeforeTheAbort) {
  constexpr int n = 2;
  Ranks ranks(n, /*timeoutS=*/0.3);
  ranks.start();
  // Rank 1 never submits: rank 0's fused allreduce waits on the device until its deadline.
  std::vector<float> a(8, 1.0f), b(3, 2.0f), outA(8, -7.0f), outB(3, -7.0f);
  RequestMsg m = message("late", OpType::kAllreduce, DType::kFloat32, 0, {{8}, {3}});
  Request q(m, 0, {TensorArg{a.data(), outA.data(), 8}, TensorArg{b.data(), outB.data(), 3}});
  ranks.ex(0).allreduce({&q}, responseFor(m), n);
  const auto start = Clock::now();
  try {
    waitFor(ranks.ex(0), 1);
    FAIL() << "an allreduce without its peer completed";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_TIMEOUT) << e.message();
    EXPECT_NE(e.message().find("allreduce 'late'"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("HORA_TIMEOUT_S"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("rank 0 of 2"), std::string::npos) << e.message();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  ranks.dev(0).drain();
  EXPECT_EQ(outA, std::vector<float>(8, -7.0f)) << "the unpack after the aborted kernel wrote nothing";
  EXPECT_EQ(outB, std::vector<float>(3, -7.0f));
  EXPECT_GE(ranks.dev(0).count("stream: batchedCopy cancelled"), 1);
  EXPECT_EQ(ranks.dev(0).count("commAbort"), 1);
  // Every later call fails at once, saying why.
  try {
    ranks.ex(0).poll();
    FAIL();
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_BACKEND);
    EXPECT_NE(e.message().find("aborted after an earlier failure"), std::string::npos) << e.message();
  }
}

TEST(NcclExecutor, AsyncNcclErrorFailsTheOpInFlight) {
  constexpr int n = 2;
  Ranks ranks(n);
  ranks.start();
  std::vector<float> a(4, 1.0f);
  RequestMsg m = message("x", OpType::kAllreduce, DType::kFloat32, 0, {{4}});
  Request q(m, 0, {TensorArg{a.data(), a.data(), 4}});
  ranks.ex(0).allreduce({&q}, responseFor(m), n);
  ranks.dev(0).failAsync(6);  // ncclRemoteError, as a network failure reports itself
  try {
    waitFor(ranks.ex(0), 1);
    FAIL();
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_BACKEND);
    EXPECT_NE(e.message().find("ncclRemoteError"), std::string::npos) << e.message();
  }
}

TEST(NcclExecutor, LostPeerFailsTheOpWithoutWaitingForTheTimeout) {
  constexpr int n = 2;
  Ranks ranks(n, /*timeoutS=*/60);
  std::atomic<bool> gone{false};
  ranks.start([&](int r) { return r == 0 && gone ? std::string("rank 1 (pid 4242 on this host) exited") : ""; });
  std::vector<float> a(4, 1.0f);
  RequestMsg m = message("x", OpType::kAllreduce, DType::kFloat32, 0, {{4}});
  Request q(m, 0, {TensorArg{a.data(), a.data(), 4}});
  ranks.ex(0).allreduce({&q}, responseFor(m), n);
  EXPECT_EQ(ranks.ex(0).poll(), 0u);
  gone = true;
  const auto start = Clock::now();
  try {
    waitFor(ranks.ex(0), 1);
    FAIL();
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_PEER_LOST);
    EXPECT_NE(e.message().find("rank 1 (pid 4242"), std::string::npos) << e.message();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

TEST(NcclExecutor, SetupFailureOnOneRankFailsEveryRankNamingIt) {
  constexpr int n = 3;
  Ranks ranks(n);
  ranks.dev(1).setKernelsReason("cuda:1 is sm_70 (Tesla V100); this build has code for sm_75 and later");
  std::vector<std::string> messages(n);
  const auto start = Clock::now();
  runRanks(n, [&](int r) {
    ThreadControlPlane control(ranks.group, r);
    try {
      createNcclExecutor(ranks.dev(r), control, r, 20, DeviceHooks{});
    } catch (const Error &e) {
      EXPECT_EQ(e.status(), HORA_ERR_BACKEND);
      messages[r] = e.message();
    }
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5)) << "nobody waits for the timeout";
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(messages[r].find("CUDA setup failed on rank 1 of 3"), std::string::npos) << messages[r];
    EXPECT_EQ(ranks.dev(r).count("commInit"), 0) << "no rank went on to NCCL";
  }
  EXPECT_NE(messages[1].find("sm_70"), std::string::npos) << messages[1];
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ranks.dev(r).liveStreams(), 0) << "what setup made is freed";
    EXPECT_EQ(ranks.dev(r).liveCancelFlags(), 0);
  }
}

TEST(NcclExecutor, SecondCommunicatorOnAGpuIsCappedAndNcclThreadsGetTheProcessAffinity) {
  FakeCluster cluster;
  FakeDevice dev(cluster, 0, kDevices, /*multiprocessors=*/132);
  ThreadGroup a(1), b(1);
  std::unique_ptr<DeviceExecutor> first, second;
  std::thread t([&] {
    // An engine thread bound to one CPU (HORA_THREAD_AFFINITY), as the set's engine would be.
    cpu_set_t process, one;
    CPU_ZERO(&process);
    ASSERT_EQ(sched_getaffinity(getpid(), sizeof process, &process), 0);
    int cpu = -1;
    for (int c = 0; c < CPU_SETSIZE && cpu < 0; ++c) {
      if (CPU_ISSET(c, &process)) cpu = c;
    }
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    ThreadControlPlane ca(a, 0), cb(b, 0);
    first = createNcclExecutor(dev, ca, 2, 20, DeviceHooks{});
    second = createNcclExecutor(dev, cb, 2, 20, DeviceHooks{});
    const std::vector<FakeDevice::InitRecord> inits = dev.inits();
    ASSERT_EQ(inits.size(), 2u);
    EXPECT_EQ(inits[0].maxCTAs, 0) << "the first communicator: NCCL's own choice";
    EXPECT_EQ(inits[1].maxCTAs, 132 / 8) << "a later one on the same GPU is capped";
    if (CPU_COUNT(&process) > 1) {
      EXPECT_EQ(static_cast<int>(inits[0].cpus.size()), CPU_COUNT(&process))
          << "NCCL's threads are made with the process's CPUs, not the engine's one";
    }
    cpu_set_t after;
    sched_getaffinity(0, sizeof after, &after);
    EXPECT_TRUE(CPU_EQUAL(&after, &one)) << "the engine's own binding is restored";
    second.reset();
    first.reset();
  });
  t.join();
}

// NCCL needs every rank of a communicator to run the same channels: a cap one rank needs (its GPU
// holds another of its communicators) is every rank's, at the smallest GPU's share.
TEST(NcclExecutor, TheCtaCapIsAgreedByEveryRank) {
  FakeCluster cluster;
  FakeDevice dev0(cluster, 0, kDevices, /*multiprocessors=*/132), dev1(cluster, 1, kDevices, 108);
  dev0.launchInProgress(false);
  ThreadGroup solo(1), pair(2);  // rank r on its device r (the process counts per device)
  std::unique_ptr<DeviceExecutor> earlier;
  {
    ThreadControlPlane control(solo, 0);
    earlier = createNcclExecutor(dev0, control, 0, 20, DeviceHooks{});  // rank 0's GPU is shared now
  }
  std::vector<std::unique_ptr<DeviceExecutor>> ex(2);
  runRanks(2, [&](int r) {
    ThreadControlPlane control(pair, r);
    ex[static_cast<size_t>(r)] = createNcclExecutor(r == 0 ? dev0 : dev1, control, r, 20, DeviceHooks{});
  });
  EXPECT_EQ(dev0.lastInitMaxCTAs(), 108 / 8) << "rank 0, whose GPU is shared, at the smaller GPU's share";
  EXPECT_EQ(dev1.lastInitMaxCTAs(), 108 / 8) << "rank 1, whose GPU is not, caps alike";
  ex.clear();
  // Nobody's GPU shared: NCCL's own choice everywhere.
  earlier.reset();
  ex.resize(2);
  runRanks(2, [&](int r) {
    ThreadControlPlane control(pair, r);
    ex[static_cast<size_t>(r)] = createNcclExecutor(r == 0 ? dev0 : dev1, control, r, 20, DeviceHooks{});
  });
  EXPECT_EQ(dev0.lastInitMaxCTAs(), 0);
  EXPECT_EQ(dev1.lastInitMaxCTAs(), 0);
  ex.clear();
}

// A rank that never joins the communicator fails the others at HORA_NCCL_INIT_TIMEOUT_S, not at
// the ops' timeout.
TEST(NcclExecutor, CommunicatorCreationHasItsOwnDeadline) {
  constexpr int n = 2;
  Ranks ranks(n, /*timeoutS=*/30);
  ranks.options.initTimeoutS = 0.3;
  ranks.dev(1).failNext("commInit", 2);  // rank 1 never joins
  std::vector<std::string> messages(n);
  std::vector<hora_status_t> statuses(n, HORA_SUCCESS);
  const auto start = Clock::now();
  runRanks(n, [&](int r) {
    ThreadControlPlane control(ranks.group, r);
    try {
      createNcclExecutor(ranks.dev(r), control, r, ranks.options, DeviceHooks{});
    } catch (const Error &e) {
      statuses[r] = e.status();
      messages[r] = e.message();
    }
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(statuses[0], HORA_ERR_TIMEOUT) << messages[0];
  EXPECT_NE(messages[0].find("HORA_NCCL_INIT_TIMEOUT_S"), std::string::npos) << messages[0];
  EXPECT_EQ(statuses[1], HORA_ERR_BACKEND) << messages[1];
  for (int r = 0; r < n; ++r) EXPECT_EQ(ranks.dev(r).liveComms(), 0) << "aborted";
}

TEST(NcclExecutor, DefaultDeviceIsTheLocalRankModuloTheGpus) {
  FakeCluster cluster;
  FakeDevice dev(cluster, 0, /*deviceCount=*/2);
  EXPECT_EQ(defaultCudaDevice(dev, 0), 0);
  EXPECT_EQ(defaultCudaDevice(dev, 3), 1);
  dev.setDeviceCount(0);
  dev.setWhyNoDevice("no CUDA-capable device is detected");
  try {
    defaultCudaDevice(dev, 0);
    FAIL();
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_BACKEND);
    EXPECT_NE(e.message().find("no CUDA-capable device"), std::string::npos) << e.message();
  }
}

// The rule a CUDA tensor's call is refused by before submission: the end of "input is on cuda:N,
// but ...".
TEST(NcclExecutor, WhyNoCudaDeviceSaysHowManyOrCudasReason) {
  FakeCluster cluster;
  FakeDevice dev(cluster, 0, /*deviceCount=*/2);
  EXPECT_EQ(whyNoCudaDevice(dev, 0), "");
  EXPECT_EQ(whyNoCudaDevice(dev, 1), "");
  EXPECT_EQ(whyNoCudaDevice(dev, 2), "this process sees 2 CUDA devices");
  EXPECT_EQ(whyNoCudaDevice(dev, -1), "this process sees 2 CUDA devices");
  dev.setDeviceCount(0);
  dev.setWhyNoDevice("no CUDA-capable device is detected");
  EXPECT_EQ(whyNoCudaDevice(dev, 0), "no CUDA-capable device is detected");
}

TEST(NcclExecutor, TeardownNeverThrowsAndFreesWhatItMade) {
  Ranks ranks(1);
  ranks.start();
  std::vector<float> a(4, 3.0f);
  RequestMsg m = message("x", OpType::kAllreduce, DType::kFloat32, 0, {{4}, {4}});
  std::vector<float> b(4, 1.0f);
  Request q(m, 0, {TensorArg{a.data(), a.data(), 4}, TensorArg{b.data(), b.data(), 4}});
  ranks.ex(0).allreduce({&q}, responseFor(m), 1);  // fused: a fusion buffer exists
  waitFor(ranks.ex(0), 1);
  ranks.dev(0).throwNext("setDevice");  // teardown's first CUDA call fails
  EXPECT_NO_THROW(ranks.executors.clear());
  EXPECT_EQ(ranks.dev(0).liveStreams(), 0);
  EXPECT_EQ(ranks.dev(0).liveEvents(), 0);
  EXPECT_EQ(ranks.dev(0).liveComms(), 0);
  EXPECT_EQ(ranks.dev(0).liveAllocations(), 0);
}

}  // namespace
}  // namespace hora
