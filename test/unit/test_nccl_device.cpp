// SPDX-License-Identifier: Apache-2.0
// The NCCL backend's CUDA side in one process: without a GPU, clear errors instead of crashes;
// with one, device memory round trips, the batched packing copy and the scaling kernel against
// results computed here on the host, and their cancel flag.
#include <cuda_runtime_api.h>  // the test's own mapped flag; nccl_dep puts CUDA's headers in reach
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "backends/nccl/device_api.h"
#include "backends/nccl/nccl_device.h"
#include "backends/nccl/nccl_kernels.h"
#include "base/dtype.h"
#include "base/error.h"
#include "hora_config.h"

namespace hora {
namespace {

#define REQUIRE_GPU()                                                                       \
  if (nccl_device::deviceCount() == 0) {                                                    \
    GTEST_SKIP() << "no GPU here (" << nccl_device::whyNoDevice() << ")";                   \
  }

TEST(NcclDevice, WithoutAGpuEveryCallFailsWithCudasReason) {
  if (nccl_device::deviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  EXPECT_FALSE(nccl_device::whyNoDevice().empty());
  try {
    nccl_device::Buffer b(0, 1024);
    FAIL() << "allocated device memory without a device";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_BACKEND);
    EXPECT_NE(e.message().find("CUDA error"), std::string::npos) << e.message();
  }
  EXPECT_THROW(nccl_device::recordEvent(0, nullptr), Error);
}

TEST(NcclDevice, MemoryRoundTrips) {
  REQUIRE_GPU();
  std::vector<uint8_t> host(4097), back(4097, 0);
  std::iota(host.begin(), host.end(), uint8_t{7});
  nccl_device::Buffer b(0, host.size());
  b.upload(host.data(), host.size());
  b.download(back.data(), back.size());
  EXPECT_EQ(host, back);
}

TEST(NcclKernels, BatchedCopyMovesEveryItemAlignedOrNot) {
  REQUIRE_GPU();
  // More items than one launch takes, odd sizes and offsets and aligned ones.
  const int items = nccl_kernels::kMaxItemsPerLaunch + 37;
  std::vector<int64_t> sizes, srcAt, dstAt;
  int64_t src = 0, dst = 0;
  for (int i = 0; i < items; ++i) {
    const int64_t n = i % 5 == 0 ? 0 : (i * 37) % 3000 + (i % 3 == 0 ? 16 : 1);
    src += i % 2 == 0 ? 16 - src % 16 : 3;  // even items aligned, odd ones not
    dst += i % 2 == 0 ? 16 - dst % 16 : 5;
    sizes.push_back(n);
    srcAt.push_back(src);
    dstAt.push_back(dst);
    src += n;
    dst += n;
  }
  std::vector<uint8_t> host(static_cast<size_t>(src)), out(static_cast<size_t>(dst), 0xEE);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 131 + 7);
  nccl_device::Buffer from(0, host.size()), to(0, out.size());
  from.upload(host.data(), host.size());
  to.upload(out.data(), out.size());
  std::vector<nccl_kernels::CopyItem> batch;
  for (int i = 0; i < items; ++i) {
    batch.push_back({static_cast<char *>(from.data()) + srcAt[i], static_cast<char *>(to.data()) + dstAt[i],
                     sizes[i]});
  }
  nccl_device::Stream stream(0);
  nccl_device::check(nccl_kernels::batchedCopy(batch, nullptr, stream.handle()), "batchedCopy");
  stream.synchronize();
  to.download(out.data(), out.size());
  std::vector<uint8_t> expect(static_cast<size_t>(dst), 0xEE);
  for (int i = 0; i < items; ++i) {
    std::memcpy(&expect[static_cast<size_t>(dstAt[i])], &host[static_cast<size_t>(srcAt[i])],
                static_cast<size_t>(sizes[i]));
  }
  EXPECT_EQ(expect, out);
}

TEST(NcclKernels, ScaleRoundsOnceInEveryFloatingType) {
  REQUIRE_GPU();
  const int64_t n = 10000;
  const double factor = 0.3;
  nccl_device::Stream stream(0);
  for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    const size_t esize = dtypeSize(t);
    std::vector<uint8_t> host(static_cast<size_t>(n) * esize), back(host.size());
    std::vector<uint8_t> expect(host.size());
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>((i % 200) - 100) * 0.75f;
      uint8_t *h = &host[static_cast<size_t>(i) * esize];
      uint8_t *e = &expect[static_cast<size_t>(i) * esize];
      switch (t) {
        case DType::kFloat16: {
          const uint16_t x = floatToHalf(v), y = floatToHalf(halfToFloat(x) * static_cast<float>(factor));
          std::memcpy(h, &x, 2);
          std::memcpy(e, &y, 2);
          break;
        }
        case DType::kBFloat16: {
          const uint16_t x = floatToBfloat16(v);
          const uint16_t y = floatToBfloat16(bfloat16ToFloat(x) * static_cast<float>(factor));
          std::memcpy(h, &x, 2);
          std::memcpy(e, &y, 2);
          break;
        }
        case DType::kFloat32: {
          const float y = v * static_cast<float>(factor);
          std::memcpy(h, &v, 4);
          std::memcpy(e, &y, 4);
          break;
        }
        default: {
          const double x = v, y = x * factor;
          std::memcpy(h, &x, 8);
          std::memcpy(e, &y, 8);
        }
      }
    }
    nccl_device::Buffer b(0, host.size());
    b.upload(host.data(), host.size());
    nccl_device::check(nccl_kernels::scale(b.data(), n, t, factor, nullptr, stream.handle()), "scale");
    stream.synchronize();
    b.download(back.data(), back.size());
    EXPECT_EQ(expect, back) << dtypeName(t);
  }
}

