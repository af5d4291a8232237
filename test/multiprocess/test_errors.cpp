// SPDX-License-Identifier: Apache-2.0
// Error paths: cross-rank mismatches, duplicate names, bad arguments; the runtime survives each.
#include <hora/hora.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mp_harness.h"

namespace {

using mp::DType;
using mp::HostTensor;
using mp::makeTensor;
using mp::Request;

const DType &f32() { return mp::dtypeNamed("float32"); }

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// A collective every rank agrees on; proves the runtime is still usable. Reusing the name of
// an op that just failed also proves that name was released.
void expectGoodAllreduce(const std::string &name, int64_t salt) {
  auto t = makeTensor(f32(), {16});
  mp::fillInput(*t, HORA_OP_SUM, salt);
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async(name.c_str(), t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req))
      << "runtime unusable after an error";
  Request guard(req);
  MP_ASSERT_OK(hora_wait(req)) << name;
  EXPECT_TRUE(mp::matchesReduction(*t, HORA_OP_SUM, salt, 1.0, 1.0)) << name;
}

// Every rank calls it; `odd` is true on rank 1 only, which submits a different value of one
// field. The op must fail with MISMATCH on every rank, with a message that names the tensor and
// (one of) the words for the field; then good ops, one reusing the name, must work. With one
// rank there is nobody to disagree with, so only the good op runs.
using Submit = std::function<hora_status_t(bool odd, hora_request_t *req)>;

void expectMismatch(const std::string &name, const std::vector<std::string> &fieldWords,
                    const Submit &submit) {
  if (mp::size() > 1) {
    const bool odd = mp::rank() == 1;
    hora_request_t req = nullptr;
    MP_ASSERT_OK(submit(odd, &req)) << name << ": submission itself must succeed";
    Request guard(req);
    const hora_status_t s = hora_wait(req);
    const std::string err = mp::lastError();
    EXPECT_EQ(mp::statusName(HORA_ERR_MISMATCH), mp::statusName(s)) << name << ": '" << err << "'";
    EXPECT_NE(std::string::npos, err.find(name)) << "message does not name the tensor: '" << err << "'";
    // Search the message without the tensor's name, which itself contains the field's word.
    std::string rest = err;
    for (size_t at; (at = rest.find(name)) != std::string::npos;) rest.erase(at, name.size());
    const std::string low = lower(rest);
    const bool namesField = std::any_of(fieldWords.begin(), fieldWords.end(), [&](const std::string &w) {
      return low.find(w) != std::string::npos;
    });
    EXPECT_TRUE(namesField) << "message does not name the field (" << fieldWords.front() << "): '" << err << "'";
  }
  expectGoodAllreduce(name, 1);
  expectGoodAllreduce(name + ".after", 2);
}

Submit allreduceWith(const std::string &name, std::function<void(bool, DType &, std::vector<int64_t> &,
                                                                  hora_reduce_op_t &, double &, double &)>
                                                    vary) {
  return [name, vary](bool odd, hora_request_t *req) {
    DType dt = f32();
    std::vector<int64_t> shape = {4, 4};
    hora_reduce_op_t op = HORA_OP_SUM;
    double pre = 1.0, post = 1.0;
    vary(odd, dt, shape, op, pre, post);
    // Leaked for the duration of the process: freed requests may still reference it.
    HostTensor *t = new HostTensor(dt, shape);
    mp::fillInput(*t, HORA_OP_SUM, 3);
    return hora_allreduce_async(name.c_str(), t->dl(), t->dl(), op, pre, post, 0, req);
  };
}

TEST(Mismatch, Dtype) {
  expectMismatch("mm.dtype", {"dtype", "type"}, allreduceWith("mm.dtype", [](bool odd, DType &dt, auto &, auto &, auto &, auto &) {
                   if (odd) dt = mp::dtypeNamed("float64");
                 }));
}

