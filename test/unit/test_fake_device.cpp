// SPDX-License-Identifier: Apache-2.0
// The fake gpu::DeviceApi itself: collectives against results computed here, stream order,
// events, cancellation and every kind of injected failure, so that backend tests can trust it.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "fake_device.h"
#include "thread_group.h"

namespace hora::test {
namespace {

using namespace std::chrono_literals;
constexpr int kSum = 0, kMax = 2, kAvg = 4;
constexpr int kNcclSystemError = 2, kNcclInvalidUsage = 5, kNcclRemoteError = 6;

bool eventually(const std::function<bool()> &pred) {
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// n ranks, each a FakeDevice with one stream and a ready communicator (made from this thread:
// commInit does not block). Launches complete at the call unless `inProgress` (the tests of
// non-blocking launches).
struct Ranks {
  explicit Ranks(int n, bool inProgress = false) : size(n) {
    const std::string id = cluster.newUniqueId();
    for (int r = 0; r < n; ++r) {
      dev.push_back(std::make_unique<FakeDevice>(cluster, r));
      dev[r]->launchInProgress(inProgress);
      dev[r]->setDevice(0);
      stream.push_back(dev[r]->createStream());
      comm.push_back(nullptr);
      EXPECT_EQ(dev[r]->commInit(&comm[r], id, n, r, 0), gpu::kNcclInProgress);
    }
    for (int r = 0; r < n; ++r) EXPECT_EQ(state(r), gpu::kNcclSuccess);
  }
  int state(int r) {
    int s = -1;
    EXPECT_EQ(dev[r]->commAsyncError(comm[r], &s), gpu::kNcclSuccess);
    return s;
  }
  template <typename T>
  T *buffer(int r, const std::vector<T> &values) {
    auto *p = static_cast<T *>(dev[r]->allocate(values.size() * sizeof(T), stream[r]));
    std::memcpy(p, values.data(), values.size() * sizeof(T));
    return p;
  }
  // Runs body(rank) on one thread per rank, each draining its device at the end.
  void run(const std::function<void(int)> &body) {
    runRanks(size, [&](int r) {
      dev[r]->setDevice(0);
      body(r);
      dev[r]->drain();
    });
  }

  int size;
  FakeCluster cluster;
  std::vector<std::unique_ptr<FakeDevice>> dev;
  std::vector<gpu::StreamHandle> stream;
  std::vector<gpu::CommHandle> comm;
};

class FakeCollectives : public ::testing::TestWithParam<int> {};

TEST_P(FakeCollectives, AllReduceSumAvgMaxOfFloat32AndInt32) {
  const int n = GetParam();
  const size_t count = 37;
  Ranks ranks(n);
  std::vector<float *> fin(n), fsum(n), favg(n), fmax(n);
  std::vector<int32_t *> iin(n), isum(n), iavg(n), imax(n);
  for (int r = 0; r < n; ++r) {
    std::vector<float> f(count);
    std::vector<int32_t> i(count);
    for (size_t k = 0; k < count; ++k) {
      f[k] = 0.25f * static_cast<float>((r + 1) * static_cast<int>(k)) - 3.0f * static_cast<float>(r);
      i[k] = (r % 2 == 0 ? 1 : -1) * static_cast<int32_t>(k * 7 + static_cast<size_t>(r));
    }
    fin[r] = ranks.buffer(r, f);
    iin[r] = ranks.buffer(r, i);
    std::vector<float> fz(count, 0.0f);
    std::vector<int32_t> iz(count, 0);
    fsum[r] = ranks.buffer(r, fz);
    favg[r] = ranks.buffer(r, fz);
    fmax[r] = ranks.buffer(r, fz);
    isum[r] = ranks.buffer(r, iz);
    iavg[r] = ranks.buffer(r, iz);
    imax[r] = ranks.buffer(r, iz);
  }
  ranks.run([&](int r) {
    FakeDevice &d = *ranks.dev[r];
    auto c = ranks.comm[r];
    auto s = ranks.stream[r];
    EXPECT_EQ(d.allReduce(fin[r], fsum[r], count, DType::kFloat32, kSum, c, s), gpu::kNcclSuccess);
    EXPECT_EQ(d.allReduce(fin[r], favg[r], count, DType::kFloat32, kAvg, c, s), gpu::kNcclSuccess);
    EXPECT_EQ(d.allReduce(fin[r], fmax[r], count, DType::kFloat32, kMax, c, s), gpu::kNcclSuccess);
    EXPECT_EQ(d.allReduce(iin[r], isum[r], count, DType::kInt32, kSum, c, s), gpu::kNcclSuccess);
    EXPECT_EQ(d.allReduce(iin[r], iavg[r], count, DType::kInt32, kAvg, c, s), gpu::kNcclSuccess);
    EXPECT_EQ(d.allReduce(iin[r], imax[r], count, DType::kInt32, kMax, c, s), gpu::kNcclSuccess);
  });
  for (size_t k = 0; k < count; ++k) {
    double fs = 0;
    float fm = -1e30f;
    int64_t is = 0;
    int32_t im = INT32_MIN;
    for (int r = 0; r < n; ++r) {
      fs += fin[r][k];
      fm = std::max(fm, fin[r][k]);
      is += iin[r][k];
      im = std::max(im, iin[r][k]);
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_FLOAT_EQ(fsum[r][k], static_cast<float>(fs)) << "rank " << r << " element " << k;
      EXPECT_FLOAT_EQ(favg[r][k], static_cast<float>(fs / n)) << "rank " << r << " element " << k;
      EXPECT_EQ(fmax[r][k], fm);
      EXPECT_EQ(isum[r][k], is);
      EXPECT_EQ(iavg[r][k], is / n);
      EXPECT_EQ(imax[r][k], im);
    }
  }
  for (int r = 0; r < n; ++r) EXPECT_EQ(ranks.state(r), gpu::kNcclSuccess);
}

TEST_P(FakeCollectives, InPlaceAllReduceReadsEveryInputBeforeAnyoneWrites) {
  const int n = GetParam();
  Ranks ranks(n);
  std::vector<double *> buf(n);
  for (int r = 0; r < n; ++r) buf[r] = ranks.buffer(r, std::vector<double>(1000, r + 1.0));
  ranks.run([&](int r) {
    for (int round = 0; round < 3; ++round) {
      ASSERT_EQ(ranks.dev[r]->allReduce(buf[r], buf[r], 1000, DType::kFloat64, kSum, ranks.comm[r],
                                        ranks.stream[r]),
                gpu::kNcclSuccess);
    }
  });
  // Each round multiplies the sum of 1..n by n.
  double expect = n * (n + 1) / 2.0;
  for (int round = 1; round < 3; ++round) expect *= n;
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < 1000; ++k) ASSERT_EQ(buf[r][k], expect);
  }
}

TEST_P(FakeCollectives, BroadcastAllGatherReduceScatterAndReduce) {
  const int n = GetParam();
  const size_t bytes = 19, count = 5;
  const int root = n - 1;
  Ranks ranks(n);
  std::vector<uint8_t *> bc(n), gin(n), gout(n);
  std::vector<float *> rs(n), red(n), redOut(n);
  for (int r = 0; r < n; ++r) {
    std::vector<uint8_t> mine(bytes);
    for (size_t k = 0; k < bytes; ++k) mine[k] = static_cast<uint8_t>(r * 50 + static_cast<int>(k));
    bc[r] = ranks.buffer(r, mine);  // in place: the root's bytes overwrite everyone's
    gin[r] = ranks.buffer(r, mine);
    gout[r] = ranks.buffer(r, std::vector<uint8_t>(bytes * n, 0));
    std::vector<float> blocks(count * n);
    for (size_t k = 0; k < blocks.size(); ++k) blocks[k] = static_cast<float>(k) + 100.0f * r;
    rs[r] = ranks.buffer(r, blocks);  // in place: rank r's result lands in its own block
    red[r] = ranks.buffer(r, blocks);
    redOut[r] = ranks.buffer(r, std::vector<float>(count * n, -1.0f));
  }
  ranks.run([&](int r) {
    FakeDevice &d = *ranks.dev[r];
    auto c = ranks.comm[r];
    auto s = ranks.stream[r];
    EXPECT_EQ(d.broadcast(bc[r], bc[r], bytes, root, c, s), gpu::kNcclSuccess);
    EXPECT_EQ(d.allGather(gin[r], gout[r], bytes, c, s), gpu::kNcclSuccess);
    EXPECT_EQ(d.reduceScatter(rs[r], rs[r] + r * count, count, DType::kFloat32, kSum, c, s), gpu::kNcclSuccess);
    EXPECT_EQ(d.reduce(red[r], redOut[r], count * n, DType::kFloat32, kMax, 0, c, s), gpu::kNcclSuccess);
  });
  for (int r = 0; r < n; ++r) {
    for (size_t k = 0; k < bytes; ++k) {
      EXPECT_EQ(bc[r][k], static_cast<uint8_t>(root * 50 + static_cast<int>(k)));
      for (int p = 0; p < n; ++p) {
        EXPECT_EQ(gout[r][p * bytes + k], static_cast<uint8_t>(p * 50 + static_cast<int>(k)));
      }
    }
    for (size_t k = 0; k < count; ++k) {
      const size_t at = r * count + k;
      float sum = 0;
      for (int p = 0; p < n; ++p) sum += static_cast<float>(at) + 100.0f * p;
      EXPECT_EQ(rs[r][at], sum) << "rank " << r << " element " << k;
    }
    for (size_t k = 0; k < count * n; ++k) {
      // Only the root's output is written: the max is the last rank's value.
      EXPECT_EQ(redOut[r][k], r == 0 ? static_cast<float>(k) + 100.0f * (n - 1) : -1.0f);
    }
  }
}

TEST_P(FakeCollectives, GroupedSendRecvMatchPerPairInCallOrder) {
  const int n = GetParam();
  Ranks ranks(n);
  // Alltoall: rank r sends (r + 1) * 10 + p bytes of value r*16+p to every other rank p, in place
  // of nothing; then a ring of two messages per pair inside one group.
  auto size = [](int from, int to) { return static_cast<size_t>((from + 1) * 10 + to); };
  std::vector<std::vector<uint8_t *>> out(n, std::vector<uint8_t *>(n)), in(n, std::vector<uint8_t *>(n));
  std::vector<uint8_t *> ringA(n), ringB(n), ringInA(n), ringInB(n);
  for (int r = 0; r < n; ++r) {
    for (int p = 0; p < n; ++p) {
      in[r][p] = ranks.buffer(r, std::vector<uint8_t>(size(r, p), static_cast<uint8_t>(r * 16 + p)));
      out[r][p] = ranks.buffer(r, std::vector<uint8_t>(size(p, r), 0));
    }
    ringInA[r] = ranks.buffer(r, std::vector<uint8_t>(8, static_cast<uint8_t>(0xA0 + r)));
    ringInB[r] = ranks.buffer(r, std::vector<uint8_t>(8, static_cast<uint8_t>(0xB0 + r)));
    ringA[r] = ranks.buffer(r, std::vector<uint8_t>(8, 0));
    ringB[r] = ranks.buffer(r, std::vector<uint8_t>(8, 0));
  }
  ranks.run([&](int r) {
    FakeDevice &d = *ranks.dev[r];
    auto c = ranks.comm[r];
    auto s = ranks.stream[r];
    ASSERT_EQ(d.groupStart(), gpu::kNcclSuccess);
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      EXPECT_EQ(d.send(in[r][p], size(r, p), p, c, s), gpu::kNcclSuccess);
      EXPECT_EQ(d.recv(out[r][p], size(p, r), p, c, s), gpu::kNcclSuccess);
    }
    ASSERT_EQ(d.groupEnd(), gpu::kNcclSuccess);
    // Two messages to the next rank: the first recv gets the first send.
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    ASSERT_EQ(d.groupStart(), gpu::kNcclSuccess);
    ASSERT_EQ(d.groupStart(), gpu::kNcclSuccess);  // nested: one group
    EXPECT_EQ(d.recv(ringA[r], 8, prev, c, s), gpu::kNcclSuccess);
    EXPECT_EQ(d.send(ringInA[r], 8, next, c, s), gpu::kNcclSuccess);
    ASSERT_EQ(d.groupEnd(), gpu::kNcclSuccess);
    EXPECT_EQ(d.send(ringInB[r], 8, next, c, s), gpu::kNcclSuccess);
    EXPECT_EQ(d.recv(ringB[r], 8, prev, c, s), gpu::kNcclSuccess);
    ASSERT_EQ(d.groupEnd(), gpu::kNcclSuccess);
  });
  for (int r = 0; r < n; ++r) {
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      for (size_t k = 0; k < size(p, r); ++k) {
        ASSERT_EQ(out[r][p][k], static_cast<uint8_t>(p * 16 + r)) << "rank " << r << " from " << p;
      }
    }
    const int prev = (r + n - 1) % n;
    for (int k = 0; k < 8; ++k) {
      EXPECT_EQ(ringA[r][k], 0xA0 + prev);
      EXPECT_EQ(ringB[r][k], 0xB0 + prev);
    }
    EXPECT_EQ(ranks.state(r), gpu::kNcclSuccess);
  }
}

