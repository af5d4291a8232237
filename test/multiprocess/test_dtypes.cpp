// SPDX-License-Identifier: Apache-2.0
// int16 and bool through every collective: reductions checked against values computed here
// (int16 sums past int8's range and wrapping at its own; bool OR/AND truth tables over the
// ranks, with any nonzero byte true and results 0 or 1), byte-exact movement, fused batches that
// mix int16, bool and float32, refusals and mismatches.
#include <hora/hora.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mp_harness.h"
#include "mp_ops.h"

namespace {

using mp::Request;

// DLPack types, spelled out here rather than taken from the library.
constexpr DLDataType kI16{kDLInt, 16, 1};
constexpr DLDataType kI32{kDLInt, 32, 1};
constexpr DLDataType kU8{kDLUInt, 8, 1};
constexpr DLDataType kBool{6, 8, 1};  // kDLBool
constexpr DLDataType kF32{kDLFloat, 32, 1};

// A contiguous CPU tensor over a vector of T, seen by hora as `type`.
template <typename T>
struct Tensor {
  Tensor(DLDataType type, std::vector<int64_t> dims) : shape(std::move(dims)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    data.assign(static_cast<size_t>(n), T{});
    dl = DLTensor{};
    dl.data = data.data();
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = static_cast<int32_t>(shape.size());
    dl.dtype = type;
    dl.shape = shape.data();
  }
  Tensor(const Tensor &) = delete;
  Tensor &operator=(const Tensor &) = delete;
  int64_t numel() const { return static_cast<int64_t>(data.size()); }

  std::vector<T> data;
  std::vector<int64_t> shape;
  DLTensor dl;
};

// int16 wrap-around of an exact integer: the low 16 bits, as two's complement.
int16_t wrap16(int64_t v) {
  return static_cast<int16_t>(static_cast<uint16_t>(static_cast<uint64_t>(v) & 0xffffu));
}

// ---- int16 values ------------------------------------------------------------------------------
// Element j of rank r. SUM: hundreds per rank, so sums leave int8's range and stay exact in
// int16, except every 5th element, 20000 on every rank, whose sum wraps from two ranks on. MIN and
// MAX: signs alternating by rank. PRODUCT: small factors, except every 7th element, 181 on every
// rank (181^2 = 32761 fits, 181^3 wraps).
int16_t i16Input(hora_reduce_op_t op, int r, int64_t j) {
  switch (op) {
    case HORA_OP_SUM:
      return j % 5 == 4 ? int16_t{20000} : static_cast<int16_t>(100 * (r + 1) + j % 97);
    case HORA_OP_MIN:
    case HORA_OP_MAX: return static_cast<int16_t>((r % 2 ? -1 : 1) * (200 + 37 * r + j % 500));
    default: return j % 7 == 6 ? int16_t{181} : static_cast<int16_t>(j % 2 ? -(r + 1) : r + 2);
  }
}

int16_t i16Expected(hora_reduce_op_t op, int n, int64_t j) {
  int64_t acc = op == HORA_OP_PRODUCT ? 1 : 0;
  uint64_t prod = 1;
  for (int r = 0; r < n; ++r) {
    const int64_t v = i16Input(op, r, j);
    if (op == HORA_OP_SUM) acc += v;
    if (op == HORA_OP_PRODUCT) prod *= static_cast<uint64_t>(v);
    if (op == HORA_OP_MIN) acc = r == 0 ? v : std::min(acc, v);
    if (op == HORA_OP_MAX) acc = r == 0 ? v : std::max(acc, v);
  }
  if (op == HORA_OP_PRODUCT) acc = static_cast<int64_t>(prod);
  return wrap16(acc);
}

// ---- bool values -------------------------------------------------------------------------------
// Element j holds truth pattern p = j mod 2^n over the ranks: rank r's element is true when bit r
// of p is set, written as one of several nonzero bytes (1, 2, 0x80, 0xff) that all mean true.
int patterns(int n) { return 1 << n; }
uint8_t boolInput(int r, int n, int64_t j) {
  const int64_t p = j % patterns(n);
  static const uint8_t kTrue[] = {1, 2, 0x80, 0xff};
  return ((p >> r) & 1) ? kTrue[(j / patterns(n) + r) % 4] : uint8_t{0};
}
bool isOr(hora_reduce_op_t op) { return op == HORA_OP_SUM || op == HORA_OP_MAX; }
uint8_t boolExpected(hora_reduce_op_t op, int n, int64_t j) {
  const int64_t p = j % patterns(n);
  return isOr(op) ? (p != 0 ? 1 : 0) : (p == patterns(n) - 1 ? 1 : 0);
}

const hora_reduce_op_t kOps[] = {HORA_OP_SUM, HORA_OP_MIN, HORA_OP_MAX, HORA_OP_PRODUCT};

std::string where(const std::string &name, int64_t j) {
  return name + " [" + std::to_string(j) + "]";
}

// Submits and waits for one allreduce; the tensors stay the caller's.
void allreduce(const std::string &name, DLTensor *in, DLTensor *out, hora_reduce_op_t op) {
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async(name.c_str(), in, out, op, 1.0, 1.0, 0, &req)) << name;
  Request guard(req);
  MP_ASSERT_OK(hora_wait(req)) << name;
}