// A cancel flag as the backend keeps one: mapped pinned host memory the kernels read.
class MappedFlag {
 public:
  MappedFlag() {
    void *host = nullptr, *device = nullptr;
    nccl_device::check(cudaHostAlloc(&host, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable),
                       "cudaHostAlloc");
    host_ = static_cast<int *>(host);
    set(0);
    nccl_device::check(cudaHostGetDevicePointer(&device, host, 0), "cudaHostGetDevicePointer");
    device_ = static_cast<const int *>(device);
  }
  ~MappedFlag() { cudaFreeHost(host_); }
  MappedFlag(const MappedFlag &) = delete;
  MappedFlag &operator=(const MappedFlag &) = delete;
  void set(int v) { *static_cast<volatile int *>(host_) = v; }
  const int *device() const { return device_; }

 private:
  int *host_ = nullptr;
  const int *device_ = nullptr;
};

TEST(NcclKernels, CancelledCopyAndScaleWriteNothing) {
  REQUIRE_GPU();
  const int64_t n = 3 << 20;  // floats: a grid of many blocks, every one of which must stop
  std::vector<float> ones(static_cast<size_t>(n), 1.0f), twos(static_cast<size_t>(n), 2.0f);
  std::vector<float> back(static_cast<size_t>(n));
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  nccl_device::Buffer from(0, bytes), to(0, bytes);
  from.upload(twos.data(), bytes);
  to.upload(ones.data(), bytes);
  nccl_device::Stream stream(0);
  MappedFlag cancel;
  cancel.set(1);
  // Aligned and not: every copy path checks the flag.
  const std::vector<nccl_kernels::CopyItem> items = {
      {from.data(), to.data(), static_cast<int64_t>(bytes / 2)},
      {static_cast<char *>(from.data()) + bytes / 2 + 1, static_cast<char *>(to.data()) + bytes / 2,
       static_cast<int64_t>(bytes / 2 - 1)}};
  nccl_device::check(nccl_kernels::batchedCopy(items, cancel.device(), stream.handle()), "batchedCopy");
  nccl_device::check(
      nccl_kernels::scale(to.data(), n, DType::kFloat32, 3.0, cancel.device(), stream.handle()), "scale");
  stream.synchronize();
  to.download(back.data(), bytes);
  EXPECT_EQ(ones, back) << "a cancelled kernel wrote";

  // The same calls with the flag down do their work: the flag, not something else, stopped them.
  cancel.set(0);
  nccl_device::check(
      nccl_kernels::scale(from.data(), n, DType::kFloat32, 3.0, cancel.device(), stream.handle()), "scale");
  nccl_device::check(nccl_kernels::batchedCopy({{from.data(), to.data(), static_cast<int64_t>(bytes)}},
                                               cancel.device(), stream.handle()),
                     "batchedCopy");
  stream.synchronize();
  to.download(back.data(), bytes);
  EXPECT_EQ(std::vector<float>(static_cast<size_t>(n), 6.0f), back);
}