// int32 and float32 have the same width: a byte-count check alone would miss this.
TEST(Mismatch, DtypeSameWidth) {
  expectMismatch("mm.dtype_width", {"dtype", "type"}, allreduceWith("mm.dtype_width", [](bool odd, DType &dt, auto &, auto &, auto &, auto &) {
                   if (odd) dt = mp::dtypeNamed("int32");
                 }));
}

TEST(Mismatch, Shape) {
  expectMismatch("mm.shape", {"shape"}, allreduceWith("mm.shape", [](bool odd, auto &, std::vector<int64_t> &shape, auto &, auto &, auto &) {
                   if (odd) shape = {4, 5};
                 }));
}

// Same element count, different shape: still a mismatch.
TEST(Mismatch, ShapeSameCount) {
  expectMismatch("mm.shape_count", {"shape"}, allreduceWith("mm.shape_count", [](bool odd, auto &, std::vector<int64_t> &shape, auto &, auto &, auto &) {
                   if (odd) shape = {2, 8};
                 }));
}

TEST(Mismatch, NumberOfDims) {
  expectMismatch("mm.ndim", {"shape", "dim", "rank"}, allreduceWith("mm.ndim", [](bool odd, auto &, std::vector<int64_t> &shape, auto &, auto &, auto &) {
                   if (odd) shape = {16};
                 }));
}

TEST(Mismatch, ReduceOp) {
  expectMismatch("mm.op", {"op"}, allreduceWith("mm.op", [](bool odd, auto &, auto &, hora_reduce_op_t &op, auto &, auto &) {
                   if (odd) op = HORA_OP_MAX;
                 }));
}

TEST(Mismatch, Prescale) {
  expectMismatch("mm.prescale", {"prescale", "scale"}, allreduceWith("mm.prescale", [](bool odd, auto &, auto &, auto &, double &pre, auto &) {
                   if (odd) pre = 0.5;
                 }));
}

TEST(Mismatch, Postscale) {
  expectMismatch("mm.postscale", {"postscale", "scale"}, allreduceWith("mm.postscale", [](bool odd, auto &, auto &, auto &, auto &, double &post) {
                   if (odd) post = 2.0;
                 }));
}

Submit broadcastWith(const std::string &name, const DType &dtOdd, std::vector<int64_t> shapeOdd, int rootOdd) {
  return [=](bool odd, hora_request_t *req) {
    HostTensor *t = odd ? new HostTensor(dtOdd, shapeOdd) : new HostTensor(f32(), {8});
    t->fill([](int64_t j) { return static_cast<double>(j); });
    return hora_broadcast_async(name.c_str(), t->dl(), odd ? rootOdd : 0, 0, req);
  };
}

TEST(Mismatch, BroadcastRoot) {
  expectMismatch("mm.root", {"root"}, broadcastWith("mm.root", f32(), {8}, 1));
}

TEST(Mismatch, BroadcastShape) {
  expectMismatch("mm.bc_shape", {"shape"}, broadcastWith("mm.bc_shape", f32(), {9}, 0));
}

TEST(Mismatch, BroadcastDtype) {
  expectMismatch("mm.bc_dtype", {"dtype", "type"}, broadcastWith("mm.bc_dtype", mp::dtypeNamed("int32"), {8}, 0));
}

Submit allgatherWith(const std::string &name, const DType &dtOdd, std::vector<int64_t> trailingOdd) {
  return [=](bool odd, hora_request_t *req) {
    std::vector<int64_t> shape = {mp::rank() + 1};
    const std::vector<int64_t> trailing = odd ? trailingOdd : std::vector<int64_t>{3};
    shape.insert(shape.end(), trailing.begin(), trailing.end());
    HostTensor *t = new HostTensor(odd ? dtOdd : f32(), shape);
    t->fill([](int64_t j) { return static_cast<double>(j % 50); });
    return hora_allgather_async(name.c_str(), t->dl(), 0, req);
  };
}

