// SPDX-License-Identifier: Apache-2.0
// CUDA tensors through the NCCL backend, each rank on a GPU of its own: allreduce (every dtype x
// op, in place and out of place, scaled, grouped through the fusion buffer, many in flight),
// broadcast from every root, allgather / alltoall / reducescatter with uneven blocks and outputs
// that hora allocates on the device, and ordering after the caller's stream
// (hora_cuda_set_stream). Results are copied back to the host and checked against values the
// test computes itself (mp_harness). Where a host has fewer GPUs than ranks these tests skip;
// the refusal of a CUDA tensor by a process that sees no GPU (or not that ordinal) runs anyway.
#include <hora/hora.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mp_cases.h"
#include "mp_harness.h"
#include "mp_ops.h"

// A CUDA runtime call that must succeed; the failure names the call and CUDA's error.
#define CUDA_ASSERT_OK(expr)                                                                 \
  do {                                                                                       \
    const cudaError_t cuda_status_ = (expr);                                                 \
    ASSERT_EQ(cudaSuccess, cuda_status_) << #expr << ": " << cudaGetErrorName(cuda_status_) \
                                         << " (" << cudaGetErrorString(cuda_status_) << ")"; \
  } while (0)
// The same where returning is not an option (destructors).
#define CUDA_EXPECT_OK(expr)                                                                 \
  do {                                                                                       \
    const cudaError_t cuda_status_ = (expr);                                                 \
    EXPECT_EQ(cudaSuccess, cuda_status_) << #expr << ": " << cudaGetErrorName(cuda_status_) \
                                         << " (" << cudaGetErrorString(cuda_status_) << ")"; \
  } while (0)

namespace {

using mp::DType;
using mp::HostTensor;
using mp::makeTensor;

// GPUs this process sees; 0 when there is no device or no driver.
int gpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // not sticky, but cleared so that no later check reports it
    return 0;
  }
  return n;
}

// Whether `ok` holds on every rank (a CPU allreduce, MIN). Ranks must skip together: one that
// went on would wait forever for one that skipped. On one host they all see the same GPUs
// anyway; across hosts they need not.
bool onEveryRank(bool ok) {
  auto vote = makeTensor(mp::i32(), {1});
  vote->set(0, ok ? 1.0 : 0.0);
  hora_request_t req = nullptr;
  if (hora_allreduce_async("gpu.vote", vote->dl(), vote->dl(), HORA_OP_MIN, 1.0, 1.0, 0, &req) !=
      HORA_SUCCESS) {
    ADD_FAILURE() << "gpu.vote: allreduce refused: " << mp::lastError();
    return false;
  }
  mp::Request guard(req);
  if (hora_wait(req) != HORA_SUCCESS) {
    ADD_FAILURE() << "gpu.vote: allreduce failed: " << mp::lastError();
    return false;
  }
  return vote->get(0) == 1.0;
}

std::vector<int64_t> shapeOf(const DLTensor &t) {
  return std::vector<int64_t>(t.shape, t.shape + t.ndim);
}

// A contiguous tensor in device memory of one GPU, described as a kDLCUDA DLTensor. Like
// HostTensor neither copyable nor movable: its DLTensor points into it, and the runtime keeps
// that pointer while a request is in flight. The constructors' CUDA errors are kept in status()
// for the test to assert on. The host never touches data(): it only passes it to CUDA.
class DeviceTensor {
 public:
  DeviceTensor(const DType &dt, std::vector<int64_t> shape, int device)
      : dt_(dt), shape_(std::move(shape)), device_(device) {
    for (int64_t s : shape_) numel_ *= s;
    status_ = cudaSetDevice(device_);
    // Never 0 bytes: an empty tensor keeps a real pointer, as HostTensor's does.
    if (status_ == cudaSuccess) status_ = cudaMalloc(&data_, std::max<size_t>(bytes(), 1));
    dl_.data = data_;
    dl_.device = DLDevice{kDLCUDA, device_};
    dl_.ndim = static_cast<int32_t>(shape_.size());
    dl_.dtype = dt_.dl();
    dl_.shape = shape_.data();
    dl_.strides = nullptr;
    dl_.byte_offset = 0;
  }
  // Room for `host`'s dtype and shape, with `host` copied in.
  DeviceTensor(const HostTensor &host, int device)
      : DeviceTensor(host.dtype(), shapeOf(*host.dl()), device) {
    if (status_ == cudaSuccess) status_ = upload(host);
  }
  ~DeviceTensor() {
    if (data_ == nullptr) return;
    CUDA_EXPECT_OK(cudaSetDevice(device_));
    CUDA_EXPECT_OK(cudaFree(data_));
  }
  DeviceTensor(const DeviceTensor &) = delete;
  DeviceTensor &operator=(const DeviceTensor &) = delete;

  cudaError_t status() const { return status_; }
  DLTensor *dl() { return &dl_; }
  void *data() const { return data_; }
  int64_t numel() const { return numel_; }
  size_t bytes() const { return static_cast<size_t>(numel_) * dt_.bytes(); }

  // Synchronous copies of the whole tensor; `host` must have as many elements of the same width.
  cudaError_t upload(const HostTensor &host) {
    if (host.numel() != numel_ || host.dtype().bits != dt_.bits) return cudaErrorInvalidValue;
    const char *src = static_cast<const char *>(host.dl()->data) + host.dl()->byte_offset;
    return cudaMemcpy(data_, src, bytes(), cudaMemcpyHostToDevice);
  }
  cudaError_t download(HostTensor &host) const {
    if (host.numel() != numel_ || host.dtype().bits != dt_.bits) return cudaErrorInvalidValue;
    char *dst = static_cast<char *>(host.dl()->data) + host.dl()->byte_offset;
    return cudaMemcpy(dst, data_, bytes(), cudaMemcpyDeviceToHost);
  }