// The backend's own flag (DeviceApi): its kernels read a device-memory snapshot taken in stream
// order, so a flag raised while they wait behind earlier work (the aborted NCCL kernel, here a
// host function that holds the stream) still stops them, and one never raised lets them work.
TEST(NcclKernels, FlagRaisedWhileKernelsWaitStopsThem) {
  REQUIRE_GPU();
  gpu::DeviceApi &api = gpu::cudaDeviceApi();
  api.setDevice(0);
  const int64_t n = 1 << 20;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  std::vector<float> ones(static_cast<size_t>(n), 1.0f), twos(static_cast<size_t>(n), 2.0f);
  std::vector<float> back(static_cast<size_t>(n));
  nccl_device::Buffer from(0, bytes), to(0, bytes);
  gpu::StreamHandle stream = api.createStream();
  gpu::DeviceApi::CancelFlag flag = api.createCancelFlag();
  for (const bool raise : {true, false}) {
    from.upload(twos.data(), bytes);
    to.upload(ones.data(), bytes);
    std::promise<void> go;
    std::shared_future<void> released = go.get_future().share();
    api.hostCallback(stream, [](void *f) { static_cast<std::shared_future<void> *>(f)->wait(); }, &released);
    const std::vector<nccl_kernels::CopyItem> items = {{from.data(), to.data(), static_cast<int64_t>(bytes)}};
    api.batchedCopy(items, flag.device, stream);
    api.scale(to.data(), n, DType::kFloat32, 3.0, flag.device, stream);
    if (raise) *static_cast<volatile int *>(flag.host) = 1;
    go.set_value();
    nccl_device::check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
    to.download(back.data(), bytes);
    EXPECT_EQ(raise ? ones : std::vector<float>(static_cast<size_t>(n), 6.0f), back)
        << (raise ? "kernels queued before the flag was raised wrote after it" : "the kernels did not run");
    *static_cast<volatile int *>(flag.host) = 0;
  }
  api.destroyCancelFlag(flag);
  api.destroyStream(stream);
}