// ---- allreduce ---------------------------------------------------------------------------------

// 7 elements and 24000 (48 KB: the MPI backend's own ring, and several shared-memory pieces).
TEST(Int16, AllreduceEveryOp) {
  const int r = mp::rank(), n = mp::size();
  for (const int64_t count : {int64_t{7}, int64_t{24000}}) {
    for (const hora_reduce_op_t op : kOps) {
      const std::string name =
          std::string("i16.ar.") + mp::opName(op) + "." + std::to_string(count);
      Tensor<int16_t> t(kI16, {count});
      for (int64_t j = 0; j < count; ++j) t.data[static_cast<size_t>(j)] = i16Input(op, r, j);
      allreduce(name, &t.dl, &t.dl, op);
      for (int64_t j = 0; j < count; ++j) {
        ASSERT_EQ(t.data[static_cast<size_t>(j)], i16Expected(op, n, j)) << where(name, j);
      }
    }
  }
}

TEST(Int16, SumLeavesInt8RangeAndWraps) {
  const int r = mp::rank(), n = mp::size();
  // 127 + 1 per rank: past int8 from two ranks on; 32767 - 100 r: wraps from two ranks on.
  Tensor<int16_t> t(kI16, {2});
  t.data = {static_cast<int16_t>(r == 0 ? 127 : 1), static_cast<int16_t>(32767 - 100 * r)};
  allreduce("i16.wrap", &t.dl, &t.dl, HORA_OP_SUM);
  int64_t second = 0;
  for (int q = 0; q < n; ++q) second += 32767 - 100 * q;
  EXPECT_EQ(t.data[0], 127 + (n - 1));
  EXPECT_EQ(t.data[1], wrap16(second));
  if (n == 2) {
    EXPECT_EQ(t.data[1], -102);  // 32767 + 32667 = 65434 = 65536 - 102
  }
}

// Sums of 8- and 16-bit integers wrap on every path. Open MPI's own vectorised sum saturates
// them (int8 100 + 100 = 127), so the MPI backend reduces these with hora's kernels: a small
// allreduce (MPI's allreduce without shared memory) and a reducescatter (always MPI's). Rows of
// 64: Open MPI's vector loop takes 16 or 32 elements at a time (a scalar tail wraps).
TEST(NarrowIntegers, SumsWrapOnEveryPath) {
  const int n = mp::size();
  constexpr int kRow = 64;
  Tensor<int8_t> a(DLDataType{kDLInt, 8, 1}, {n, kRow});
  Tensor<uint8_t> b(kU8, {n, kRow});
  Tensor<int16_t> c(kI16, {n, kRow});
  std::fill(a.data.begin(), a.data.end(), int8_t{100});
  std::fill(b.data.begin(), b.data.end(), uint8_t{200});
  std::fill(c.data.begin(), c.data.end(), int16_t{20000});
  const auto wantA = static_cast<int8_t>(static_cast<uint8_t>((100 * n) & 0xff));
  const auto wantB = static_cast<uint8_t>((200 * n) & 0xff);
  const int16_t wantC = wrap16(20000 * n);
  for (DLTensor *t : {&a.dl, &b.dl, &c.dl}) {
    const std::string name =
        "wrap.rs." + std::to_string(t->dtype.code) + "." + std::to_string(t->dtype.bits);
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_reducescatter_async(name.c_str(), t, HORA_OP_SUM, 0, &req)) << name;
    Request guard(req);
    MP_ASSERT_OK(hora_wait(req)) << name;
    const DLTensor *o = hora_request_output(req);
    ASSERT_NE(o, nullptr) << name;
    for (int k = 0; k < kRow; ++k) {
      const double got = t == &a.dl   ? static_cast<const int8_t *>(o->data)[k]
                         : t == &b.dl ? static_cast<const uint8_t *>(o->data)[k]
                                      : static_cast<const int16_t *>(o->data)[k];
      const double want = t == &a.dl ? wantA : t == &b.dl ? wantB : wantC;
      ASSERT_EQ(got, want) << name << " [" << k << "]";
    }
  }
  allreduce("wrap.ar.int8", &a.dl, &a.dl, HORA_OP_SUM);
  allreduce("wrap.ar.uint8", &b.dl, &b.dl, HORA_OP_SUM);
  allreduce("wrap.ar.int16", &c.dl, &c.dl, HORA_OP_SUM);
  for (int64_t k = 0; k < kRow * n; ++k) {
    ASSERT_EQ(a.data[static_cast<size_t>(k)], wantA) << "wrap.ar.int8 [" << k << "]";
    ASSERT_EQ(b.data[static_cast<size_t>(k)], wantB) << "wrap.ar.uint8 [" << k << "]";
    ASSERT_EQ(c.data[static_cast<size_t>(k)], wantC) << "wrap.ar.int16 [" << k << "]";
  }
}