TEST_P(FakeCollectives, PreMulSumScalesEachRanksInputByItsOwnFactor) {
  const int n = GetParam();
  Ranks ranks(n);
  std::vector<float *> in(n), out(n);
  std::vector<uint16_t *> hin(n), hout(n);
  for (int r = 0; r < n; ++r) {
    in[r] = ranks.buffer(r, std::vector<float>{1.0f, 2.0f, -4.0f});
    out[r] = ranks.buffer(r, std::vector<float>(3, 0.0f));
    hin[r] = ranks.buffer(r, std::vector<uint16_t>(3, floatToHalf(2.0f)));
    hout[r] = ranks.buffer(r, std::vector<uint16_t>(3, 0));
  }
  ranks.run([&](int r) {
    FakeDevice &d = *ranks.dev[r];
    gpu::RedOp op = -1, hop = -1;
    ASSERT_EQ(d.createPreMulSum(&op, DType::kFloat32, r + 1.0, ranks.comm[r]), gpu::kNcclSuccess);
    ASSERT_EQ(d.createPreMulSum(&hop, DType::kFloat16, 0.5, ranks.comm[r]), gpu::kNcclSuccess);
    EXPECT_GE(op, 5);
    EXPECT_EQ(d.allReduce(in[r], out[r], 3, DType::kFloat32, op, ranks.comm[r], ranks.stream[r]), gpu::kNcclSuccess);
    EXPECT_EQ(d.allReduce(hin[r], hout[r], 3, DType::kFloat16, hop, ranks.comm[r], ranks.stream[r]), gpu::kNcclSuccess);
    // NCCL lets an operator go once the op using it is queued.
    EXPECT_EQ(d.destroyRedOp(op, ranks.comm[r]), gpu::kNcclSuccess);
    EXPECT_EQ(d.destroyRedOp(hop, ranks.comm[r]), gpu::kNcclSuccess);
    EXPECT_EQ(d.allReduce(in[r], out[r], 3, DType::kFloat32, op, ranks.comm[r], ranks.stream[r]), 4)
        << "a destroyed operator";
  });
  const float factorSum = n * (n + 1) / 2.0f;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out[r][0], factorSum);
    EXPECT_EQ(out[r][1], 2 * factorSum);
    EXPECT_EQ(out[r][2], -4 * factorSum);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(halfToFloat(hout[r][k]), static_cast<float>(n));
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, FakeCollectives, ::testing::Values(2, 3),
                         [](const auto &info) { return std::to_string(info.param) + "ranks"; });