TEST(NcclKernels, MisalignedCopiesMatchMemcpy) {
  REQUIRE_GPU();
  // Every source offset against every destination offset in 0..16 (distances of 0, odd, 2, 4, 8,
  // 12 and 16 bytes; heads and tails of every length), small sizes around the word sizes, and
  // a few large copies that take the grid-stride loop. One batch: items of different word
  // sizes share launches, and there are more than one launch takes.
  struct Case {
    int64_t srcOff, dstOff, bytes;
  };
  std::vector<Case> cases;
  for (int s = 0; s <= 16; ++s) {
    for (int d = 0; d <= 16; ++d) {
      for (int64_t n : {1, 7, 33, 4099}) cases.push_back({s, d, n});
    }
  }
  const int64_t big = (3 << 20) + 7;
  const int bigOffsets[][2] = {{0, 0}, {1, 0}, {0, 3}, {4, 0}, {8, 0}, {2, 6}, {5, 5}, {12, 4}};
  for (const auto &sd : bigOffsets) cases.push_back({sd[0], sd[1], big});
  std::vector<int64_t> srcAt, dstAt;
  int64_t src = 0, dst = 0;
  for (const Case &c : cases) {
    src = (src + 255) / 256 * 256 + c.srcOff;
    dst = (dst + 255) / 256 * 256 + c.dstOff;
    srcAt.push_back(src);
    dstAt.push_back(dst);
    src += c.bytes;
    dst += c.bytes + 3;  // a gap that must stay untouched
  }
  std::vector<uint8_t> host(static_cast<size_t>(src)), out(static_cast<size_t>(dst), 0xEE);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  nccl_device::Buffer from(0, host.size()), to(0, out.size());
  from.upload(host.data(), host.size());
  to.upload(out.data(), out.size());
  std::vector<nccl_kernels::CopyItem> batch;
  for (size_t i = 0; i < cases.size(); ++i) {
    batch.push_back({static_cast<char *>(from.data()) + srcAt[i], static_cast<char *>(to.data()) + dstAt[i],
                     cases[i].bytes});
  }
  ASSERT_GT(batch.size(), static_cast<size_t>(nccl_kernels::kMaxItemsPerLaunch));
  nccl_device::Stream stream(0);
  nccl_device::check(nccl_kernels::batchedCopy(batch, nullptr, stream.handle()), "batchedCopy");
  stream.synchronize();
  to.download(out.data(), out.size());
  std::vector<uint8_t> expect(out.size(), 0xEE);
  for (size_t i = 0; i < cases.size(); ++i) {
    std::memcpy(&expect[static_cast<size_t>(dstAt[i])], &host[static_cast<size_t>(srcAt[i])],
                static_cast<size_t>(cases[i].bytes));
  }
  int wrong = 0;
  for (size_t i = 0; i < cases.size() && wrong < 10; ++i) {
    const size_t at = static_cast<size_t>(dstAt[i]), n = static_cast<size_t>(cases[i].bytes) + 3;
    if (std::memcmp(&expect[at], &out[at], n) != 0) {
      ++wrong;
      ADD_FAILURE() << "item " << i << ": src offset " << cases[i].srcOff << ", dst offset " << cases[i].dstOff
                    << ", " << cases[i].bytes << " bytes";
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST(NcclKernels, AStaleErrorIsNotBlamedOnALaunch) {
  REQUIRE_GPU();
  nccl_device::Buffer b(0, 64);
  nccl_device::Stream stream(0);
  // An error no one collected, left in this thread's slot (not sticky).
  EXPECT_NE(cudaSetDevice(1 << 20), cudaSuccess);
  EXPECT_EQ(nccl_kernels::batchedCopy({{b.data(), static_cast<char *>(b.data()) + 32, 32}}, nullptr,
                                      stream.handle()),
            0);
  EXPECT_NE(cudaSetDevice(1 << 20), cudaSuccess);
  EXPECT_EQ(nccl_kernels::scale(b.data(), 16, DType::kFloat32, 2.0, nullptr, stream.handle()), 0);
  stream.synchronize();
}

TEST(NcclKernels, WithoutAGpuLaunchesFailAndSayWhy) {
  if (nccl_device::deviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  char bytes[2] = {1, 2};
  EXPECT_NE(nccl_kernels::batchedCopy({{&bytes[0], &bytes[1], 1}}, nullptr, nullptr), 0);
  float f = 1.0f;
  EXPECT_NE(nccl_kernels::scale(&f, 1, DType::kFloat32, 2.0, nullptr, nullptr), 0);
  EXPECT_EQ(nccl_kernels::scale(&f, 0, DType::kFloat32, 2.0, nullptr, nullptr), 0);  // nothing to do
  EXPECT_EQ(bytes[1], 2);
  EXPECT_EQ(f, 1.0f);
  const std::string why = nccl_kernels::kernelsRunOn(0);
  EXPECT_FALSE(why.empty());
  EXPECT_NE(why.find("cuda:0"), std::string::npos) << why;
  EXPECT_FALSE(nccl_kernels::deviceDescription(0).empty());
  // (No test of the error slot here: without a driver every cudaGetLastError answers
  // cudaErrorInsufficientDriver, however often it is asked.)
}

// The words hora-info prints name what gpu_archs asked for: by default Turing (sm_75) on.
TEST(NcclKernels, BuiltArchitecturesNameWhatTheBuildAskedFor) {
  const std::string built = nccl_kernels::builtArchitectures();
  ASSERT_FALSE(built.empty());
  EXPECT_NE(built.find(" + PTX compute_"), std::string::npos) << built;
  std::string asked = HORA_GPU_ARCHS_OPTION;
  if (asked == "all") asked = "75";
  for (char &c : asked) {
    if (c == ',') c = ' ';
  }
  std::istringstream words(asked);
  for (std::string a; words >> a;) {
    if (a.rfind("sm_", 0) == 0) a = a.substr(3);
    if (a.rfind("compute_", 0) == 0) a = a.substr(8);
    EXPECT_NE((built + " ").find("sm_" + a + " "), std::string::npos) << built << " lacks sm_" << a;
  }
  // PTX for the newest SASS: "... sm_121 + PTX compute_121".
  const std::string sass = built.substr(0, built.find(" + PTX"));
  const std::string newest = sass.substr(sass.rfind("sm_") + 3);
  EXPECT_EQ(built.substr(built.find("compute_") + 8), newest) << built;
}

TEST(NcclKernels, KernelsRunOnThisGpu) {
  REQUIRE_GPU();
  const int count = nccl_device::deviceCount();
  int before = -1;
  ASSERT_EQ(cudaSetDevice(count - 1), cudaSuccess);
  ASSERT_EQ(cudaGetDevice(&before), cudaSuccess);
  for (int d = 0; d < count; ++d) {
    EXPECT_EQ(nccl_kernels::kernelsRunOn(d), "") << nccl_kernels::deviceDescription(d);
    EXPECT_NE(nccl_kernels::deviceDescription(d).find(", sm_"), std::string::npos);
    int now = -1;
    EXPECT_EQ(cudaGetDevice(&now), cudaSuccess);
    EXPECT_EQ(now, before) << "kernelsRunOn(" << d << ") left another device current";
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  const std::string none = nccl_kernels::kernelsRunOn(count);
  EXPECT_NE(none.find("does not exist"), std::string::npos) << none;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace hora