TEST(Bool, AllreduceTruthTablesEveryOp) {
  const int r = mp::rank(), n = mp::size();
  for (const int64_t count : {int64_t{4} * patterns(n), int64_t{40000}}) {
    for (const hora_reduce_op_t op : kOps) {
      const std::string name =
          std::string("bool.ar.") + mp::opName(op) + "." + std::to_string(count);
      Tensor<uint8_t> t(kBool, {count});
      for (int64_t j = 0; j < count; ++j) t.data[static_cast<size_t>(j)] = boolInput(r, n, j);
      allreduce(name, &t.dl, &t.dl, op);
      for (int64_t j = 0; j < count; ++j) {
        ASSERT_EQ(int(t.data[static_cast<size_t>(j)]), int(boolExpected(op, n, j)))
            << where(name, j) << " pattern " << j % patterns(n) << " over " << n << " ranks";
      }
    }
  }
}

// Out of place: the input keeps its bytes (2, 0x80, 0xff stay as they are), the output is 0/1.
TEST(Bool, AllreduceOutOfPlaceLeavesTheInput) {
  const int r = mp::rank(), n = mp::size();
  for (const hora_reduce_op_t op : {HORA_OP_MAX, HORA_OP_MIN}) {
    const std::string name = std::string("bool.oop.") + mp::opName(op);
    const int64_t count = 8 * patterns(n) + 3;
    Tensor<uint8_t> in(kBool, {count}), out(kBool, {count});
    for (int64_t j = 0; j < count; ++j) in.data[static_cast<size_t>(j)] = boolInput(r, n, j);
    std::fill(out.data.begin(), out.data.end(), uint8_t{0x5a});
    const std::vector<uint8_t> before = in.data;
    allreduce(name, &in.dl, &out.dl, op);
    EXPECT_EQ(in.data, before) << name << ": input changed";
    for (int64_t j = 0; j < count; ++j) {
      ASSERT_EQ(int(out.data[static_cast<size_t>(j)]), int(boolExpected(op, n, j)))
          << where(name, j);
    }
  }
}