TEST(FakeDevice, ACopyQueuedAfterAnAllReduceSeesItsResult) {
  Ranks ranks(2);
  std::vector<int64_t *> in(2), out(2), copy(2);
  for (int r = 0; r < 2; ++r) {
    in[r] = ranks.buffer(r, std::vector<int64_t>(64, r + 10));
    out[r] = ranks.buffer(r, std::vector<int64_t>(64, 0));
    copy[r] = ranks.buffer(r, std::vector<int64_t>(64, 0));
  }
  ranks.dev[0]->hold(true);  // rank 0's GPU is slow: the copy must still come after the result
  ranks.run([&](int r) {
    FakeDevice &d = *ranks.dev[r];
    EXPECT_EQ(d.allReduce(in[r], out[r], 64, DType::kInt64, kSum, ranks.comm[r], ranks.stream[r]), gpu::kNcclSuccess);
    d.copy(copy[r], out[r], 64 * sizeof(int64_t), ranks.stream[r]);
    if (r == 0) {
      std::this_thread::sleep_for(20ms);
      EXPECT_EQ(copy[0][0], 0) << "held: nothing ran";
      d.hold(false);
    }
  });
  for (int r = 0; r < 2; ++r) {
    for (int k = 0; k < 64; ++k) ASSERT_EQ(copy[r][k], 21);
  }
}