  // A tensor of `shape` inside this one, starting `offset` elements in: through the data pointer,
  // or through DLPack's byte_offset. `shape` must outlive the view.
  DLTensor view(int64_t offset, std::vector<int64_t> &shape, bool viaByteOffset) const {
    DLTensor v = dl_;
    v.ndim = static_cast<int32_t>(shape.size());
    v.shape = shape.data();
    const uint64_t at = static_cast<uint64_t>(offset) * dt_.bytes();
    if (viaByteOffset)
      v.byte_offset = at;
    else
      v.data = static_cast<char *>(data_) + at;
    return v;
  }

 private:
  DType dt_;
  std::vector<int64_t> shape_;
  int device_;
  int64_t numel_ = 1;
  void *data_ = nullptr;
  cudaError_t status_ = cudaSuccess;
  DLTensor dl_{};
};

// Owns a request on CUDA tensors. On scope exit it waits for the request before freeing it:
// hora_request_free alone lets an in-flight request finish later, and the device memory it
// works on (declared before the guard, so freed after it) must not go away under the runtime's
// stream. hora_wait on a completed request returns at once.
struct WaitingDeleter {
  void operator()(hora_request *r) const {
    hora_wait(r);
    hora_request_free(r);
  }
};
using DeviceRequest = std::unique_ptr<hora_request, WaitingDeleter>;

// Checks an output hora allocated (allgather, alltoall, reducescatter): dtype, shape, compact,
// in device memory of this rank's GPU; then copies it into `*host`.
void fetchOutput(const DLTensor *out, const DType &dt, const std::vector<int64_t> &shape,
                 int device, const std::string &name, std::unique_ptr<HostTensor> *host) {
  ASSERT_NE(nullptr, out) << name << ": no output";
  EXPECT_EQ(dt.code, out->dtype.code) << name;
  EXPECT_EQ(dt.bits, out->dtype.bits) << name;
  EXPECT_EQ(1, out->dtype.lanes) << name;
  ASSERT_EQ(kDLCUDA, out->device.device_type) << name << ": output not on a GPU";
  ASSERT_EQ(device, out->device.device_id) << name << ": output not on this rank's GPU";
  ASSERT_EQ(static_cast<int>(shape.size()), out->ndim) << name;
  ASSERT_NE(nullptr, out->shape) << name;
  for (size_t d = 0; d < shape.size(); ++d) {
    ASSERT_EQ(shape[d], out->shape[d]) << name << ": output dimension " << d;
  }
  if (out->strides != nullptr) {
    int64_t expect = 1;
    for (int d = out->ndim - 1; d >= 0; --d) {
      if (out->shape[d] != 1) {
        EXPECT_EQ(expect, out->strides[d]) << name << " dim " << d;
      }
      expect *= out->shape[d];
    }
  }
  const int64_t count = mp::product(shape);
  const void *data = static_cast<const char *>(out->data) + out->byte_offset;
  if (count > 0) {
    ASSERT_NE(nullptr, out->data) << name;
    // By CUDA's own account: device memory of this rank's GPU.
    cudaPointerAttributes attr{};
    CUDA_ASSERT_OK(cudaPointerGetAttributes(&attr, data));
    EXPECT_EQ(cudaMemoryTypeDevice, attr.type) << name << ": output is not device memory";
    EXPECT_EQ(device, attr.device) << name << ": output memory on another GPU";
  }
  *host = makeTensor(dt, shape);
  CUDA_ASSERT_OK(cudaMemcpy((*host)->dl()->data, data, static_cast<size_t>(count) * dt.bytes(),
                            cudaMemcpyDeviceToHost));
}

// Every GPU test runs in this fixture: it skips unless every local rank has a GPU of its own
// (NCCL refuses two ranks of one communicator on one GPU), on every host, and makes this rank's
// GPU, hora_local_rank() % gpuCount(), the current device.
template <typename Base>
class GpuFixture : public Base {
 protected:
  void SetUp() override {
    const int gpus = gpuCount();
    const int local = hora_local_size();
    if (!onEveryRank(gpus >= local)) {
      GTEST_SKIP() << "needs a GPU per rank: this rank sees " << gpus << " GPU(s) for "
                   << local << " rank(s) on its host (or another host has too few)";
    }
    device_ = hora_local_rank() % gpus;
    CUDA_ASSERT_OK(cudaSetDevice(device_));
  }

  int device_ = -1;
};
using GpuTest = GpuFixture<::testing::Test>;
template <typename P>
using GpuParamTest = GpuFixture<::testing::TestWithParam<P>>;

std::vector<std::string> floatNameList() {
  std::vector<std::string> v;
  for (const DType &d : mp::floatDTypes()) v.push_back(d.name);
  return v;
}

std::string paramName(const ::testing::TestParamInfo<std::string> &info) { return info.param; }

// --- allreduce ---------------------------------------------------------------------------

// One allreduce of 1000 elements on the device, waited for, then checked on the host: the
// result against expectedValue, an out-of-place input as it was.
void allreduceOnDevice(const std::string &name, const DType &dt, hora_reduce_op_t op,
                       bool inPlace, double pre, double post, int64_t salt, int device) {
  const std::vector<int64_t> shape = {8, 125};
  auto input = makeTensor(dt, shape);
  mp::fillInput(*input, op, salt);
  DeviceTensor in(*input, device);
  CUDA_ASSERT_OK(in.status());
  std::unique_ptr<DeviceTensor> out;
  if (!inPlace) {
    auto stale = makeTensor(dt, shape);
    stale->fill([](int64_t) { return 7.0; });
    out = std::make_unique<DeviceTensor>(*stale, device);
    CUDA_ASSERT_OK(out->status());
  }
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async(name.c_str(), in.dl(), inPlace ? in.dl() : out->dl(), op, pre,
                                    post, 0, &req))
      << name;
  DeviceRequest guard(req);
  MP_ASSERT_OK(hora_wait(req)) << name;
  auto result = makeTensor(dt, shape);
  CUDA_ASSERT_OK((inPlace ? in : *out).download(*result));
  EXPECT_TRUE(mp::matchesReduction(*result, op, salt, pre, post))
      << name << " (prescale " << pre << ", postscale " << post << ")";
  if (!inPlace) {
    auto after = makeTensor(dt, shape);
    CUDA_ASSERT_OK(in.download(*after));
    EXPECT_TRUE(mp::matches(*after, [&](int64_t j) { return input->get(j); }))
        << name << ": out-of-place allreduce modified its input";
  }
}