TEST(Grouped, Int16AndBool) {
  const int r = mp::rank(), n = mp::size();
  const int64_t sizes[] = {3, 1000, 17};
  {
    std::vector<std::unique_ptr<Tensor<int16_t>>> ts;
    std::vector<DLTensor> dls;
    for (const int64_t s : sizes) {
      ts.push_back(std::make_unique<Tensor<int16_t>>(kI16, std::vector<int64_t>{s}));
      for (int64_t j = 0; j < s; ++j)
        ts.back()->data[static_cast<size_t>(j)] = i16Input(HORA_OP_SUM, r, j);
      dls.push_back(ts.back()->dl);
    }
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_grouped_allreduce_async("grp.i16", 3, dls.data(), dls.data(), HORA_OP_SUM,
                                              1.0, 1.0, 0, &req));
    Request guard(req);
    MP_ASSERT_OK(hora_wait(req));
    for (size_t t = 0; t < ts.size(); ++t) {
      for (int64_t j = 0; j < sizes[t]; ++j) {
        ASSERT_EQ(ts[t]->data[static_cast<size_t>(j)], i16Expected(HORA_OP_SUM, n, j))
            << "tensor " << t << " [" << j << "]";
      }
    }
  }
  for (const hora_reduce_op_t op : {HORA_OP_SUM, HORA_OP_PRODUCT}) {
    std::vector<std::unique_ptr<Tensor<uint8_t>>> ts;
    std::vector<DLTensor> dls;
    for (const int64_t s : sizes) {
      ts.push_back(std::make_unique<Tensor<uint8_t>>(kBool, std::vector<int64_t>{s}));
      for (int64_t j = 0; j < s; ++j) ts.back()->data[static_cast<size_t>(j)] = boolInput(r, n, j);
      dls.push_back(ts.back()->dl);
    }
    const std::string name = std::string("grp.bool.") + mp::opName(op);
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_grouped_allreduce_async(name.c_str(), 3, dls.data(), dls.data(), op, 1.0, 1.0,
                                              0, &req));
    Request guard(req);
    MP_ASSERT_OK(hora_wait(req));
    for (size_t t = 0; t < ts.size(); ++t) {
      for (int64_t j = 0; j < sizes[t]; ++j) {
        ASSERT_EQ(int(ts[t]->data[static_cast<size_t>(j)]), int(boolExpected(op, n, j)))
            << name << " tensor " << t << " [" << j << "]";
      }
    }
  }
}

// ---- reducescatter -----------------------------------------------------------------------------

// 2n + 1 rows of 3: uneven blocks (rank 0 one row more).
TEST(Int16, ReducescatterEveryOp) {
  const int r = mp::rank(), n = mp::size();
  const int64_t rows = 2 * n + 1;
  for (const hora_reduce_op_t op : kOps) {
    const std::string name = std::string("i16.rs.") + mp::opName(op);
    Tensor<int16_t> t(kI16, {rows, 3});
    for (int64_t j = 0; j < t.numel(); ++j) t.data[static_cast<size_t>(j)] = i16Input(op, r, j);
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_reducescatter_async(name.c_str(), &t.dl, op, 0, &req)) << name;
    Request guard(req);
    MP_ASSERT_OK(hora_wait(req)) << name;
    const DLTensor *o = hora_request_output(req);
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(o->dtype.code, kDLInt);
    EXPECT_EQ(o->dtype.bits, 16);
    ASSERT_EQ(o->ndim, 2);
    ASSERT_EQ(o->shape[0], mp::blockRows(rows, n, r));
    const auto *got = static_cast<const int16_t *>(o->data);
    const int64_t first = mp::blockStart(rows, n, r) * 3;
    for (int64_t k = 0; k < o->shape[0] * 3; ++k) {
      ASSERT_EQ(got[k], i16Expected(op, n, first + k)) << where(name, first + k);
    }
  }
}

TEST(Bool, ReducescatterEveryOp) {
  const int r = mp::rank(), n = mp::size();
  const int64_t rows = 2 * n + 1, cols = patterns(n);
  for (const hora_reduce_op_t op : kOps) {
    const std::string name = std::string("bool.rs.") + mp::opName(op);
    Tensor<uint8_t> t(kBool, {rows, cols});
    for (int64_t j = 0; j < t.numel(); ++j) t.data[static_cast<size_t>(j)] = boolInput(r, n, j);
    const std::vector<uint8_t> before = t.data;
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_reducescatter_async(name.c_str(), &t.dl, op, 0, &req)) << name;
    Request guard(req);
    MP_ASSERT_OK(hora_wait(req)) << name;
    EXPECT_EQ(t.data, before) << name << ": input changed";
    const DLTensor *o = hora_request_output(req);
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(o->dtype.code, 6) << "kDLBool";
    EXPECT_EQ(o->dtype.bits, 8);
    ASSERT_EQ(o->shape[0], mp::blockRows(rows, n, r));
    const auto *got = static_cast<const uint8_t *>(o->data);
    const int64_t first = mp::blockStart(rows, n, r) * cols;
    for (int64_t k = 0; k < o->shape[0] * cols; ++k) {
      ASSERT_EQ(int(got[k]), int(boolExpected(op, n, first + k))) << where(name, first + k);
    }
  }
}