TEST(FakeDevice, HoldKeepsAnEventNotDoneUntilReleased) {
  FakeCluster cluster;
  FakeDevice d(cluster);
  d.setDevice(0);
  auto s = d.createStream();
  auto e = d.createEvent();
  EXPECT_TRUE(d.eventDone(e)) << "never recorded";
  auto *buf = static_cast<char *>(d.allocate(64, s));
  std::vector<char> host(64, 'x');
  d.hold(true);
  d.copy(buf, host.data(), 64, s);
  d.recordEvent(e, s);
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(d.eventDone(e));
  d.hold(false);
  EXPECT_TRUE(eventually([&] { return d.eventDone(e); }));
  EXPECT_EQ(buf[63], 'x');
  // Re-recorded: the latest record counts.
  d.hold(true);
  d.recordEvent(e, s);
  EXPECT_FALSE(d.eventDone(e));
  d.hold(false);
  d.drain();
  EXPECT_TRUE(d.eventDone(e));
  d.destroyEvent(e);
  EXPECT_THROW(d.eventDone(e), FakeMisuse);
  EXPECT_THROW(d.recordEvent(e, s), FakeMisuse);
  int notAnEvent = 0;
  EXPECT_THROW(d.waitEvent(s, &notAnEvent), FakeMisuse);
  d.release(buf, s);
  d.destroyStream(s);
}

TEST(FakeDevice, WaitEventOrdersOneStreamAfterAnother) {
  FakeCluster cluster;
  FakeDevice d(cluster);
  auto a = d.createStream();
  auto b = d.createStream();
  auto e = d.createEvent();
  std::atomic<bool> go{false};
  auto gate = [](void *arg) {
    auto *flag = static_cast<std::atomic<bool> *>(arg);
    while (!flag->load()) std::this_thread::sleep_for(1ms);
  };
  int64_t src = 42, dst = 0;
  d.hostCallback(a, gate, &go);
  d.recordEvent(e, a);
  d.waitEvent(b, e);
  d.copy(&dst, &src, sizeof src, b);
  auto after = d.createEvent();
  d.recordEvent(after, b);
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(d.eventDone(after)) << "stream b ran past its wait";
  go = true;
  d.drain();
  EXPECT_EQ(dst, 42);
  EXPECT_TRUE(d.eventDone(after));
  d.destroyEvent(e);
  d.destroyEvent(after);
  d.destroyStream(a);
  d.destroyStream(b);
  EXPECT_EQ(d.liveStreams(), 0);
  EXPECT_EQ(d.liveEvents(), 0);
}

TEST(FakeDevice, CancelledKernelsWriteNothing) {
  FakeCluster cluster;
  FakeDevice d(cluster);
  auto s = d.createStream();
  auto flag = d.createCancelFlag();
  ASSERT_EQ(flag.host, flag.device);
  std::vector<int32_t> src(16, 7), dst(16, 0), dst2(16, 0);
  std::vector<float> f(4, 2.0f);
  const std::vector<nccl_kernels::CopyItem> items = {
      {src.data(), dst.data(), 8 * 4}, {src.data() + 8, dst2.data(), 8 * 4}};
  d.batchedCopy(items, flag.device, s);  // not cancelled
  d.drain();
  EXPECT_EQ(dst[7], 7);
  EXPECT_EQ(dst[8], 0);
  EXPECT_EQ(dst2[0], 7);
  dst.assign(16, 0);
  __atomic_store_n(flag.host, 1, __ATOMIC_RELEASE);
  d.batchedCopy(items, flag.device, s);
  d.scale(f.data(), 4, DType::kFloat32, 3.0, flag.device, s);
  d.drain();
  EXPECT_EQ(dst, std::vector<int32_t>(16, 0));
  EXPECT_EQ(f[0], 2.0f);
  EXPECT_EQ(d.count("stream: batchedCopy cancelled"), 1);
  EXPECT_EQ(d.count("stream: scale cancelled"), 1);
  // A flag is read as the kernel starts, not when it was queued.
  __atomic_store_n(flag.host, 0, __ATOMIC_RELEASE);
  d.hold(true);
  d.batchedCopy(items, flag.device, s);
  __atomic_store_n(flag.host, 1, __ATOMIC_RELEASE);
  d.hold(false);
  d.drain();
  EXPECT_EQ(dst[0], 0);
  d.destroyCancelFlag(flag);
  EXPECT_EQ(d.liveCancelFlags(), 0);
  d.destroyStream(s);
}

TEST(FakeDevice, ScaleMultipliesFloatingTypesAndRefusesIntegers) {
  FakeCluster cluster;
  FakeDevice d(cluster);
  auto s = d.createStream();
  std::vector<float> f = {1.0f, -3.0f, 0.5f};
  std::vector<double> g = {1.0, 0.1};
  std::vector<uint16_t> h = {floatToHalf(1.5f), floatToHalf(-2.0f)};
  std::vector<uint16_t> b = {floatToBfloat16(3.0f), floatToBfloat16(0.25f)};
  d.scale(f.data(), 3, DType::kFloat32, 0.5, nullptr, s);
  d.scale(g.data(), 2, DType::kFloat64, 1.0 / 3.0, nullptr, s);
  d.scale(h.data(), 2, DType::kFloat16, 2.0, nullptr, s);
  d.scale(b.data(), 2, DType::kBFloat16, 4.0, nullptr, s);
  d.drain();
  EXPECT_EQ(f, (std::vector<float>{0.5f, -1.5f, 0.25f}));
  EXPECT_EQ(g[0], 1.0 / 3.0);
  EXPECT_EQ(g[1], 0.1 * (1.0 / 3.0));
  EXPECT_EQ(halfToFloat(h[0]), 3.0f);
  EXPECT_EQ(halfToFloat(h[1]), -4.0f);
  EXPECT_EQ(bfloat16ToFloat(b[0]), 12.0f);
  EXPECT_EQ(bfloat16ToFloat(b[1]), 1.0f);
  std::vector<int32_t> i = {1, 2};
  try {
    d.scale(i.data(), 2, DType::kInt32, 2.0, nullptr, s);
    FAIL() << "scaled integers";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_BACKEND);
  }
  d.scale(i.data(), 2, DType::kInt32, 1.0, nullptr, s);  // factor 1: no launch, no error
  d.destroyStream(s);
}