class GpuAllreduceMatrix : public GpuParamTest<std::string> {};

// Each op alone (so the tensor is reduced where it lies, not through the fusion buffer).
TEST_P(GpuAllreduceMatrix, EveryOpInPlaceAndOutOfPlace) {
  const DType &dt = mp::dtypeNamed(GetParam());
  int64_t salt = 0;
  for (hora_reduce_op_t op : mp::allOps()) {
    if (!dt.floating && op == HORA_OP_AVERAGE) {
      // Refused at submission for CUDA tensors too; nothing enqueued.
      DeviceTensor t(dt, {5}, device_);
      CUDA_ASSERT_OK(t.status());
      hora_request_t req = nullptr;
      const std::string name = std::string("gpu.ar.") + dt.name + ".average";
      const hora_status_t s =
          hora_allreduce_async(name.c_str(), t.dl(), t.dl(), op, 1.0, 1.0, 0, &req);
      mp::expectRejected(name, HORA_ERR_UNSUPPORTED, s, req);
      continue;
    }
    for (bool inPlace : {true, false}) {
      const std::string name = std::string("gpu.ar.") + dt.name + "." + mp::opName(op) +
                               (inPlace ? ".in" : ".out");
      allreduceOnDevice(name, dt, op, inPlace, 1.0, 1.0, ++salt, device_);
      if (HasFatalFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuAllreduceMatrix, ::testing::ValuesIn(mp::dtypeNameList()),
                         paramName);

class GpuAllreduceScaled : public GpuParamTest<std::string> {};

// Powers of two keep every value exact. (2, 0.5) multiplies to 1, which a premultiplied sum may
// fold away; (2, 0.25) does not, so applying one factor only, or one twice, changes the result.
// Sum and average take the factors in NCCL's premultiplied sum, min/max/product in kernels.
TEST_P(GpuAllreduceScaled, EveryOpPrescalePostscale) {
  const DType &dt = mp::dtypeNamed(GetParam());
  const std::pair<double, double> scales[] = {{2.0, 0.5}, {2.0, 0.25}};
  int64_t salt = 20;
  for (const auto &sc : scales) {
    for (hora_reduce_op_t op : mp::allOps()) {
      for (bool inPlace : {true, false}) {
        const std::string name = std::string("gpu.ar.scaled.") + dt.name + "." + mp::opName(op) +
                                 (inPlace ? ".in." : ".out.") + std::to_string(sc.second);
        allreduceOnDevice(name, dt, op, inPlace, sc.first, sc.second, ++salt, device_);
        if (HasFatalFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Floats, GpuAllreduceScaled, ::testing::ValuesIn(floatNameList()),
                         paramName);

// Member i of the grouped allreduce: 1 to 5000 elements, five empty members (one [0, 7]),
// some 2-D.
std::vector<int64_t> memberShape(int i) {
  if (i % 11 == 4) return {0};
  if (i == 20) return {0, 7};
  if (i == 39) return {5000};
  const int64_t count = (static_cast<int64_t>(i) * 1237) % 4999 + 1;
  if (count % 4 == 0) return {4, count / 4};
  return {count};
}

class GpuGroupedAllreduce : public GpuParamTest<std::string> {};

// 40 members of one dtype in one request: packed into the device fusion buffer by the batched
// copy kernel, reduced there (scaled where asked), unpacked. The members lie in one allocation,
// packed at element granularity with 3-element gaps, so most are not 16-byte aligned; odd
// members are addressed through byte_offset. The gaps hold a sentinel that must survive. Every
// op x scale x placement is in flight at once.
TEST_P(GpuGroupedAllreduce, FortyMembersThroughTheFusionBuffer) {
  const DType &dt = mp::dtypeNamed(GetParam());
  const int r = mp::rank(), n = mp::size();
  constexpr int kMembers = 40;
  constexpr int64_t kGap = 3;
  constexpr double kSentinel = 99.0;  // outside every inputValue and result

  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> offsets;
  int64_t total = kGap;
  for (int i = 0; i < kMembers; ++i) {
    shapes.push_back(memberShape(i));
    offsets.push_back(total);
    total += mp::product(shapes.back()) + kGap;
  }
  // Which member (or -1: a gap) and which of its elements each element of a buffer is.
  std::vector<int> owner(static_cast<size_t>(total), -1);
  std::vector<int64_t> index(static_cast<size_t>(total), 0);
  for (int i = 0; i < kMembers; ++i) {
    for (int64_t j = 0; j < mp::product(shapes[i]); ++j) {
      owner[static_cast<size_t>(offsets[i] + j)] = i;
      index[static_cast<size_t>(offsets[i] + j)] = j;
    }
  }

  struct Group {
    std::string name;
    hora_reduce_op_t op;
    double pre, post;
    bool inPlace;
    int64_t salt;
    std::unique_ptr<HostTensor> input;
    std::unique_ptr<DeviceTensor> in, out;
    std::vector<DLTensor> inViews, outViews;
    DeviceRequest req;
  };
  std::vector<Group> groups;
  const std::pair<double, double> scales[] = {{1.0, 1.0}, {2.0, 0.25}};
  int64_t salt = 0;
  for (hora_reduce_op_t op : mp::allOps()) {
    for (const auto &sc : scales) {
      for (bool inPlace : {true, false}) {
        Group g;
        g.name = std::string("gpu.grp.") + dt.name + "." + mp::opName(op) +
                 (sc.first == 1.0 ? ".plain" : ".scaled") + (inPlace ? ".in" : ".out");
        g.op = op;
        g.pre = sc.first;
        g.post = sc.second;
        g.inPlace = inPlace;
        g.salt = salt;
        salt += 100;
        groups.push_back(std::move(g));
      }
    }
  }
  for (Group &g : groups) {
    g.input = makeTensor(dt, {total});
    g.input->fill([&](int64_t k) {
      const int i = owner[static_cast<size_t>(k)];
      return i < 0 ? kSentinel
                   : mp::inputValue(g.op, dt, r, n, index[static_cast<size_t>(k)], g.salt + i);
    });
    g.in = std::make_unique<DeviceTensor>(*g.input, device_);
    CUDA_ASSERT_OK(g.in->status());
    if (!g.inPlace) {
      auto stale = makeTensor(dt, {total});
      stale->fill([&](int64_t) { return kSentinel; });
      g.out = std::make_unique<DeviceTensor>(*stale, device_);
      CUDA_ASSERT_OK(g.out->status());
    }
    for (int i = 0; i < kMembers; ++i) {
      const bool viaByteOffset = i % 2 == 1;
      g.inViews.push_back(g.in->view(offsets[i], shapes[i], viaByteOffset));
      g.outViews.push_back((g.inPlace ? *g.in : *g.out).view(offsets[i], shapes[i], viaByteOffset));
    }
  }
  for (Group &g : groups) {
    hora_request_t req = nullptr;
    MP_EXPECT_OK(hora_grouped_allreduce_async(g.name.c_str(), kMembers, g.inViews.data(),
                                              g.outViews.data(), g.op, g.pre, g.post, 0, &req))
        << g.name;
    g.req.reset(req);
  }
  for (Group &g : groups) {
    if (!g.req) continue;
    MP_EXPECT_OK(hora_wait(g.req.get())) << g.name;
    std::vector<double> want(static_cast<size_t>(total)), tol(static_cast<size_t>(total));
    for (size_t k = 0; k < want.size(); ++k) {
      const int i = owner[k];
      want[k] = i < 0 ? kSentinel
                      : mp::expectedValue(g.op, dt, n, index[k], g.salt + i, g.pre, g.post);
      tol[k] = i < 0 ? 0.0 : mp::tolerance(g.op, dt, want[k]);
    }
    auto result = makeTensor(dt, {total});
    CUDA_ASSERT_OK((g.inPlace ? *g.in : *g.out).download(*result));
    EXPECT_TRUE(mp::matches(
        *result, [&](int64_t k) { return want[static_cast<size_t>(k)]; },
        [&](int64_t k) { return tol[static_cast<size_t>(k)]; }))
        << g.name << ": members (prescale " << g.pre << ", postscale " << g.post
        << "), or the gaps between them";
    if (!g.inPlace) {
      auto after = makeTensor(dt, {total});
      CUDA_ASSERT_OK(g.in->download(*after));
      EXPECT_TRUE(mp::matches(*after, [&](int64_t k) { return g.input->get(k); }))
          << g.name << ": out-of-place grouped allreduce modified its inputs";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuGroupedAllreduce, ::testing::Values("float32", "float16"),
                         paramName);

class GpuAllreduce : public GpuTest {};

// 64 allreduces of mixed dtypes, ops and sizes, each under its own name, submitted back to back
// in a rank-dependent order and only then waited for.
TEST_F(GpuAllreduce, ManyInFlightBackToBack) {
  const int r = mp::rank();
  constexpr int kCount = 64;
  const char *dtypes[] = {"float32", "bfloat16", "int32", "float64", "float16", "int8", "uint8",
                          "int64"};
  struct Item {
    std::string name;
    DType dt;
    hora_reduce_op_t op;
    int64_t salt;
    std::vector<int64_t> shape;
    std::unique_ptr<DeviceTensor> t;
    DeviceRequest req;
  };
  std::vector<Item> items;
  for (int i = 0; i < kCount; ++i) {
    Item it{};
    it.dt = mp::dtypeNamed(dtypes[i % 8]);
    it.op = mp::allOps()[static_cast<size_t>(i % 5)];
    if (!it.dt.floating && it.op == HORA_OP_AVERAGE) it.op = HORA_OP_SUM;
    it.salt = 300 + i;
    it.shape = {1 + (static_cast<int64_t>(i) * 97) % 3000};
    it.name = "gpu.many." + std::to_string(i);
    items.push_back(std::move(it));
  }
  for (int k = 0; k < kCount; ++k) {
    Item &it = items[static_cast<size_t>((k * 5 + r * 3) % kCount)];  // 5 is coprime with 64
    auto host = makeTensor(it.dt, it.shape);
    mp::fillInput(*host, it.op, it.salt);
    it.t = std::make_unique<DeviceTensor>(*host, device_);
    CUDA_ASSERT_OK(it.t->status());
    hora_request_t req = nullptr;
    MP_EXPECT_OK(hora_allreduce_async(it.name.c_str(), it.t->dl(), it.t->dl(), it.op, 1.0, 1.0, 0,
                                      &req))
        << it.name;
    it.req.reset(req);
  }
  for (Item &it : items) {
    if (!it.req) continue;
    MP_EXPECT_OK(hora_wait(it.req.get())) << it.name;
    auto result = makeTensor(it.dt, it.shape);
    CUDA_ASSERT_OK(it.t->download(*result));
    EXPECT_TRUE(mp::matchesReduction(*result, it.op, it.salt, 1.0, 1.0))
        << it.name << " (" << it.dt.name << ", " << mp::opName(it.op) << ")";
  }
}

// --- broadcast ---------------------------------------------------------------------------

class GpuBroadcastMatrix : public GpuParamTest<std::string> {};

// A broadcast from every root at once, each under its own name; values differ per rank
// (mp::bcValue), so a rank that kept its own data is caught.
TEST_P(GpuBroadcastMatrix, FromEveryRoot) {
  const DType &dt = mp::dtypeNamed(GetParam());
  const int r = mp::rank(), n = mp::size();
  for (int64_t count : {1, 1000, 300000}) {
    struct Item {
      std::string name;
      std::unique_ptr<DeviceTensor> t;
      DeviceRequest req;
    };
    std::vector<Item> items(static_cast<size_t>(n));
    for (int root = 0; root < n; ++root) {
      Item &it = items[static_cast<size_t>(root)];
      it.name = std::string("gpu.bc.") + dt.name + "." + std::to_string(count) + ".root" +
                std::to_string(root);
      auto host = makeTensor(dt, {count});
      host->fill([&](int64_t i) { return mp::bcValue(dt, r, i, root); });
      it.t = std::make_unique<DeviceTensor>(*host, device_);
      CUDA_ASSERT_OK(it.t->status());
      hora_request_t req = nullptr;
      MP_EXPECT_OK(hora_broadcast_async(it.name.c_str(), it.t->dl(), root, 0, &req)) << it.name;
      it.req.reset(req);
    }
    for (int root = 0; root < n; ++root) {
      Item &it = items[static_cast<size_t>(root)];
      if (!it.req) continue;
      MP_EXPECT_OK(hora_wait(it.req.get())) << it.name;
      auto result = makeTensor(dt, {count});
      CUDA_ASSERT_OK(it.t->download(*result));
      EXPECT_TRUE(mp::matches(*result, [&](int64_t i) { return mp::bcValue(dt, root, i, root); }))
          << it.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuBroadcastMatrix, ::testing::ValuesIn(mp::dtypeNameList()),
                         paramName);

// --- allgather ---------------------------------------------------------------------------

// rowsOf(rank) rows of `trailing` from each rank; the output, allocated by hora on this rank's
// GPU, holds them in rank order (mp::rowValue identifies rank, row and column).
// The output hora allocated holds the rows `origin` names ((rank, row) each, in order, with
// trailing dimensions `trailing`), and the op left its input as it was.
void expectRowsAndInput(hora_request_t req, const DType &dt,
                        const std::vector<std::pair<int, int64_t>> &origin,
                        const std::vector<int64_t> &trailing, int64_t salt, int device,
                        DeviceTensor &in, const HostTensor &input, const std::string &name) {
  const int64_t w = mp::product(trailing);
  std::vector<int64_t> outShape = {static_cast<int64_t>(origin.size())};
  outShape.insert(outShape.end(), trailing.begin(), trailing.end());
  std::unique_ptr<HostTensor> result;
  fetchOutput(hora_request_output(req), dt, outShape, device, name, &result);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_TRUE(mp::matches(*result, [&](int64_t i) {
    const auto &o = origin[static_cast<size_t>(i / w)];
    return mp::rowValue(dt, o.first, o.second, i % w, salt);
  })) << name;
  std::vector<int64_t> inShape(input.dl()->shape, input.dl()->shape + input.dl()->ndim);
  auto after = makeTensor(dt, inShape);
  CUDA_ASSERT_OK(in.download(*after));
  EXPECT_TRUE(mp::matches(*after, [&](int64_t i) { return input.get(i); }))
      << name << ": the op modified its input";
}

void allgatherOnDevice(const std::string &name, const DType &dt,
                       const std::function<int64_t(int)> &rowsOf,
                       const std::vector<int64_t> &trailing, int64_t salt, int device) {
  const int r = mp::rank(), n = mp::size();
  const int64_t w = mp::product(trailing);
  std::vector<int64_t> shape = {rowsOf(r)};
  shape.insert(shape.end(), trailing.begin(), trailing.end());
  auto input = makeTensor(dt, shape);
  input->fill([&](int64_t i) { return mp::rowValue(dt, r, i / w, i % w, salt); });
  DeviceTensor in(*input, device);
  CUDA_ASSERT_OK(in.status());

  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allgather_async(name.c_str(), in.dl(), 0, &req)) << name;
  DeviceRequest guard(req);
  MP_ASSERT_OK(hora_wait(req)) << name;

  std::vector<std::pair<int, int64_t>> origin;  // (rank, row) of each output row
  for (int q = 0; q < n; ++q)
    for (int64_t row = 0; row < rowsOf(q); ++row) origin.emplace_back(q, row);
  expectRowsAndInput(req, dt, origin, trailing, salt, device, in, *input, name);
}

class GpuAllgatherMatrix : public GpuParamTest<std::string> {};

// Rank q gives q + 1 rows: uneven blocks, one broadcast per rank.
TEST_P(GpuAllgatherMatrix, RowsDifferPerRank) {
  const DType &dt = mp::dtypeNamed(GetParam());
  allgatherOnDevice(std::string("gpu.ag.rows.") + dt.name, dt,
                    [](int q) { return int64_t{q} + 1; }, {3}, 1, device_);
}

// Rank 0 gives no rows; at one rank the whole output is empty.
TEST_P(GpuAllgatherMatrix, OneRankContributesZeroRows) {
  const DType &dt = mp::dtypeNamed(GetParam());
  allgatherOnDevice(std::string("gpu.ag.zero.") + dt.name, dt, [](int q) { return int64_t{q}; },
                    {3}, 2, device_);
}

// Equal blocks: ncclAllGather itself.
TEST_P(GpuAllgatherMatrix, SameRowsEveryRank) {
  const DType &dt = mp::dtypeNamed(GetParam());
  allgatherOnDevice(std::string("gpu.ag.same.") + dt.name, dt, [](int) { return int64_t{4}; },
                    {5}, 3, device_);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuAllgatherMatrix, ::testing::ValuesIn(mp::dtypeNameList()),
                         paramName);

class GpuAllgather : public GpuTest {};

TEST_F(GpuAllgather, LargeRowsDifferPerRank) {
  allgatherOnDevice("gpu.ag.large", mp::f64(), [](int q) { return int64_t{1000} * (q + 1) + q; },
                    {30}, 4, device_);
}

TEST_F(GpuAllgather, OneDimensional) {
  allgatherOnDevice("gpu.ag.1d", mp::f32(), [](int q) { return int64_t{2} * q + 1; }, {}, 5,
                    device_);
}

// --- alltoall ----------------------------------------------------------------------------

// split(src, dst) rows go from rank src to rank dst (nullSplits: NULL, an even split). Rows
// arrive in source-rank order; hora allocates the output on this rank's GPU.
void alltoallOnDevice(const std::string &name, const DType &dt,
                      const std::function<int64_t(int, int)> &split,
                      const std::vector<int64_t> &trailing, int64_t salt, bool nullSplits,
                      int device) {
  const int r = mp::rank(), n = mp::size();
  const int64_t w = mp::product(trailing);
  std::vector<int64_t> splits;
  int64_t rows = 0;
  for (int d = 0; d < n; ++d) {
    splits.push_back(split(r, d));
    rows += splits.back();
  }
  std::vector<int64_t> shape = {rows};
  shape.insert(shape.end(), trailing.begin(), trailing.end());
  auto input = makeTensor(dt, shape);
  input->fill([&](int64_t i) { return mp::rowValue(dt, r, i / w, i % w, salt); });
  DeviceTensor in(*input, device);
  CUDA_ASSERT_OK(in.status());

  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_alltoall_async(name.c_str(), in.dl(), nullSplits ? nullptr : splits.data(), 0,
                                   &req))
      << name;
  DeviceRequest guard(req);
  MP_ASSERT_OK(hora_wait(req)) << name;

  // From source q: its rows for ranks < r skipped, then the split(q, r) rows for this rank.
  std::vector<std::pair<int, int64_t>> origin;
  for (int q = 0; q < n; ++q) {
    int64_t first = 0;
    for (int d = 0; d < r; ++d) first += split(q, d);
    for (int64_t k = 0; k < split(q, r); ++k) origin.emplace_back(q, first + k);
  }
  const int64_t *received = hora_request_received_splits(req);
  EXPECT_NE(nullptr, received) << name << ": no received splits";
  if (received != nullptr) {
    for (int q = 0; q < n; ++q)
      EXPECT_EQ(split(q, r), received[q]) << name << ": rows from rank " << q;
  }
  expectRowsAndInput(req, dt, origin, trailing, salt, device, in, *input, name);
}

// 0..3 rows from src to dst, zeros among them at every size above one, and different totals
// per rank, so both what a rank sends and what it receives are uneven.
int64_t unevenSplit(int src, int dst) { return (src + 2 * dst + 1) % 4; }

class GpuAlltoallMatrix : public GpuParamTest<std::string> {};

TEST_P(GpuAlltoallMatrix, UnevenSplitsWithZeros) {
  const DType &dt = mp::dtypeNamed(GetParam());
  alltoallOnDevice(std::string("gpu.a2a.uneven.") + dt.name, dt, unevenSplit, {3}, 1, false,
                   device_);
}

TEST_P(GpuAlltoallMatrix, NullSplitsEven) {
  const DType &dt = mp::dtypeNamed(GetParam());
  alltoallOnDevice(std::string("gpu.a2a.even.") + dt.name, dt,
                   [](int, int) { return int64_t{2}; }, {5}, 2, true, device_);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuAlltoallMatrix, ::testing::ValuesIn(mp::dtypeNameList()),
                         paramName);

class GpuAlltoall : public GpuTest {};

TEST_F(GpuAlltoall, LargeUneven) {
  alltoallOnDevice("gpu.a2a.large", mp::f32(),
                   [](int s, int d) { return int64_t{1000} * (s + 1) + 7 * d; }, {64}, 3, false,
                   device_);
}

// --- reducescatter -----------------------------------------------------------------------

// Rank r receives block r of the reduced input (rows / n rows, the first rows % n ranks one more),
// in an output hora allocates on this rank's GPU.
void reducescatterOnDevice(const std::string &name, const DType &dt, hora_reduce_op_t op,
                           const std::vector<int64_t> &shape, int64_t salt, int device) {
  const int r = mp::rank(), n = mp::size();
  const int64_t rows = shape.at(0);
  const int64_t w = mp::product(std::vector<int64_t>(shape.begin() + 1, shape.end()));
  auto input = makeTensor(dt, shape);
  mp::fillInput(*input, op, salt);
  DeviceTensor in(*input, device);
  CUDA_ASSERT_OK(in.status());

  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_reducescatter_async(name.c_str(), in.dl(), op, 0, &req)) << name;
  DeviceRequest guard(req);
  MP_ASSERT_OK(hora_wait(req)) << name;

  std::vector<int64_t> outShape = shape;
  outShape[0] = mp::blockRows(rows, n, r);
  std::unique_ptr<HostTensor> result;
  fetchOutput(hora_request_output(req), dt, outShape, device, name, &result);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_TRUE(
      mp::matchesReductionOf(*result, op, salt, 1.0, 1.0, n, mp::blockStart(rows, n, r) * w))
      << name << " (" << mp::opName(op) << ", block " << r << " of " << n << ")";
  auto after = makeTensor(dt, shape);
  CUDA_ASSERT_OK(in.download(*after));
  EXPECT_TRUE(mp::matches(*after, [&](int64_t i) { return input->get(i); }))
      << name << ": reducescatter modified its input";
}

using RsParam = std::tuple<std::string, hora_reduce_op_t>;

class GpuReducescatterMatrix : public GpuParamTest<RsParam> {
 protected:
  const DType &dt() const { return mp::dtypeNamed(std::get<0>(GetParam())); }
  hora_reduce_op_t op() const { return std::get<1>(GetParam()); }
  std::string name(const char *what) const {
    return std::string("gpu.rs.") + what + "." + dt().name + "." + mp::opName(op());
  }
};

// 2n+1 rows: not divisible by n (n > 1), so the blocks differ (one ncclReduce per rank).
TEST_P(GpuReducescatterMatrix, UnevenRows) {
  const int n = mp::size();
  reducescatterOnDevice(name("uneven"), dt(), op(), {2 * n + 1, 3}, 1, device_);
}

// 2n rows: equal blocks (ncclReduceScatter).
TEST_P(GpuReducescatterMatrix, EvenRows) {
  const int n = mp::size();
  reducescatterOnDevice(name("even"), dt(), op(), {2 * n, 3}, 2, device_);
}

// Fewer rows than ranks: the last ranks get empty blocks (shape [0, 4]).
TEST_P(GpuReducescatterMatrix, FewerRowsThanRanks) {
  const int n = mp::size();
  reducescatterOnDevice(name("few"), dt(), op(), {n > 1 ? n - 1 : 1, 4}, 3, device_);
}

std::vector<RsParam> rsParams() {
  std::vector<RsParam> v;
  for (const DType &d : mp::allDTypes())
    for (hora_reduce_op_t op : {HORA_OP_SUM, HORA_OP_MAX}) v.emplace_back(d.name, op);
  return v;
}

INSTANTIATE_TEST_SUITE_P(DtypesOps, GpuReducescatterMatrix, ::testing::ValuesIn(rsParams()),
                         [](const ::testing::TestParamInfo<RsParam> &info) {
                           return std::get<0>(info.param) + "_" +
                                  mp::opName(std::get<1>(info.param));
                         });

// --- the caller's stream -----------------------------------------------------------------

// Page-locked host memory: a copy from it is asynchronous for the host (a copy from pageable
// memory may return only once the data is staged).
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) { status_ = cudaMallocHost(&data_, bytes); }
  ~PinnedBuffer() {
    if (data_ != nullptr) CUDA_EXPECT_OK(cudaFreeHost(data_));
  }
  PinnedBuffer(const PinnedBuffer &) = delete;
  PinnedBuffer &operator=(const PinnedBuffer &) = delete;
  cudaError_t status() const { return status_; }
  void *data() const { return data_; }

 private:
  void *data_ = nullptr;
  cudaError_t status_ = cudaSuccess;
};

// A non-blocking stream of the test's (no implicit ordering with the legacy default stream). On
// scope exit it drains the stream, hands this thread back to the legacy default stream
// (hora_cuda_set_stream(NULL)) and destroys it.
class CallerStream {
 public:
  explicit CallerStream(int device) {
    status_ = cudaSetDevice(device);
    if (status_ == cudaSuccess)
      status_ = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  }
  ~CallerStream() {
    MP_EXPECT_OK(hora_cuda_set_stream(nullptr));
    if (stream_ != nullptr) {
      CUDA_EXPECT_OK(cudaStreamSynchronize(stream_));
      CUDA_EXPECT_OK(cudaStreamDestroy(stream_));
    }
  }
  CallerStream(const CallerStream &) = delete;
  CallerStream &operator=(const CallerStream &) = delete;
  cudaError_t status() const { return status_; }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  cudaError_t status_ = cudaSuccess;
};

class GpuStream : public GpuTest {};

// The input reaches the device by an asynchronous copy on the caller's stream, queued behind
// two more copies of the same size, and the allreduce is submitted at once, without
// synchronizing: hora must order its work after the stream's. Before the copy the tensor holds
// NaN (all bits set), which no sum turns into the expected values. The result, once the request
// completes, is also read back through the caller's stream.
TEST_F(GpuStream, SubmissionWaitsForTheCallersStream) {
  const DType &dt = mp::f32();
  const int r = mp::rank(), n = mp::size();
  const int64_t count = int64_t{1} << 24;  // 64 MiB: each copy takes milliseconds
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  const int64_t salt = 5;

  PinnedBuffer pinned(bytes);
  CUDA_ASSERT_OK(pinned.status());
  float *src = static_cast<float *>(pinned.data());
  for (int64_t j = 0; j < count; ++j)
    src[j] = static_cast<float>(mp::inputValue(HORA_OP_SUM, dt, r, n, j, salt));

  DeviceTensor t(dt, {count}, device_);
  CUDA_ASSERT_OK(t.status());
  DeviceTensor scratch(dt, {count}, device_);
  CUDA_ASSERT_OK(scratch.status());
  CUDA_ASSERT_OK(cudaMemset(t.data(), 0xff, bytes));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());

  CallerStream stream(device_);
  CUDA_ASSERT_OK(stream.status());
  for (int k = 0; k < 2; ++k) {
    CUDA_ASSERT_OK(
        cudaMemcpyAsync(scratch.data(), src, bytes, cudaMemcpyHostToDevice, stream.get()));
  }
  CUDA_ASSERT_OK(cudaMemcpyAsync(t.data(), src, bytes, cudaMemcpyHostToDevice, stream.get()));
  MP_ASSERT_OK(hora_cuda_set_stream(stream.get()));
  hora_request_t req = nullptr;
  MP_ASSERT_OK(
      hora_allreduce_async("gpu.stream.sum", t.dl(), t.dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
  DeviceRequest guard(req);
  // Whether the copies were still queued at submission: they should be, or this run proved less.
  const cudaError_t pending = cudaStreamQuery(stream.get());
  ASSERT_TRUE(pending == cudaSuccess || pending == cudaErrorNotReady)
      << "cudaStreamQuery: " << cudaGetErrorName(pending);
  RecordProperty("copy_pending_at_submission", pending == cudaErrorNotReady ? "yes" : "no");
  MP_ASSERT_OK(hora_wait(req));

  auto result = makeTensor(dt, {count});
  CUDA_ASSERT_OK(t.download(*result));
  EXPECT_TRUE(mp::matchesReduction(*result, HORA_OP_SUM, salt, 1.0, 1.0))
      << "the allreduce did not see the input copied on the caller's stream";

  // Visible to every stream: the caller's own stream reads the completed result.
  CUDA_ASSERT_OK(
      cudaMemcpyAsync(scratch.data(), t.data(), bytes, cudaMemcpyDeviceToDevice, stream.get()));
  CUDA_ASSERT_OK(cudaStreamSynchronize(stream.get()));
  auto seen = makeTensor(dt, {count});
  CUDA_ASSERT_OK(scratch.download(*seen));
  EXPECT_TRUE(mp::matchesReduction(*seen, HORA_OP_SUM, salt, 1.0, 1.0))
      << "the result as read through the caller's stream";
}

// A stream-ordered wait (hora_cuda_wait): the caller's stream reads the result with no host
// wait between submission and that read; the request still completes for hora_wait.
TEST_F(GpuStream, AStreamOrderedWaitOrdersTheCallersStreamAfterTheOp) {
  const DType &dt = mp::f32();
  const int64_t count = int64_t{1} << 22;
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  const int64_t salt = 9;
  auto input = makeTensor(dt, {count});
  mp::fillInput(*input, HORA_OP_SUM, salt);
  DeviceTensor t(dt, {count}, device_);
  CUDA_ASSERT_OK(t.status());
  CUDA_ASSERT_OK(t.upload(*input));
  DeviceTensor copy(dt, {count}, device_);
  CUDA_ASSERT_OK(copy.status());
  CUDA_ASSERT_OK(cudaMemset(copy.data(), 0xff, bytes));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  CallerStream stream(device_);
  CUDA_ASSERT_OK(stream.status());
  MP_ASSERT_OK(hora_cuda_set_stream(stream.get()));
  hora_request_t req = nullptr;
  MP_ASSERT_OK(
      hora_allreduce_async("gpu.stream.ordered", t.dl(), t.dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
  DeviceRequest guard(req);
  MP_ASSERT_OK(hora_cuda_wait(req, stream.get()));
  CUDA_ASSERT_OK(cudaMemcpyAsync(copy.data(), t.data(), bytes, cudaMemcpyDeviceToDevice, stream.get()));
  CUDA_ASSERT_OK(cudaStreamSynchronize(stream.get()));
  auto seen = makeTensor(dt, {count});
  CUDA_ASSERT_OK(copy.download(*seen));
  EXPECT_TRUE(mp::matchesReduction(*seen, HORA_OP_SUM, salt, 1.0, 1.0))
      << "the caller's stream ran before the allreduce had finished";
  MP_ASSERT_OK(hora_wait(req));
}

// --- a CUDA tensor this process cannot use ----------------------------------------------

// A CUDA tensor on an ordinal this process does not have: every kind of submission refuses it
// as UNSUPPORTED, naming the device, and creates no request; then the runtime still works. The
// data pointer (host memory) is never dereferenced: the refusal comes first.
void expectCudaTensorRefused(int ordinal) {
  float storage[12] = {};
  int64_t shape[2] = {4, 3};
  DLTensor t{};
  t.data = storage;
  t.device = DLDevice{kDLCUDA, ordinal};
  t.ndim = 2;
  t.dtype = mp::f32().dl();
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  const std::string where = "cuda:" + std::to_string(ordinal);
  std::vector<int64_t> splits(static_cast<size_t>(mp::size()), 0);
  splits[0] = 4;

  struct Submission {
    const char *what;
    std::function<hora_status_t(hora_request_t *)> submit;
  };
  const std::vector<Submission> submissions = {
      {"allreduce",
       [&](hora_request_t *req) {
         return hora_allreduce_async("gpu.refused.ar", &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, req);
       }},
      {"grouped allreduce",
       [&](hora_request_t *req) {
         return hora_grouped_allreduce_async("gpu.refused.grp", 1, &t, &t, HORA_OP_SUM, 1.0, 1.0, 0,
                                             req);
       }},
      {"broadcast",
       [&](hora_request_t *req) { return hora_broadcast_async("gpu.refused.bc", &t, 0, 0, req); }},
      {"allgather",
       [&](hora_request_t *req) { return hora_allgather_async("gpu.refused.ag", &t, 0, req); }},
      {"alltoall",
       [&](hora_request_t *req) {
         return hora_alltoall_async("gpu.refused.a2a", &t, splits.data(), 0, req);
       }},
      {"reducescatter",
       [&](hora_request_t *req) {
         return hora_reducescatter_async("gpu.refused.rs", &t, HORA_OP_SUM, 0, req);
       }},
  };
  for (const Submission &s : submissions) {
    hora_request_t req = nullptr;
    const hora_status_t status = s.submit(&req);
    const std::string err = mp::lastError();
    EXPECT_EQ(mp::statusName(HORA_ERR_UNSUPPORTED), mp::statusName(status))
        << s.what << " of a tensor on " << where << ": '" << err << "'";
    EXPECT_NE(std::string::npos, err.find(where))
        << s.what << ": the message does not name " << where << ": '" << err << "'";
    EXPECT_EQ(nullptr, req) << s.what << ": a refused submission created a request";
    if (status == HORA_SUCCESS && req != nullptr) hora_request_free(req);
  }
  mp::expectGoodAllreduce("gpu.refused.after", 1);  // nothing was enqueued
}

// The process sees no GPU at all (this test's reason to exist: it runs on machines without one).
TEST(GpuUnavailable, CudaTensorWithoutAnyGpuIsUnsupported) {
  const int gpus = gpuCount();
  if (!onEveryRank(gpus == 0)) {
    GTEST_SKIP() << "this rank sees " << gpus << " GPU(s) (or another rank does): the test is "
                 << "for processes that see none";
  }
  expectCudaTensorRefused(0);
}

// With GPUs: the first ordinal past the last one.
TEST(GpuUnavailable, CudaOrdinalPastTheLastGpuIsUnsupported) {
  const int gpus = gpuCount();
  if (!onEveryRank(gpus > 0)) {
    GTEST_SKIP() << "this rank sees " << gpus << " GPU(s) (or another rank sees none)";
  }
  expectCudaTensorRefused(gpus);
}

// More ranks on this host than GPUs (ranks share one): NCCL refuses a communicator with two
// ranks on one GPU, so the first CUDA collective must fail on every rank with a status and
// NCCL's reason, not hang or crash. The failure stops the process set (every later op on it
// fails), so this test runs in a process of its own (meson's gpu_shared_np2, with
// --gtest_filter=GpuShared.*), and the other runs leave it out.
TEST(GpuShared, RanksSharingAGpuFailCleanly) {
  const int gpus = gpuCount();
  const bool shared = gpus > 0 && hora_cross_size() == 1 && hora_local_size() > gpus;
  if (!onEveryRank(shared)) {
    GTEST_SKIP() << "every rank has a GPU of its own (or there is none, or several hosts)";
  }
  const int device = hora_local_rank() % gpus;
  auto host = makeTensor(mp::f32(), {256});
  for (int64_t i = 0; i < host->numel(); ++i) host->set(i, 1.0);
  DeviceTensor t(*host, device);
  CUDA_ASSERT_OK(t.status());
  hora_request_t req = nullptr;
  ASSERT_EQ(HORA_SUCCESS,
            hora_allreduce_async("gpu.shared", t.dl(), t.dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req))
      << mp::lastError();
  DeviceRequest guard(req);
  const hora_status_t status = hora_wait(req);
  const std::string why = mp::lastError();
  EXPECT_EQ(HORA_ERR_BACKEND, status) << "ranks sharing cuda:" << device << ": " << why;
  EXPECT_NE(std::string::npos, why.find("NCCL")) << why;
}

}  // namespace
