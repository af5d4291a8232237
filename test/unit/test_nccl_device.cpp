// SPDX-License-Identifier: Apache-2.0
// The NCCL backend's CUDA side in one process: without a GPU, clear errors instead of crashes;
// with one, device memory round trips, the batched packing copy and the scaling kernel against
// results computed here on the host.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "backends/nccl/nccl_device.h"
#include "backends/nccl/nccl_kernels.h"
#include "base/dtype.h"
#include "base/error.h"

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
  // More items than one launch takes, odd sizes and offsets (the byte path) and aligned ones.
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
  nccl_device::check(nccl_kernels::batchedCopy(batch, stream.handle()), "batchedCopy");
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
    nccl_device::check(nccl_kernels::scale(b.data(), n, t, factor, stream.handle()), "scale");
    stream.synchronize();
    b.download(back.data(), back.size());
    EXPECT_EQ(expect, back) << dtypeName(t);
  }
}

}  // namespace
}  // namespace hora