TEST(FakeDevice, MemoryIsAlignedCountedAndReleasedInStreamOrder) {
  FakeCluster cluster;
  FakeDevice d(cluster);
  auto s = d.createStream();
  void *a = d.allocate(1000, s);
  void *b = d.allocate(24, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 256, 0u);
  EXPECT_EQ(d.allocations(), 2);
  EXPECT_EQ(d.liveBytes(), 1024u);
  EXPECT_EQ(d.liveAllocations(), 2);
  d.zero(a, 1000, s);
  d.release(a, s);
  d.release(b, nullptr);
  d.release(nullptr, s);
  d.drain();
  EXPECT_EQ(d.releases(), 2);
  EXPECT_EQ(d.liveBytes(), 0u);
  EXPECT_EQ(d.count("allocate "), 2);
  EXPECT_EQ(d.count("release 1000"), 1);
  d.destroyStream(s);
}

TEST(FakeDevice, CallLogRecordsCallsThreadsDevicesAndInit) {
  FakeCluster cluster;
  FakeDevice d(cluster, 0, 2, 80);
  EXPECT_EQ(d.currentDevice(), -1);
  d.setDevice(1);
  EXPECT_EQ(d.currentDevice(), 1);
  EXPECT_EQ(d.multiprocessors(1), 80);
  std::thread::id other;
  std::thread t([&] {
    other = std::this_thread::get_id();
    EXPECT_EQ(d.currentDevice(), -1) << "per thread";
    d.setDevice(0);
    EXPECT_EQ(d.currentDevice(), 0);
  });
  t.join();
  EXPECT_EQ(d.currentDevice(), 1);
  EXPECT_THROW(d.setDevice(2), Error);
  gpu::CommHandle c = nullptr;
  EXPECT_EQ(d.commInit(&c, cluster.newUniqueId(), 1, 0, 3), gpu::kNcclInProgress);
  EXPECT_EQ(d.lastInitMaxCTAs(), 3);
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  EXPECT_EQ(d.lastInitAffinity(), cpus);
  ASSERT_EQ(d.inits().size(), 1u);
  EXPECT_EQ(d.inits()[0].device, 1);
  EXPECT_EQ(d.inits()[0].thread, std::this_thread::get_id());
  EXPECT_EQ(d.callsFrom(other), (std::vector<std::string>{"setDevice 0"}));
  const auto mine = d.callsFrom(std::this_thread::get_id());
  ASSERT_GE(mine.size(), 4u);
  EXPECT_EQ(mine[0], "setDevice 1");
  EXPECT_EQ(mine[1], "multiprocessors 1");
  EXPECT_EQ(d.count("setDevice"), 3);
  EXPECT_EQ(d.count("commInit size=1 rank=0 maxCTAs=3"), 1);
  EXPECT_EQ(d.ncclVersion(), "2.28.fake");
  EXPECT_NE(d.ncclErrorString(6).find("ncclRemoteError"), std::string::npos);
  EXPECT_EQ(d.calls().back(), "ncclErrorString 6");
  d.clearCalls();
  EXPECT_TRUE(d.calls().empty());
  EXPECT_EQ(d.commAbort(c), gpu::kNcclSuccess);
  EXPECT_EQ(d.liveComms(), 0);
}

TEST(FakeDevice, WithoutADeviceCudaCallsThrowAndCommInitFails) {
  FakeCluster cluster;
  FakeDevice d(cluster, 0, 0);
  EXPECT_EQ(d.deviceCount(), 0);
  EXPECT_FALSE(d.whyNoDevice().empty());
  for (const auto &call : std::vector<std::function<void()>>{
           [&] { d.setDevice(0); }, [&] { d.createStream(); }, [&] { d.allocate(16, nullptr); },
           [&] { d.multiprocessors(0); }, [&] { d.createCancelFlag(); }}) {
    try {
      call();
      FAIL() << "a CUDA call without a device";
    } catch (const Error &e) {
      EXPECT_EQ(e.status(), HORA_ERR_BACKEND);
      EXPECT_NE(e.message().find("cudaErrorNoDevice"), std::string::npos) << e.message();
    }
  }
  gpu::CommHandle c = nullptr;
  EXPECT_EQ(d.commInit(&c, cluster.newUniqueId(), 1, 0, 0), 1);
  EXPECT_EQ(c, nullptr);
  d.setDeviceCount(1);
  d.setKernelsReason("no kernel image for sm_120");
  EXPECT_EQ(d.kernelsRunOn(0), "no kernel image for sm_120");
  EXPECT_EQ(d.whyNoDevice(), "");
  d.setDevice(0);
}

TEST(FakeDevice, CommunicatorIsReadyOnlyOnceEveryRankJoinedAndFinalizesAfterItsWork) {
  FakeCluster cluster;
  FakeDevice a(cluster, 0), b(cluster, 1);
  auto sa = a.createStream();
  const std::string id = a.uniqueId();
  EXPECT_EQ(id.size(), 128u);
  EXPECT_NE(id, b.uniqueId());
  gpu::CommHandle ca = nullptr, cb = nullptr;
  ASSERT_EQ(a.commInit(&ca, id, 2, 0, 0), gpu::kNcclInProgress);
  int state = -1;
  EXPECT_EQ(a.commAsyncError(ca, &state), gpu::kNcclSuccess);
  EXPECT_EQ(state, gpu::kNcclInProgress);
  float x = 1;
  EXPECT_EQ(a.allReduce(&x, &x, 1, DType::kFloat32, kSum, ca, sa), kNcclInvalidUsage) << "not ready";
  gpu::CommHandle again = nullptr;
  EXPECT_EQ(b.commInit(&again, id, 2, 0, 0), kNcclInvalidUsage) << "rank 0 twice";
  ASSERT_EQ(b.commInit(&cb, id, 2, 1, 0), gpu::kNcclInProgress);
  EXPECT_EQ(a.commAsyncError(ca, &state), gpu::kNcclSuccess);
  EXPECT_EQ(state, gpu::kNcclSuccess);
  // Finalize: in progress while queued work remains.
  a.hold(true);
  auto sb = b.createStream();
  float y = 2;
  a.launchInProgress(false);
  b.launchInProgress(false);
  ASSERT_EQ(a.allReduce(&x, &x, 1, DType::kFloat32, kSum, ca, sa), gpu::kNcclSuccess);
  ASSERT_EQ(b.allReduce(&y, &y, 1, DType::kFloat32, kSum, cb, sb), gpu::kNcclSuccess);
  EXPECT_EQ(a.commFinalize(ca), gpu::kNcclInProgress);
  EXPECT_EQ(a.commAsyncError(ca, &state), gpu::kNcclSuccess);
  EXPECT_EQ(state, gpu::kNcclInProgress);
  a.hold(false);
  EXPECT_TRUE(eventually([&] {
    a.commAsyncError(ca, &state);
    return state == gpu::kNcclSuccess;
  }));
  b.drain();
  EXPECT_EQ(x, 3.0f);
  EXPECT_EQ(y, 3.0f);
  EXPECT_EQ(a.commDestroy(ca), gpu::kNcclSuccess);
  EXPECT_EQ(b.commFinalize(cb), gpu::kNcclInProgress);
  EXPECT_EQ(b.commDestroy(cb), gpu::kNcclSuccess);
  EXPECT_EQ(a.liveComms(), 0);
  EXPECT_EQ(cluster.communicators(), 1);
  a.destroyStream(sa);
  b.destroyStream(sb);
}