// ---- movement: broadcast, allgather, alltoall (bytes as they are) -------------------------------

TEST(Int16AndBool, BroadcastFromEveryRoot) {
  const int r = mp::rank(), n = mp::size();
  for (int root = 0; root < n; ++root) {
    Tensor<int16_t> a(kI16, {5, 2});
    Tensor<uint8_t> b(kBool, {9});
    for (int64_t j = 0; j < a.numel(); ++j)
      a.data[static_cast<size_t>(j)] = static_cast<int16_t>(r == root ? -1000 * (j + 1) + root : 7);
    for (int64_t j = 0; j < b.numel(); ++j)
      b.data[static_cast<size_t>(j)] = r == root ? boolInput(root, n, j + 1) : 0x33;
    const std::string na = "bc.i16." + std::to_string(root), nb = "bc.bool." + std::to_string(root);
    hora_request_t ra = nullptr, rb = nullptr;
    MP_ASSERT_OK(hora_broadcast_async(na.c_str(), &a.dl, root, 0, &ra));
    Request ga(ra);
    MP_ASSERT_OK(hora_broadcast_async(nb.c_str(), &b.dl, root, 0, &rb));
    Request gb(rb);
    MP_ASSERT_OK(hora_wait(ra));
    MP_ASSERT_OK(hora_wait(rb));
    for (int64_t j = 0; j < a.numel(); ++j)
      ASSERT_EQ(a.data[static_cast<size_t>(j)], -1000 * (j + 1) + root) << where(na, j);
    // Movement copies bytes: a true 0x80 arrives as 0x80.
    for (int64_t j = 0; j < b.numel(); ++j)
      ASSERT_EQ(b.data[static_cast<size_t>(j)], boolInput(root, n, j + 1)) << where(nb, j);
  }
}

// Rank q contributes q + 1 rows of 3; the output is every rank's rows in rank order.
TEST(Int16AndBool, AllgatherUnevenRows) {
  const int r = mp::rank(), n = mp::size();
  auto i16Value = [](int q, int64_t k) { return static_cast<int16_t>(300 * (q + 1) - 7 * k); };
  auto boolValue = [](int q, int64_t k) {
    return static_cast<uint8_t>((q + k) % 3 == 0 ? 0 : (q + k) % 3 == 1 ? 1 : 0xff);
  };
  Tensor<int16_t> a(kI16, {r + 1, 3});
  Tensor<uint8_t> b(kBool, {r + 1, 3});
  for (int64_t k = 0; k < a.numel(); ++k) {
    a.data[static_cast<size_t>(k)] = i16Value(r, k);
    b.data[static_cast<size_t>(k)] = boolValue(r, k);
  }
  hora_request_t ra = nullptr, rb = nullptr;
  MP_ASSERT_OK(hora_allgather_async("ag.i16", &a.dl, 0, &ra));
  Request ga(ra);
  MP_ASSERT_OK(hora_allgather_async("ag.bool", &b.dl, 0, &rb));
  Request gb(rb);
  MP_ASSERT_OK(hora_wait(ra));
  MP_ASSERT_OK(hora_wait(rb));
  const DLTensor *oa = hora_request_output(ra), *ob = hora_request_output(rb);
  ASSERT_NE(oa, nullptr);
  ASSERT_NE(ob, nullptr);
  EXPECT_EQ(oa->dtype.code, kDLInt);
  EXPECT_EQ(oa->dtype.bits, 16);
  EXPECT_EQ(ob->dtype.code, 6);
  EXPECT_EQ(ob->dtype.bits, 8);
  ASSERT_EQ(oa->shape[0], n * (n + 1) / 2);
  ASSERT_EQ(ob->shape[0], n * (n + 1) / 2);
  const auto *ga16 = static_cast<const int16_t *>(oa->data);
  const auto *gbool = static_cast<const uint8_t *>(ob->data);
  int64_t at = 0;
  for (int q = 0; q < n; ++q) {
    for (int64_t k = 0; k < (q + 1) * 3; ++k, ++at) {
      ASSERT_EQ(ga16[at], i16Value(q, k)) << "rank " << q << " element " << k;
      ASSERT_EQ(gbool[at], boolValue(q, k)) << "rank " << q << " element " << k;
    }
  }
}

