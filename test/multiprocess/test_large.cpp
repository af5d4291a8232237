// SPDX-License-Identifier: Apache-2.0
// Byte counts past 2^31 (MPI's int limit): a broadcast and an allgather, checked by sampling.
#include <hora/hora.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mp_harness.h"

namespace {

using mp::Request;

constexpr int64_t kTwoGiB = int64_t{1} << 31;

// Different per rank and per 4 KiB page (a multiplicative hash of the page number), so a block
// landing at a wrong offset (one that wrapped at 2^31 or 2^32, say) reads as wrong, which a
// pattern periodic in a power of two would not show.
inline uint8_t pageMix(int64_t page) {
  return static_cast<uint8_t>((static_cast<uint32_t>(page) * 0x9E3779B1u) >> 24);
}
inline uint8_t pattern(int64_t i, int r) {
  return static_cast<uint8_t>((i * 7 + r + pageMix(i >> 12)) & 0xff);
}

struct FreeDeleter {
  void operator()(void *p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

Buffer allocate(int64_t bytes) { return Buffer(static_cast<uint8_t *>(std::malloc(static_cast<size_t>(bytes)))); }

void fillPattern(uint8_t *p, int64_t bytes, int r) {
  // Page by page, so the inner loop is plain arithmetic the compiler vectorises.
  for (int64_t page = 0; page * 4096 < bytes; ++page) {
    const int64_t begin = page * 4096, end = std::min(bytes, begin + 4096);
    const int base = r + pageMix(page);
    for (int64_t i = begin; i < end; ++i) p[i] = static_cast<uint8_t>(i * 7 + base);
  }
}

// Positions worth reading in a buffer of `bytes`: a stride over all of it (prime, so it walks
// through every residue), both ends, and both sides of 2^31 and 2^32.
std::vector<int64_t> samplePositions(int64_t bytes) {
  std::vector<int64_t> pos;
  for (int64_t i = 0; i < bytes; i += 1000003) pos.push_back(i);
  for (int64_t edge : {int64_t{0}, kTwoGiB, 2 * kTwoGiB, bytes}) {
    for (int64_t d = -4100; d <= 4100; ++d) {
      const int64_t i = edge + d;
      if (i >= 0 && i < bytes) pos.push_back(i);
    }
  }
  return pos;
}

DLTensor bytesTensor(uint8_t *data, int64_t *shape, int ndim) {
  DLTensor t{};
  t.data = data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = DLDataType{kDLUInt, 8, 1};
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  return t;
}

TEST(Large, BroadcastPast2GiB) {
  const int r = mp::rank(), n = mp::size();
  if (n > 2) GTEST_SKIP() << "sized for at most 2 ranks on one host";
  const int64_t bytes = kTwoGiB + 4096;
  Buffer buf = allocate(bytes);
  if (!buf) GTEST_SKIP() << "could not allocate " << bytes << " bytes";
  const int root = n - 1;
  if (r == root) {
    fillPattern(buf.get(), bytes, root);
  } else {
    std::memset(buf.get(), 0xa5, static_cast<size_t>(bytes));
  }
  int64_t shape[1] = {bytes};
  DLTensor t = bytesTensor(buf.get(), shape, 1);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_broadcast_async("large.bc", &t, root, 0, &req));
  Request guard(req);
  MP_ASSERT_OK(hora_wait(req));
  int64_t bad = 0;
  std::string first;
  for (int64_t i : samplePositions(bytes)) {
    const uint8_t got = buf.get()[i], want = pattern(i, root);
    if (got != want && bad++ == 0)
      first = "byte " + std::to_string(i) + ": got " + std::to_string(got) + ", expected " + std::to_string(want);
  }
  EXPECT_EQ(0, bad) << "broadcast of " << bytes << " bytes: " << bad << " sampled bytes wrong, first " << first;
}

TEST(Large, AllgatherPast2GiB) {
  const int r = mp::rank(), n = mp::size();
  if (n > 2) GTEST_SKIP() << "sized for at most 2 ranks on one host";
  // 1.1 GiB per rank as [rows, 1024] bytes: the gathered 2.2 GiB is past 2^31 at two ranks.
  const int64_t cols = 1024;
  const int64_t rows = 1126400;
  const int64_t bytes = rows * cols;
  Buffer in = allocate(bytes);
  if (!in) GTEST_SKIP() << "could not allocate " << bytes << " bytes";
  fillPattern(in.get(), bytes, r);
  int64_t shape[2] = {rows, cols};
  DLTensor t = bytesTensor(in.get(), shape, 2);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allgather_async("large.ag", &t, 0, &req));
  Request guard(req);
  const hora_status_t s = hora_wait(req);
  if (s != HORA_SUCCESS && std::string(mp::lastError()).find("alloc") != std::string::npos)
    GTEST_SKIP() << "the runtime could not allocate the output: " << mp::lastError();
  MP_ASSERT_OK(s);
  const DLTensor *out = hora_request_output(req);
  ASSERT_NE(nullptr, out);
  ASSERT_EQ(2, out->ndim);
  ASSERT_EQ(rows * n, out->shape[0]);
  ASSERT_EQ(cols, out->shape[1]);
  const uint8_t *o = static_cast<const uint8_t *>(out->data) + out->byte_offset;
  int64_t bad = 0;
  std::string first;
  for (int64_t i : samplePositions(bytes * n)) {
    const int q = static_cast<int>(i / bytes);  // rank the byte came from
    const uint8_t got = o[i], want = pattern(i - q * bytes, q);
    if (got != want && bad++ == 0)
      first = "byte " + std::to_string(i) + " (rank " + std::to_string(q) + "): got " + std::to_string(got) +
              ", expected " + std::to_string(want);
  }
  EXPECT_EQ(0, bad) << "allgather of " << bytes << " bytes per rank: " << bad << " sampled bytes wrong, first "
                    << first;
}

}  // namespace