// As NCCL's non-blocking communicators with two or more ranks: a launch returns ncclInProgress,
// reaches the stream once the communicator has been asked again, and the communicator takes no
// call meanwhile. A communicator of one rank launches at the call.
TEST(FakeDevice, ALaunchAtTwoRanksIsInProgressUntilAskedAndRefusesCallsMeanwhile) {
  Ranks ranks(2, /*inProgress=*/true);
  std::vector<float *> buf;
  for (int r = 0; r < 2; ++r) buf.push_back(ranks.buffer<float>(r, {float(r + 1), 10.0f * (r + 1)}));
  FakeDevice &a = *ranks.dev[0];
  ASSERT_EQ(a.allReduce(buf[0], buf[0], 2, DType::kFloat32, kSum, ranks.comm[0], ranks.stream[0]),
            gpu::kNcclInProgress);
  EXPECT_EQ(a.allReduce(buf[0], buf[0], 2, DType::kFloat32, kSum, ranks.comm[0], ranks.stream[0]),
            kNcclInvalidUsage);
  EXPECT_NE(a.commLastError(ranks.comm[0]).find("in progress"), std::string::npos) << a.commLastError(ranks.comm[0]);
  gpu::RedOp op = 0;
  EXPECT_EQ(a.createPreMulSum(&op, DType::kFloat32, 2.0, ranks.comm[0]), kNcclInvalidUsage);
  EXPECT_EQ(ranks.state(0), gpu::kNcclInProgress);
  EXPECT_EQ(ranks.state(0), gpu::kNcclSuccess);  // launched: on its stream now
  // A group: one launch, in progress the same way.
  FakeDevice &b = *ranks.dev[1];
  ASSERT_EQ(b.groupStart(), gpu::kNcclSuccess);
  ASSERT_EQ(b.allReduce(buf[1], buf[1], 2, DType::kFloat32, kSum, ranks.comm[1], ranks.stream[1]),
            gpu::kNcclSuccess);
  EXPECT_EQ(b.groupEnd(), gpu::kNcclInProgress);
  while (ranks.state(1) == gpu::kNcclInProgress) {
  }
  for (int r = 0; r < 2; ++r) ranks.dev[r]->drain();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(buf[r][0], 3.0f);
    EXPECT_EQ(buf[r][1], 30.0f);
  }
  EXPECT_EQ(a.count("stream:"), 0) << "nothing skipped or cancelled";
  // One rank: no launch thread, no ncclInProgress.
  FakeCluster solo;
  FakeDevice d(solo);
  d.setDevice(0);
  auto s = d.createStream();
  gpu::CommHandle c = nullptr;
  ASSERT_EQ(d.commInit(&c, solo.newUniqueId(), 1, 0, 0), gpu::kNcclInProgress);
  int state = -1;
  d.commAsyncError(c, &state);
  ASSERT_EQ(state, gpu::kNcclSuccess);
  float x = 4;
  EXPECT_EQ(d.allReduce(&x, &x, 1, DType::kFloat32, kSum, c, s), gpu::kNcclSuccess);
  d.drain();
  EXPECT_EQ(d.commDestroy(c), gpu::kNcclSuccess);
  d.destroyStream(s);
}

// Work queued behind a launch that has not settled would run before the NCCL kernel on a GPU (an
// event recorded there completes early): the fake stops the test.
TEST(FakeDeviceDeathTest, WorkOnAStreamWhoseLaunchIsInProgressAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Ranks ranks(2, /*inProgress=*/true);
        float x = 1;
        ranks.dev[0]->allReduce(&x, &x, 1, DType::kFloat32, kSum, ranks.comm[0], ranks.stream[0]);
        ranks.dev[0]->recordEvent(ranks.dev[0]->createEvent(), ranks.stream[0]);
      },
      "NCCL launch returned ncclInProgress and has not settled");
}

// A launch the communicator's abort overtakes never runs, and frees its stream.
TEST(FakeDevice, AnAbortDropsALaunchInProgress) {
  Ranks ranks(2, /*inProgress=*/true);
  std::vector<float> x = {5};
  FakeDevice &a = *ranks.dev[0];
  ASSERT_EQ(a.allReduce(x.data(), x.data(), 1, DType::kFloat32, kSum, ranks.comm[0], ranks.stream[0]),
            gpu::kNcclInProgress);
  EXPECT_EQ(a.commAbort(ranks.comm[0]), gpu::kNcclSuccess);
  auto e = a.createEvent();
  a.recordEvent(e, ranks.stream[0]);  // allowed again
  a.drain();
  EXPECT_TRUE(a.eventDone(e));
  EXPECT_EQ(x[0], 5.0f);
  a.destroyEvent(e);
}