// Rank s sends (s + d) % 3 rows of 2 to rank d; row k of that block holds a value naming s, d, k.
TEST(Int16AndBool, AlltoallUnevenSplits) {
  const int r = mp::rank(), n = mp::size();
  auto split = [](int s, int d) { return int64_t{(s + d) % 3}; };
  auto i16Value = [](int s, int d, int64_t k) {
    return static_cast<int16_t>(-(1000 * s + 100 * d + k) - 129);
  };
  auto boolValue = [](int s, int d, int64_t k) {
    return static_cast<uint8_t>((s + 2 * d + k) % 2 ? 0x80 : 0);
  };
  std::vector<int64_t> splits;
  int64_t rows = 0;
  for (int d = 0; d < n; ++d) {
    splits.push_back(split(r, d));
    rows += split(r, d);
  }
  Tensor<int16_t> a(kI16, {rows, 2});
  Tensor<uint8_t> b(kBool, {rows, 2});
  int64_t at = 0;
  for (int d = 0; d < n; ++d) {
    for (int64_t k = 0; k < 2 * split(r, d); ++k, ++at) {
      a.data[static_cast<size_t>(at)] = i16Value(r, d, k);
      b.data[static_cast<size_t>(at)] = boolValue(r, d, k);
    }
  }
  hora_request_t ra = nullptr, rb = nullptr;
  MP_ASSERT_OK(hora_alltoall_async("a2a.i16", &a.dl, splits.data(), 0, &ra));
  Request ga(ra);
  MP_ASSERT_OK(hora_alltoall_async("a2a.bool", &b.dl, splits.data(), 0, &rb));
  Request gb(rb);
  MP_ASSERT_OK(hora_wait(ra));
  MP_ASSERT_OK(hora_wait(rb));
  const DLTensor *oa = hora_request_output(ra), *ob = hora_request_output(rb);
  ASSERT_NE(oa, nullptr);
  ASSERT_NE(ob, nullptr);
  EXPECT_EQ(ob->dtype.code, 6);
  const auto *ga16 = static_cast<const int16_t *>(oa->data);
  const auto *gbool = static_cast<const uint8_t *>(ob->data);
  at = 0;
  for (int s = 0; s < n; ++s) {
    for (int64_t k = 0; k < 2 * split(s, r); ++k, ++at) {
      ASSERT_EQ(ga16[at], i16Value(s, r, k)) << "from rank " << s << " element " << k;
      ASSERT_EQ(gbool[at], boolValue(s, r, k)) << "from rank " << s << " element " << k;
    }
  }
  ASSERT_EQ(oa->shape[0], at / 2);
}

// ---- a fused batch mixing dtypes ---------------------------------------------------------------