TEST(Mismatch, AllgatherTrailingDims) {
  expectMismatch("mm.ag_trailing", {"shape", "dim"}, allgatherWith("mm.ag_trailing", f32(), {4}));
}

TEST(Mismatch, AllgatherTrailingRank) {
  expectMismatch("mm.ag_ndim", {"shape", "dim", "rank"}, allgatherWith("mm.ag_ndim", f32(), {3, 1}));
}

TEST(Mismatch, AllgatherDtype) {
  expectMismatch("mm.ag_dtype", {"dtype", "type"}, allgatherWith("mm.ag_dtype", mp::dtypeNamed("int32"), {3}));
}

// The same name used for two different collectives.
TEST(Mismatch, CollectiveKind) {
  expectMismatch("mm.kind", {"op", "collective", "kind", "type"}, [](bool odd, hora_request_t *req) {
    HostTensor *t = new HostTensor(f32(), {8});
    mp::fillInput(*t, HORA_OP_SUM, 4);
    if (odd) return hora_broadcast_async("mm.kind", t->dl(), 0, 0, req);
    return hora_allreduce_async("mm.kind", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, req);
  });
}

// A mismatched tensor in flight with good ones: only it fails, the others (which may be fused
// with it) complete correctly.
TEST(Mismatch, AmongGoodTensors) {
  const int r = mp::rank(), n = mp::size();
  const int kGood = 10;
  std::vector<std::unique_ptr<HostTensor>> good;
  std::vector<Request> reqs;
  Request bad;
  for (int k = 0; k < kGood; ++k) {
    if (k == kGood / 2) {
      auto *t = new HostTensor(f32(), {r == 1 ? 33 : 32});  // leaked: see allreduceWith
      mp::fillInput(*t, HORA_OP_SUM, 0);
      hora_request_t req = nullptr;
      MP_EXPECT_OK(hora_allreduce_async("mm.among.bad", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
      bad.reset(req);
    }
    good.push_back(makeTensor(f32(), {32}));
    mp::fillInput(*good.back(), HORA_OP_SUM, k + 1);
    hora_request_t req = nullptr;
    const std::string name = "mm.among.good" + std::to_string(k);
    MP_EXPECT_OK(hora_allreduce_async(name.c_str(), good.back()->dl(), good.back()->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
    reqs.emplace_back(req);
  }
  if (bad) {
    const hora_status_t s = hora_wait(bad.get());
    if (n > 1)
      EXPECT_EQ(mp::statusName(HORA_ERR_MISMATCH), mp::statusName(s)) << mp::lastError();
    else
      EXPECT_EQ(mp::statusName(HORA_SUCCESS), mp::statusName(s)) << mp::lastError();
  }
  for (int k = 0; k < kGood; ++k) {
    if (!reqs[k]) continue;
    MP_EXPECT_OK(hora_wait(reqs[k].get())) << "good tensor " << k;
    EXPECT_TRUE(mp::matchesReduction(*good[k], HORA_OP_SUM, k + 1, 1.0, 1.0)) << "good tensor " << k;
  }
}

// --- duplicate names ---------------------------------------------------------------------

// A request can only complete once every rank has submitted it, so a name is provably in flight
// on the ranks that submitted it while another rank holds back. Phase 1: ranks other than 0 hold
// "dup.a" (rank 0 has not submitted it) and try it again; phase 2: rank 0 does the same with
// "dup.b". A gate allreduce between phases orders them without any other channel.
TEST(DuplicateName, SecondSubmissionFailsAndFirstCompletes) {
  const int r = mp::rank(), n = mp::size();
  auto a = makeTensor(f32(), {1000});
  auto b = makeTensor(f32(), {1000});
  auto spare = makeTensor(f32(), {1000});
  mp::fillInput(*a, HORA_OP_SUM, 11);
  mp::fillInput(*b, HORA_OP_SUM, 12);
  hora_request_t ra = nullptr, rb = nullptr;

  auto tryDuplicate = [&](const char *name) {
    hora_request_t dup = nullptr;
    const hora_status_t s =
        hora_allreduce_async(name, spare->dl(), spare->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &dup);
    const std::string err = mp::lastError();
    EXPECT_EQ(mp::statusName(HORA_ERR_DUPLICATE_NAME), mp::statusName(s)) << name << ": '" << err << "'";
    if (s == HORA_SUCCESS) hora_request_free(dup);
    EXPECT_NE(std::string::npos, err.find(name)) << "message does not name the tensor: '" << err << "'";
    // A different collective under the same name is just as much a duplicate.
    const hora_status_t s2 = hora_broadcast_async(name, spare->dl(), 0, 0, &dup);
    EXPECT_EQ(mp::statusName(HORA_ERR_DUPLICATE_NAME), mp::statusName(s2)) << name << " as broadcast";
    if (s2 == HORA_SUCCESS) hora_request_free(dup);
  };

  if (n == 1) {
    // Alone, the first request may complete before the second call; then the second is legal.
    MP_ASSERT_OK(hora_allreduce_async("dup.a", a->dl(), a->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &ra));
    Request ga(ra);
    hora_request_t dup = nullptr;
    const hora_status_t s =
        hora_allreduce_async("dup.a", spare->dl(), spare->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &dup);
    Request gd(s == HORA_SUCCESS ? dup : nullptr);
    if (s == HORA_SUCCESS) {
      int done = 0;
      MP_EXPECT_OK(hora_poll(ra, &done));
      EXPECT_EQ(1, done) << "second 'dup.a' accepted while the first was still in flight";
      MP_EXPECT_OK(hora_wait(dup));
    } else {
      EXPECT_EQ(mp::statusName(HORA_ERR_DUPLICATE_NAME), mp::statusName(s)) << mp::lastError();
    }
    MP_EXPECT_OK(hora_wait(ra));
    EXPECT_TRUE(mp::matchesReduction(*a, HORA_OP_SUM, 11, 1.0, 1.0));
    expectGoodAllreduce("dup.a", 13);
    return;
  }

  if (r != 0) {
    MP_EXPECT_OK(hora_allreduce_async("dup.a", a->dl(), a->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &ra));
    tryDuplicate("dup.a");
  }
  expectGoodAllreduce("dup.gate1", 14);
  if (r == 0) {
    MP_EXPECT_OK(hora_allreduce_async("dup.a", a->dl(), a->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &ra));
    MP_EXPECT_OK(hora_allreduce_async("dup.b", b->dl(), b->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &rb));
    tryDuplicate("dup.b");
  }
  expectGoodAllreduce("dup.gate2", 15);
  if (r != 0) {
    MP_EXPECT_OK(hora_allreduce_async("dup.b", b->dl(), b->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &rb));
  }
  Request ga(ra), gb(rb);
  if (ra) {
    MP_EXPECT_OK(hora_wait(ra));
    EXPECT_TRUE(mp::matchesReduction(*a, HORA_OP_SUM, 11, 1.0, 1.0)) << "dup.a";
  }
  if (rb) {
    MP_EXPECT_OK(hora_wait(rb));
    EXPECT_TRUE(mp::matchesReduction(*b, HORA_OP_SUM, 12, 1.0, 1.0)) << "dup.b";
  }
  // Once completed, the name is free again (the same names every training step).
  ga.reset();
  gb.reset();
  expectGoodAllreduce("dup.a", 16);
}

// --- bad arguments -----------------------------------------------------------------------

// Every case below is local to this rank and must fail at submission, so every rank runs them
// all without any collective; a case that is wrongly accepted is still the same on every rank,
// so its request is freed and completes (or fails) without hanging anyone.
void expectRejected(const std::string &what, hora_status_t s, hora_request_t req,
                    std::vector<hora_status_t> allowed = {HORA_ERR_INVALID_ARGUMENT}) {
  const std::string err = mp::lastError();
  const bool ok = std::find(allowed.begin(), allowed.end(), s) != allowed.end();
  EXPECT_TRUE(ok) << what << ": returned " << mp::statusName(s) << ", expected "
                  << mp::statusName(allowed.front()) << " ('" << err << "')";
  if (s != HORA_SUCCESS) {
    EXPECT_FALSE(err.empty()) << what << ": no hora_last_error()";
  }
  if (s == HORA_SUCCESS && req) hora_request_free(req);
}

TEST(BadArguments, AllreduceRejectsEachAtSubmission) {
  auto good = makeTensor(f32(), {4, 4});
  hora_request_t req = nullptr;

  auto ar = [&](const char *name, const DLTensor *in, DLTensor *out) {
    req = nullptr;
    return hora_allreduce_async(name, in, out, HORA_OP_SUM, 1.0, 1.0, 0, &req);
  };
  // A copy of the good tensor with one field changed; shape/strides arrays live here.
  int64_t shape[2] = {4, 4};
  auto variant = [&](const std::function<void(DLTensor &)> &change) {
    DLTensor t = *good->dl();
    shape[0] = 4;
    shape[1] = 4;
    t.shape = shape;
    change(t);
    return t;
  };

  expectRejected("NULL input", ar("bad.null_input", nullptr, good->dl()), req);
  expectRejected("NULL request_p",
                 hora_allreduce_async("bad.null_req", good->dl(), good->dl(), HORA_OP_SUM, 1.0, 1.0, 0, nullptr),
                 nullptr);
  {
    DLTensor t = variant([&](DLTensor &x) { x.shape[0] = -3; });
    expectRejected("negative dimension", ar("bad.neg_shape", &t, &t), req);
  }
  {
    DLTensor t = variant([](DLTensor &x) { x.ndim = -1; });
    expectRejected("ndim < 0", ar("bad.neg_ndim", &t, &t), req);
  }
  {
    std::vector<int64_t> ones(1000, 1);
    ones[0] = 16;
    DLTensor t = *good->dl();
    t.ndim = 1000;
    t.shape = ones.data();
    expectRejected("ndim 1000", ar("bad.huge_ndim", &t, &t), req);
  }
  {
    DLTensor t = variant([](DLTensor &x) { x.shape = nullptr; });
    expectRejected("NULL shape with ndim 2", ar("bad.null_shape", &t, &t), req);
  }
  {
    // Element counts whose byte size overflows int64.
    DLTensor t = variant([](DLTensor &x) { x.shape[0] = int64_t{1} << 40; x.shape[1] = int64_t{1} << 40; });
    expectRejected("absurd element count", ar("bad.absurd_count", &t, &t), req);
  }
  const DLDataType badTypes[] = {
      {kDLComplex, 64, 1}, {kDLFloat, 32, 2}, {kDLFloat, 24, 1},      {kDLBfloat, 32, 1},
      {kDLOpaqueHandle, 64, 1}, {kDLFloat, 0, 1}, {static_cast<uint8_t>(200), 32, 1}, {kDLFloat, 32, 0},
  };
  for (const DLDataType &dt : badTypes) {
    DLTensor t = variant([&](DLTensor &x) { x.dtype = dt; });
    const std::string what = "dtype code " + std::to_string(dt.code) + " bits " +
                             std::to_string(dt.bits) + " lanes " + std::to_string(dt.lanes);
    expectRejected(what, ar("bad.dtype", &t, &t), req);
  }
  // Real DLPack types outside the supported ten: refusing them as unsupported is also fair.
  // (6 is kDLBool, which hora takes at 8 bits only.)
  const DLDataType otherTypes[] = {{kDLUInt, 16, 1}, {kDLUInt, 32, 1}, {kDLUInt, 64, 1}, {6, 16, 1}};
  for (const DLDataType &dt : otherTypes) {
    DLTensor t = variant([&](DLTensor &x) { x.dtype = dt; });
    const std::string what = "unsupported dtype code " + std::to_string(dt.code) + " bits " +
                             std::to_string(dt.bits);
    expectRejected(what, ar("bad.dtype2", &t, &t), req, {HORA_ERR_INVALID_ARGUMENT, HORA_ERR_UNSUPPORTED});
  }
  {
    int64_t strides[2] = {1, 4};  // column-major
    DLTensor t = variant([&](DLTensor &x) { x.strides = strides; });
    expectRejected("column-major strides", ar("bad.strides_t", &t, &t), req);
  }
  {
    int64_t strides[2] = {8, 1};  // padded rows
    DLTensor t = variant([&](DLTensor &x) { x.strides = strides; });
    expectRejected("padded strides", ar("bad.strides_pad", &t, &t), req);
  }
  {
    DLTensor t = variant([](DLTensor &x) { x.device = DLDevice{kDLOpenCL, 0}; });
    expectRejected("OpenCL device", ar("bad.device", &t, &t), req,
                   {HORA_ERR_INVALID_ARGUMENT, HORA_ERR_UNSUPPORTED});
  }
  {
    DLTensor t = variant([](DLTensor &x) { x.data = nullptr; });
    expectRejected("NULL data, 16 elements", ar("bad.null_data", &t, &t), req);
  }
  for (int32_t set : {12345, -1}) {
    req = nullptr;
    expectRejected("process set " + std::to_string(set),
                   hora_allreduce_async("bad.set", good->dl(), good->dl(), HORA_OP_SUM, 1.0, 1.0, set, &req), req);
  }
  for (int op : {99, -1, 5}) {
    req = nullptr;
    expectRejected("reduce op " + std::to_string(op),
                   hora_allreduce_async("bad.op", good->dl(), good->dl(), static_cast<hora_reduce_op_t>(op),
                                        1.0, 1.0, 0, &req),
                   req);
  }
  {
    auto wrong = makeTensor(f32(), {17});
    expectRejected("output 17 elements for input 16", ar("bad.out_count", good->dl(), wrong->dl()), req);
    auto reshaped = makeTensor(f32(), {2, 8});
    expectRejected("output [2,8] for input [4,4]", ar("bad.out_shape", good->dl(), reshaped->dl()), req);
    auto wide = makeTensor(mp::dtypeNamed("float64"), {4, 4});
    expectRejected("output float64 for input float32", ar("bad.out_dtype", good->dl(), wide->dl()), req);
  }
  expectGoodAllreduce("bad.after_allreduce", 21);
}

// Names are opaque bytes up to 4096 of them: hostile ones are refused (too long, empty) or
// carried exactly (not UTF-8, control characters, quotes) through negotiation and the cache.
TEST(BadArguments, TensorNames) {
  hora_request_t req = nullptr;
  auto t = makeTensor(f32(), {8});
  const std::string huge(1 << 20, 'n');
  expectRejected("a 1 MiB name",
                 hora_allreduce_async(huge.c_str(), t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req), req);
  EXPECT_NE(mp::lastError().find("4096"), std::string::npos) << mp::lastError();
  expectRejected("an empty name", hora_allreduce_async("", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req), req);

  const std::string longest = std::string(4095, 'L') + "!";
  const std::string binary = std::string("grad\xff\xfe\x01\n\"\\", 10) + "\xc3\x28.w";
  int64_t salt = 40;
  for (int step = 0; step < 2; ++step) {  // the second step goes through the response cache
    for (const std::string &name : {longest, binary}) {
      auto x = makeTensor(f32(), {8});
      mp::fillInput(*x, HORA_OP_SUM, ++salt);
      req = nullptr;
      MP_ASSERT_OK(hora_allreduce_async(name.c_str(), x->dl(), x->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req))
          << "a " << name.size() << "-byte name";
      Request guard(req);
      MP_ASSERT_OK(hora_wait(req)) << "a " << name.size() << "-byte name";
      EXPECT_TRUE(mp::matchesReduction(*x, HORA_OP_SUM, salt, 1.0, 1.0)) << name.size();
    }
  }
  expectGoodAllreduce("names.after", 50);
}

// Data off its element alignment (through the pointer or byte_offset) is refused at submission
// with a message that says so, rather than handed to vectorised kernels.
TEST(BadArguments, MisalignedDataIsRefused) {
  std::vector<float> storage(64);
  int64_t shape[1] = {16};
  for (uint64_t skew : {1, 2, 3}) {
    DLTensor byPointer = {reinterpret_cast<unsigned char *>(storage.data()) + skew,
                          {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
    DLTensor byOffset = {storage.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, skew};
    for (DLTensor *t : {&byPointer, &byOffset}) {
      hora_request_t req = nullptr;
      expectRejected("float32 data " + std::to_string(skew) + " bytes off",
                     hora_allreduce_async("bad.misaligned", t, t, HORA_OP_SUM, 1.0, 1.0, 0, &req),
                     req);
      EXPECT_NE(mp::lastError().find("not aligned"), std::string::npos) << mp::lastError();
    }
  }
  expectGoodAllreduce("misaligned.after", 60);
}

// An output that shares memory with anything but its own input, as the same tensor, would be read
// while it is written (a fused response is reduced where it lies): refused at submission, naming
// both tensors. The same memory as input and output stays an in-place allreduce. Sizes on both
// sides of the shared-memory path's 32 KiB small-op limit.
TEST(BadArguments, OverlappingAllreduceTensorsAreRefused) {
  for (int64_t count : {int64_t{64}, int64_t{1} << 18}) {
    std::vector<float> storage(static_cast<size_t>(count) + 16);
    int64_t shape[1] = {count};
    auto at = [&](int64_t first) {
      return DLTensor{storage.data() + first, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
    };
    const std::string size = std::to_string(count) + " floats";
    for (int64_t shift : {int64_t{1}, int64_t{4}, -int64_t{3}}) {
      DLTensor in = at(shift < 0 ? -shift : 0);
      DLTensor out = at(shift < 0 ? 0 : shift);
      hora_request_t req = nullptr;
      expectRejected(size + ", output " + std::to_string(shift) + " elements from the input",
                     hora_allreduce_async("bad.overlap", &in, &out, HORA_OP_SUM, 1.0, 1.0, 0, &req),
                     req);
      const std::string err = mp::lastError();
      EXPECT_NE(err.find("'bad.overlap'"), std::string::npos) << err;
      EXPECT_NE(err.find("output overlaps input"), std::string::npos) << err;
      const std::string where = std::to_string((shift < 0 ? -shift : shift) * 4) +
                                (shift < 0 ? " bytes before" : " bytes after");
      EXPECT_NE(err.find(where), std::string::npos) << err;
    }
  }
  // In a group: output 1 over input 0, and two outputs over each other.
  // a has room for output 1 at a + 8 (32 elements): only input 0 may overlap it, whatever
  // the heap puts after a.
  std::vector<float> a(64), b(32), c(32);
  int64_t shape[1] = {32};
  auto t = [&](float *p) {
    return DLTensor{p, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  };
  {
    DLTensor ins[2] = {t(a.data()), t(b.data())};
    DLTensor outs[2] = {t(c.data()), t(a.data() + 8)};
    hora_request_t req = nullptr;
    expectRejected("grouped, output 1 over input 0",
                   hora_grouped_allreduce_async("bad.group", 2, ins, outs, HORA_OP_SUM, 1.0, 1.0,
                                                0, &req),
                   req);
    EXPECT_NE(mp::lastError().find("output 1 overlaps input 0"), std::string::npos)
        << mp::lastError();
  }
  {
    DLTensor ins[2] = {t(a.data()), t(b.data())};
    DLTensor outs[2] = {t(c.data()), t(c.data())};
    hora_request_t req = nullptr;
    expectRejected("grouped, two outputs in one place",
                   hora_grouped_allreduce_async("bad.group", 2, ins, outs, HORA_OP_SUM, 1.0, 1.0,
                                                0, &req),
                   req);
    EXPECT_NE(mp::lastError().find("overlaps output"), std::string::npos) << mp::lastError();
  }
  // Still fine: in place, a group in place, and inputs that share memory with each other.
  expectGoodAllreduce("overlap.after", 70);
  const int n = mp::size();
  {
    for (int i = 0; i < 32; ++i) a[i] = static_cast<float>(i + mp::rank());
    DLTensor ins[2] = {t(a.data()), t(a.data())};
    DLTensor outs[2] = {t(b.data()), t(c.data())};
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_grouped_allreduce_async("overlap.shared_inputs", 2, ins, outs, HORA_OP_SUM,
                                              1.0, 1.0, 0, &req));
    Request guard(req);
    MP_ASSERT_OK(hora_wait(req));
    for (int i = 0; i < 32; ++i) {
      // sum over ranks r of (i + r)
      const float expect = static_cast<float>(n * i + n * (n - 1) / 2);
      ASSERT_EQ(b[i], expect) << i;
      ASSERT_EQ(c[i], expect) << i;
    }
  }
}

TEST(BadArguments, BroadcastAndAllgatherRejectEachAtSubmission) {
  const int n = mp::size();
  auto good = makeTensor(f32(), {4, 3});
  hora_request_t req = nullptr;
  for (int root : {-1, n, n + 100}) {
    req = nullptr;
    expectRejected("broadcast root " + std::to_string(root),
                   hora_broadcast_async("bad.bc_root", good->dl(), root, 0, &req), req);
  }
  req = nullptr;
  expectRejected("broadcast NULL tensor", hora_broadcast_async("bad.bc_null", nullptr, 0, 0, &req), req);
  expectRejected("broadcast NULL request_p",
                 hora_broadcast_async("bad.bc_null_req", good->dl(), 0, 0, nullptr), nullptr);
  req = nullptr;
  expectRejected("broadcast unknown set", hora_broadcast_async("bad.bc_set", good->dl(), 0, 12345, &req), req);
  {
    DLTensor t = *good->dl();
    t.dtype = DLDataType{kDLComplex, 64, 1};
    req = nullptr;
    expectRejected("broadcast complex dtype", hora_broadcast_async("bad.bc_dtype", &t, 0, 0, &req), req);
  }
  {
    int64_t strides[2] = {1, 4};
    DLTensor t = *good->dl();
    t.strides = strides;
    req = nullptr;
    expectRejected("broadcast strided", hora_broadcast_async("bad.bc_strides", &t, 0, 0, &req), req);
  }
  req = nullptr;
  expectRejected("allgather NULL input", hora_allgather_async("bad.ag_null", nullptr, 0, &req), req);
  expectRejected("allgather NULL request_p", hora_allgather_async("bad.ag_null_req", good->dl(), 0, nullptr), nullptr);
  req = nullptr;
  expectRejected("allgather unknown set", hora_allgather_async("bad.ag_set", good->dl(), 12345, &req), req);
  {
    // A scalar has no first dimension to concatenate along.
    DLTensor t = *good->dl();
    t.ndim = 0;
    req = nullptr;
    expectRejected("allgather scalar", hora_allgather_async("bad.ag_scalar", &t, 0, &req), req);
  }
  {
    int64_t shape[2] = {-1, 3};
    DLTensor t = *good->dl();
    t.shape = shape;
    req = nullptr;
    expectRejected("allgather negative rows", hora_allgather_async("bad.ag_neg", &t, 0, &req), req);
  }
  expectGoodAllreduce("bad.after_bc_ag", 22);
}

}  // namespace