TEST(FakeDevice, FailNextReturnsTheResultOnceAndQueuesNothing) {
  Ranks ranks(2);
  FakeDevice &d = *ranks.dev[0];
  std::vector<float> x(4, 1.0f);
  d.failNext("allReduce", 3);
  EXPECT_EQ(d.allReduce(x.data(), x.data(), 4, DType::kFloat32, kSum, ranks.comm[0], ranks.stream[0]), 3);
  // The group's failed end drops the group.
  d.failNext("groupEnd", 2);
  ASSERT_EQ(d.groupStart(), gpu::kNcclSuccess);
  EXPECT_EQ(d.allReduce(x.data(), x.data(), 4, DType::kFloat32, kSum, ranks.comm[0], ranks.stream[0]),
            gpu::kNcclSuccess);
  EXPECT_EQ(d.groupEnd(), 2);
  EXPECT_EQ(d.groupEnd(), kNcclInvalidUsage) << "no group open";
  d.drain();
  EXPECT_EQ(x[0], 1.0f);
  // Nothing was queued on rank 0: the next allreduce pairs with rank 1's first.
  std::vector<float> y(4, 2.0f);
  ranks.run([&](int r) {
    std::vector<float> &v = r == 0 ? x : y;
    EXPECT_EQ(ranks.dev[r]->allReduce(v.data(), v.data(), 4, DType::kFloat32, kSum, ranks.comm[r],
                                      ranks.stream[r]),
              gpu::kNcclSuccess);
  });
  EXPECT_EQ(x[0], 3.0f);
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(d.count("allReduce count=4 op=0"), 3);
  // commInit: NCCL made a communicator that failed; it must be aborted.
  gpu::CommHandle c = nullptr;
  d.failNext("commInit", 2);
  EXPECT_EQ(d.commInit(&c, ranks.cluster.newUniqueId(), 2, 0, 0), 2);
  ASSERT_NE(c, nullptr);
  int state = 0;
  EXPECT_EQ(d.commAsyncError(c, &state), gpu::kNcclSuccess);
  EXPECT_EQ(state, 2);
  EXPECT_EQ(d.liveComms(), 2);
  EXPECT_EQ(d.commAbort(c), gpu::kNcclSuccess);
  EXPECT_EQ(d.liveComms(), 1);
  EXPECT_THROW(d.failNext("allocate", 1), FakeMisuse);
}

TEST(FakeDevice, ThrowNextThrowsLikeCudaOnce) {
  FakeCluster cluster;
  FakeDevice d(cluster);
  for (const char *call : {"allocate", "createStream", "setDevice", "batchedCopy", "uniqueId"}) {
    d.throwNext(call);
  }
  auto expectThrow = [](const std::function<void()> &f, const char *what) {
    try {
      f();
      ADD_FAILURE() << what << " did not throw";
    } catch (const Error &e) {
      EXPECT_EQ(e.status(), HORA_ERR_BACKEND) << what;
      EXPECT_NE(e.message().find("CUDA error"), std::string::npos) << e.message();
    }
  };
  expectThrow([&] { d.allocate(8, nullptr); }, "allocate");
  expectThrow([&] { d.createStream(); }, "createStream");
  expectThrow([&] { d.setDevice(0); }, "setDevice");
  expectThrow([&] { d.batchedCopy({}, nullptr, nullptr); }, "batchedCopy");
  expectThrow([&] { d.uniqueId(); }, "uniqueId");
  EXPECT_EQ(d.liveAllocations(), 0);
  EXPECT_EQ(d.liveStreams(), 0);
  // Once only.
  void *p = d.allocate(8, nullptr);
  auto s = d.createStream();
  d.setDevice(0);
  d.release(p, s);
  d.destroyStream(s);
  EXPECT_THROW(d.throwNext("commInit"), FakeMisuse);
}

TEST(FakeDevice, FailAsyncEndsTheOpInProgressWithoutWriting) {
  Ranks ranks(2);
  std::vector<float *> buf(2);
  for (int r = 0; r < 2; ++r) buf[r] = ranks.buffer(r, std::vector<float>(8, 1.0f));
  FakeDevice &d0 = *ranks.dev[0];
  ASSERT_EQ(d0.allReduce(buf[0], buf[0], 8, DType::kFloat32, kSum, ranks.comm[0], ranks.stream[0]),
            gpu::kNcclSuccess);
  ASSERT_TRUE(eventually([&] { return d0.ncclOpsInProgress() == 1; }));  // waiting for rank 1
  d0.failAsync(kNcclSystemError);
  d0.drain();
  EXPECT_EQ(ranks.state(0), kNcclSystemError);
  EXPECT_EQ(buf[0][0], 1.0f);
  EXPECT_EQ(d0.count("stream: allReduce ended without writing"), 1);
  // An op on a communicator in error fails at once.
  EXPECT_EQ(d0.allReduce(buf[0], buf[0], 8, DType::kFloat32, kSum, ranks.comm[0], ranks.stream[0]),
            kNcclSystemError);
  // The backend aborts the failed communicator; the peer's op then sees a remote error.
  EXPECT_EQ(d0.commAbort(ranks.comm[0]), gpu::kNcclSuccess);
  ASSERT_EQ(ranks.dev[1]->allReduce(buf[1], buf[1], 8, DType::kFloat32, kSum, ranks.comm[1], ranks.stream[1]),
            gpu::kNcclSuccess);
  ranks.dev[1]->drain();
  EXPECT_EQ(ranks.state(1), kNcclRemoteError);
  EXPECT_EQ(buf[1][0], 1.0f);
  EXPECT_FALSE(ranks.dev[1]->commLastError(ranks.comm[1]).empty());
}