// Allreduces of int16, bool and float32 and allgathers of all three, submitted together before
// any wait: the engine fuses what shares a dtype and op and keeps the rest apart.
TEST(Mixed, FusedBatchOfInt16BoolAndFloat32) {
  const int r = mp::rank(), n = mp::size();
  constexpr int kEach = 3;
  std::vector<std::unique_ptr<Tensor<int16_t>>> i16s;
  std::vector<std::unique_ptr<Tensor<uint8_t>>> bools;
  std::vector<std::unique_ptr<Tensor<float>>> floats;
  std::vector<std::unique_ptr<Tensor<int16_t>>> gi16;
  std::vector<std::unique_ptr<Tensor<uint8_t>>> gbool;
  std::vector<std::unique_ptr<Tensor<float>>> gf32;
  std::vector<Request> reqs;
  std::vector<hora_request_t> raw;
  // `req` by address: read after the call has set it, whatever order the arguments go in.
  auto submitted = [&](hora_status_t s, const hora_request_t *reqp, const std::string &name) {
    const hora_request_t req = *reqp;
    MP_EXPECT_OK(s) << name;
    raw.push_back(s == HORA_SUCCESS ? req : nullptr);
    reqs.emplace_back(s == HORA_SUCCESS ? req : nullptr);
  };
  for (int i = 0; i < kEach; ++i) {
    const int64_t len = 5 + 40 * i;
    i16s.push_back(std::make_unique<Tensor<int16_t>>(kI16, std::vector<int64_t>{len}));
    bools.push_back(std::make_unique<Tensor<uint8_t>>(kBool, std::vector<int64_t>{len}));
    floats.push_back(std::make_unique<Tensor<float>>(kF32, std::vector<int64_t>{len}));
    for (int64_t j = 0; j < len; ++j) {
      i16s.back()->data[static_cast<size_t>(j)] = i16Input(HORA_OP_SUM, r, j + i);
      bools.back()->data[static_cast<size_t>(j)] = boolInput(r, n, j + i);
      floats.back()->data[static_cast<size_t>(j)] =
          0.5f * static_cast<float>(r + 1) + static_cast<float>(j);
    }
    gi16.push_back(std::make_unique<Tensor<int16_t>>(kI16, std::vector<int64_t>{r + 1}));
    gbool.push_back(std::make_unique<Tensor<uint8_t>>(kBool, std::vector<int64_t>{r + 1}));
    gf32.push_back(std::make_unique<Tensor<float>>(kF32, std::vector<int64_t>{r + 1}));
    std::fill(gi16.back()->data.begin(), gi16.back()->data.end(),
              static_cast<int16_t>(-500 * (r + 1) - i));
    std::fill(gbool.back()->data.begin(), gbool.back()->data.end(),
              static_cast<uint8_t>((r + i) % 2));
    std::fill(gf32.back()->data.begin(), gf32.back()->data.end(),
              1.25f * static_cast<float>(r) + static_cast<float>(i));
  }
  for (int i = 0; i < kEach; ++i) {
    const std::string s = std::to_string(i);
    hora_request_t q = nullptr;
    submitted(hora_allreduce_async(("mix.i16." + s).c_str(), &i16s[i]->dl, &i16s[i]->dl,
                                   HORA_OP_SUM, 1.0, 1.0, 0, &q),
              &q, "mix.i16." + s);
    submitted(hora_allreduce_async(("mix.bool." + s).c_str(), &bools[i]->dl, &bools[i]->dl,
                                   HORA_OP_SUM, 1.0, 1.0, 0, &q),
              &q, "mix.bool." + s);
    submitted(hora_allreduce_async(("mix.f32." + s).c_str(), &floats[i]->dl, &floats[i]->dl,
                                   HORA_OP_SUM, 1.0, 1.0, 0, &q),
              &q, "mix.f32." + s);
    submitted(hora_allgather_async(("mixg.i16." + s).c_str(), &gi16[i]->dl, 0, &q), &q,
              "mixg.i16." + s);
    submitted(hora_allgather_async(("mixg.bool." + s).c_str(), &gbool[i]->dl, 0, &q), &q,
              "mixg.bool." + s);
    submitted(hora_allgather_async(("mixg.f32." + s).c_str(), &gf32[i]->dl, 0, &q), &q,
              "mixg.f32." + s);
  }
  for (hora_request_t q : raw) {
    if (q != nullptr) {
      MP_EXPECT_OK(hora_wait(q));
    }
  }
  if (HasFailure()) return;
  for (int i = 0; i < kEach; ++i) {
    for (int64_t j = 0; j < i16s[i]->numel(); ++j) {
      ASSERT_EQ(i16s[i]->data[static_cast<size_t>(j)], i16Expected(HORA_OP_SUM, n, j + i))
          << "mix.i16." << i << " [" << j << "]";
      ASSERT_EQ(int(bools[i]->data[static_cast<size_t>(j)]),
                int(boolExpected(HORA_OP_SUM, n, j + i)))
          << "mix.bool." << i << " [" << j << "]";
      // 0.5 (1 + ... + n) + n j: exact in float32.
      ASSERT_EQ(floats[i]->data[static_cast<size_t>(j)],
                0.25f * static_cast<float>(n * (n + 1)) + static_cast<float>(n * j))
          << "mix.f32." << i << " [" << j << "]";
    }
    const size_t base = static_cast<size_t>(6 * i);
    const DLTensor *oi = hora_request_output(raw[base + 3]);
    const DLTensor *ob = hora_request_output(raw[base + 4]);
    const DLTensor *of = hora_request_output(raw[base + 5]);
    ASSERT_TRUE(oi != nullptr && ob != nullptr && of != nullptr);
    ASSERT_EQ(oi->shape[0], n * (n + 1) / 2);
    ASSERT_EQ(ob->shape[0], n * (n + 1) / 2);
    ASSERT_EQ(of->shape[0], n * (n + 1) / 2);
    int64_t at = 0;
    for (int q = 0; q < n; ++q) {
      for (int k = 0; k <= q; ++k, ++at) {
        ASSERT_EQ(static_cast<const int16_t *>(oi->data)[at], -500 * (q + 1) - i)
            << "mixg.i16." << i;
        ASSERT_EQ(static_cast<const uint8_t *>(ob->data)[at], (q + i) % 2) << "mixg.bool." << i;
        ASSERT_EQ(static_cast<const float *>(of->data)[at],
                  1.25f * static_cast<float>(q) + static_cast<float>(i))
            << "mixg.f32." << i;
      }
    }
  }
}