TEST(FakeDevice, AStalledRankHangsItsPeersUntilItAborts) {
  Ranks ranks(2);
  std::vector<float *> buf(2);
  for (int r = 0; r < 2; ++r) buf[r] = ranks.buffer(r, std::vector<float>(8, 1.0f));
  std::vector<gpu::EventHandle> done(2);
  ranks.dev[0]->stall(true);
  for (int r = 0; r < 2; ++r) {
    done[r] = ranks.dev[r]->createEvent();
    ASSERT_EQ(ranks.dev[r]->allReduce(buf[r], buf[r], 8, DType::kFloat32, kSum, ranks.comm[r], ranks.stream[r]),
              gpu::kNcclSuccess);
    ranks.dev[r]->recordEvent(done[r], ranks.stream[r]);
  }
  ASSERT_TRUE(eventually([&] { return ranks.dev[0]->count("stream: allReduce stalled") == 1; }));
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(ranks.dev[0]->eventDone(done[0]));
  EXPECT_FALSE(ranks.dev[1]->eventDone(done[1]));
  EXPECT_EQ(ranks.state(1), gpu::kNcclSuccess) << "a stuck peer is not an error by itself";
  EXPECT_EQ(ranks.dev[0]->commAbort(ranks.comm[0]), gpu::kNcclSuccess);
  ranks.dev[0]->drain();
  ranks.dev[1]->drain();
  EXPECT_TRUE(ranks.dev[0]->eventDone(done[0]));
  EXPECT_TRUE(ranks.dev[1]->eventDone(done[1]));
  EXPECT_EQ(ranks.state(1), kNcclRemoteError);
  EXPECT_EQ(buf[0][0], 1.0f);
  EXPECT_EQ(buf[1][0], 1.0f);
}

TEST(FakeDevice, StallReleasedLetsTheOpComplete) {
  Ranks ranks(2);
  std::vector<float *> buf(2);
  for (int r = 0; r < 2; ++r) buf[r] = ranks.buffer(r, std::vector<float>(4, 2.0f));
  ranks.dev[1]->stall(true);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ranks.dev[r]->allReduce(buf[r], buf[r], 4, DType::kFloat32, kSum, ranks.comm[r], ranks.stream[r]),
              gpu::kNcclSuccess);
  }
  ASSERT_TRUE(eventually([&] { return ranks.dev[1]->count("stream: allReduce stalled") == 1; }));
  ranks.dev[1]->stall(false);
  ranks.dev[0]->drain();
  ranks.dev[1]->drain();
  EXPECT_EQ(buf[0][3], 4.0f);
  EXPECT_EQ(buf[1][3], 4.0f);
}

TEST(FakeDevice, AbortEndsTheAbortedRanksOwnWaitAndSkipsItsLaterOps) {
  Ranks ranks(2);
  std::vector<float> x(4, 1.0f), y(4, 1.0f);
  FakeDevice &d0 = *ranks.dev[0];
  ASSERT_EQ(d0.allReduce(x.data(), x.data(), 4, DType::kFloat32, kSum, ranks.comm[0], ranks.stream[0]),
            gpu::kNcclSuccess);
  ASSERT_EQ(d0.allReduce(y.data(), y.data(), 4, DType::kFloat32, kSum, ranks.comm[0], ranks.stream[0]),
            gpu::kNcclSuccess);
  ASSERT_TRUE(eventually([&] { return d0.ncclOpsInProgress() == 1; }));
  EXPECT_EQ(d0.commAbort(ranks.comm[0]), gpu::kNcclSuccess);  // returns: its op in the rendezvous ended
  d0.drain();
  EXPECT_EQ(d0.count("stream: allReduce ended without writing (aborted)"), 1);
  EXPECT_EQ(d0.count("stream: allReduce skipped (aborted)"), 1);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(ranks.state(1), gpu::kNcclSuccess) << "no op of rank 1 was waiting";
}

TEST(FakeDevice, RanksThatDisagreeAllGetInvalidUsage) {
  Ranks ranks(3);
  std::vector<std::vector<float>> v(3, std::vector<float>(12, 1.0f));
  ranks.run([&](int r) {
    const size_t count = r == 2 ? 12 : 10;
    EXPECT_EQ(ranks.dev[r]->allReduce(v[r].data(), v[r].data(), count, DType::kFloat32, kSum,
                                      ranks.comm[r], ranks.stream[r]),
              gpu::kNcclSuccess);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ranks.state(r), kNcclInvalidUsage);
    EXPECT_EQ(v[r][0], 1.0f);
    EXPECT_NE(ranks.dev[r]->commLastError(ranks.comm[r]).find("disagree"), std::string::npos);
  }
}

TEST(FakeDevice, SendAndRecvOfDifferentSizesFailBothSides) {
  Ranks ranks(2);
  std::vector<uint8_t> a(16, 1), b(16, 0);
  ranks.run([&](int r) {
    if (r == 0) {
      EXPECT_EQ(ranks.dev[0]->send(a.data(), 16, 1, ranks.comm[0], ranks.stream[0]), gpu::kNcclSuccess);
    } else {
      EXPECT_EQ(ranks.dev[1]->recv(b.data(), 8, 0, ranks.comm[1], ranks.stream[1]), gpu::kNcclSuccess);
    }
  });
  EXPECT_EQ(ranks.state(0), kNcclInvalidUsage);
  EXPECT_EQ(ranks.state(1), kNcclInvalidUsage);
  EXPECT_EQ(b[0], 0);
}

TEST(FakeDevice, DestroyStreamRunsItsQueuedWorkFirst) {
  FakeCluster cluster;
  FakeDevice d(cluster);
  auto s = d.createStream();
  std::vector<int> v(1000, 0);
  d.hold(true);
  for (int i = 0; i < 10; ++i) d.hostCallback(s, [](void *p) { ++*static_cast<int *>(p); }, v.data());
  std::thread release([&] {
    std::this_thread::sleep_for(10ms);
    d.hold(false);
  });
  d.destroyStream(s);
  release.join();
  EXPECT_EQ(v[0], 10);
}

}  // namespace
}  // namespace hora::test