// ---- refusals and mismatches -------------------------------------------------------------------

void expectUnsupported(const std::string &name, hora_status_t s, hora_request_t req,
                       const std::vector<std::string> &words) {
  const std::string err = mp::lastError();
  EXPECT_EQ(mp::statusName(HORA_ERR_UNSUPPORTED), mp::statusName(s)) << name << ": '" << err << "'";
  if (s == HORA_SUCCESS) {
    hora_request_free(req);
    return;
  }
  for (const std::string &w : words)
    EXPECT_NE(err.find(w), std::string::npos) << name << ": '" << err << "' lacks '" << w << "'";
}

TEST(Refused, AverageAndScaleFactors) {
  Tensor<uint8_t> b(kBool, {4});
  Tensor<int16_t> a(kI16, {2, 2});
  hora_request_t req = nullptr;
  expectUnsupported(
      "ref.bool.avg",
      hora_allreduce_async("ref.bool.avg", &b.dl, &b.dl, HORA_OP_AVERAGE, 1.0, 1.0, 0, &req), req,
      {"allreduce", "ref.bool.avg", "AVERAGE", "bool"});
  req = nullptr;
  expectUnsupported(
      "ref.bool.pre",
      hora_allreduce_async("ref.bool.pre", &b.dl, &b.dl, HORA_OP_SUM, 2.0, 1.0, 0, &req), req,
      {"ref.bool.pre", "bool", "prescale"});
  req = nullptr;
  expectUnsupported("ref.bool.post",
                    hora_grouped_allreduce_async("ref.bool.post", 1, &b.dl, &b.dl, HORA_OP_MAX, 1.0,
                                                 0.5, 0, &req),
                    req, {"ref.bool.post", "bool", "postscale"});
  req = nullptr;
  Tensor<uint8_t> rows(kBool, {mp::size(), 2});
  expectUnsupported("ref.bool.rs",
                    hora_reducescatter_async("ref.bool.rs", &rows.dl, HORA_OP_AVERAGE, 0, &req),
                    req, {"reducescatter", "ref.bool.rs", "AVERAGE", "bool"});
  req = nullptr;
  expectUnsupported(
      "ref.i16.avg",
      hora_allreduce_async("ref.i16.avg", &a.dl, &a.dl, HORA_OP_AVERAGE, 1.0, 1.0, 0, &req), req,
      {"ref.i16.avg", "AVERAGE", "int16"});
  req = nullptr;
  expectUnsupported(
      "ref.i16.post",
      hora_allreduce_async("ref.i16.post", &a.dl, &a.dl, HORA_OP_SUM, 1.0, 3.0, 0, &req), req,
      {"ref.i16.post", "int16"});
  mp::expectGoodAllreduce("ref.after", 5);
}

// A bool tensor against uint8 (the same bytes) and int16 against int32 of the same name: a
// mismatch on every rank, naming the tensor; the runtime keeps working.
TEST(Mismatch, BoolIsNotUint8AndInt16IsNotInt32) {
  const int r = mp::rank(), n = mp::size();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  {
    Tensor<uint8_t> t(r == 0 ? kBool : kU8, {4});
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_allreduce_async("mm.bool", &t.dl, &t.dl, HORA_OP_MAX, 1.0, 1.0, 0, &req));
    Request guard(req);
    mp::expectMismatchAtWait(req, "mm.bool");
  }
  {
    Tensor<int32_t> wide(kI32, {3});
    Tensor<int16_t> narrow(kI16, {3});
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_allgather_async("mm.i16", r == 0 ? &narrow.dl : &wide.dl, 0, &req));
    Request guard(req);
    mp::expectMismatchAtWait(req, "mm.i16");
  }
  mp::expectGoodAllreduce("mm.after", 6);
}

}  // namespace
