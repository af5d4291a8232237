// SPDX-License-Identifier: Apache-2.0
// NCCL: a non-blocking communicator with deadlines, hora's own stream, a persistent device
// fusion buffer, and every collective of the C API.
#include "backends/nccl/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "backends/nccl/nccl_device.h"
#include "backends/nccl/nccl_kernels.h"
#include "backends/nccl/nccl_plan.h"
#include "base/error.h"
#include "base/logging.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;
using namespace nccl_plan;

static_assert(static_cast<int>(NcclType::kInt8) == ncclInt8 &&
                  static_cast<int>(NcclType::kUint8) == ncclUint8 &&
                  static_cast<int>(NcclType::kInt32) == ncclInt32 &&
                  static_cast<int>(NcclType::kInt64) == ncclInt64 &&
                  static_cast<int>(NcclType::kFloat16) == ncclFloat16 &&
                  static_cast<int>(NcclType::kFloat32) == ncclFloat32 &&
                  static_cast<int>(NcclType::kFloat64) == ncclFloat64 &&
                  static_cast<int>(NcclType::kBfloat16) == ncclBfloat16,
              "nccl_plan's types are NCCL's");
static_assert(static_cast<int>(NcclOp::kSum) == ncclSum && static_cast<int>(NcclOp::kProd) == ncclProd &&
                  static_cast<int>(NcclOp::kMax) == ncclMax && static_cast<int>(NcclOp::kMin) == ncclMin &&
                  static_cast<int>(NcclOp::kAvg) == ncclAvg,
              "nccl_plan's ops are NCCL's");

ncclDataType_t toNccl(DType t) { return static_cast<ncclDataType_t>(ncclType(t)); }

// A communicator whose every call has a deadline: non-blocking mode, polled; on an error or the
// deadline it is aborted, which is what keeps a dead peer from hanging the engine forever.
class Comm {
 public:
  Comm(ControlPlane &control, int device, double timeoutS)
      : device_(device), rank_(control.rank()), size_(control.size()), timeoutS_(timeoutS) {
    // Rank 0 sends the id, or why it has none (so that nobody waits for an id that never comes).
    std::string id;
    if (rank_ == 0) {
      ncclUniqueId unique;
      const ncclResult_t r = ncclGetUniqueId(&unique);
      id = r == ncclSuccess ? std::string(reinterpret_cast<const char *>(&unique), sizeof unique)
                            : detail::concat("!ncclGetUniqueId on rank 0: NCCL error ", ncclGetErrorString(r));
    }
    control.broadcastFromRoot(id);
    if (id.size() != sizeof(ncclUniqueId)) {
      HORA_THROW(HORA_ERR_BACKEND, "no NCCL communicator: ",
                 id.empty() || id[0] != '!' ? "malformed unique id" : id.substr(1));
    }
    ncclUniqueId unique;
    std::memcpy(&unique, id.data(), sizeof unique);
    nccl_device::setDevice(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, unique, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm_ != nullptr) ncclCommAbort(comm_);
      comm_ = nullptr;
      throwNccl(r, "ncclCommInitRankConfig");
    }
    settle("creating the NCCL communicator", Clock::now() + deadline());
  }

  ~Comm() {
    if (comm_ == nullptr) return;
    nccl_device::setDevice(device_);
    // Orderly when it can be: finalize (flushes outstanding work, collective with the peers,
    // who destroy theirs at the same response), then destroy; bounded like the rest of shutdown
    // (10 s at most), so that a peer that is gone delays it only that long.
    const ncclResult_t r = broken_ ? ncclInternalError : ncclCommFinalize(comm_);
    if (r == ncclSuccess || r == ncclInProgress) {
      const auto end = Clock::now() + std::min<std::chrono::nanoseconds>(deadline(), std::chrono::seconds(10));
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress &&
             Clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (state == ncclSuccess) {
        ncclCommDestroy(comm_);
        return;
      }
    }
    ncclCommAbort(comm_);
  }
  Comm(const Comm &) = delete;
  Comm &operator=(const Comm &) = delete;

  ncclComm_t get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  std::chrono::nanoseconds deadline() const {
    return std::chrono::nanoseconds(static_cast<int64_t>(timeoutS_ * 1e9));
  }

  void usable() const {
    if (broken_) {
      HORA_THROW(HORA_ERR_BACKEND, "the NCCL communicator on cuda:", device_,
                 " was aborted after an earlier failure: ", brokenWhy_);
    }
  }

  // A call on the communicator: in non-blocking mode it may return ncclInProgress, and then the
  // communicator must settle before the next call.
  void call(ncclResult_t r, const char *what) {
    if (r == ncclInProgress) {
      settle(what, Clock::now() + deadline());
    } else if (r != ncclSuccess) {
      fail(HORA_ERR_BACKEND, detail::concat(what, ": NCCL error ", ncclGetErrorString(r), lastError()));
    }
  }

  // Polls until the communicator is no longer in progress; an error or the deadline aborts it.
  void settle(const char *what, Clock::time_point end) {
    auto nap = std::chrono::microseconds(1);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) state = r;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        fail(HORA_ERR_BACKEND, detail::concat(what, ": NCCL error ", ncclGetErrorString(state), lastError()));
      }
      if (Clock::now() > end) {
        fail(HORA_ERR_TIMEOUT, detail::concat(what, ": not done after ", timeoutS_,
                                              " s (HORA_TIMEOUT_S); a peer may be gone or stuck"));
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }

  // Aborts the communicator (so no call on it waits any longer, here or on the peers, and no
  // kernel of it keeps running) and throws.
  [[noreturn]] void fail(hora_status_t status, const std::string &why) {
    abort(why);
    HORA_THROW(status, why, " (rank ", rank_, " of ", size_, ", cuda:", device_, ")");
  }
  void abort(const std::string &why) {
    if (broken_) return;
    broken_ = true;
    brokenWhy_ = why;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  [[noreturn]] static void throwNccl(ncclResult_t r, const char *what) {
    HORA_THROW(HORA_ERR_BACKEND, what, ": NCCL error ", ncclGetErrorString(r));
  }
  std::string lastError() const {
    const char *last = comm_ != nullptr ? ncclGetLastError(comm_) : nullptr;
    return last != nullptr && last[0] != '\0' ? detail::concat(" (", last, ")") : std::string();
  }

  ncclComm_t comm_ = nullptr;
  int device_;
  int rank_;
  int size_;
  double timeoutS_;
  bool broken_ = false;
  std::string brokenWhy_;
};

// A premultiplied-sum operator for one call, destroyed once the call is enqueued.
class PreMulSum {
 public:
  PreMulSum(Comm &comm, DType dtype, double factor) : comm_(comm) {
    union {
      uint16_t h;
      float f;
      double d;
    } scalar{};
    switch (dtype) {
      case DType::kFloat16: scalar.h = floatToHalf(static_cast<float>(factor)); break;
      case DType::kBFloat16: scalar.h = floatToBfloat16(static_cast<float>(factor)); break;
      case DType::kFloat32: scalar.f = static_cast<float>(factor); break;
      case DType::kFloat64: scalar.d = factor; break;
      default: HORA_THROW(HORA_ERR_INTERNAL, "premultiplied sum of ", dtypeName(dtype));
    }
    comm_.call(ncclRedOpCreatePreMulSum(&op_, &scalar, toNccl(dtype), ncclScalarHostImmediate,
                                        comm_.get()),
               "ncclRedOpCreatePreMulSum");
    created_ = true;
  }
  ~PreMulSum() {
    if (created_ && comm_.get() != nullptr) ncclRedOpDestroy(op_, comm_.get());
  }
  ncclRedOp_t get() const { return op_; }

 private:
  Comm &comm_;
  ncclRedOp_t op_{};
  bool created_ = false;
};

// ncclGroupStart .. ncclGroupEnd that is always closed: a failure inside is reported (and the
// communicator aborted) only once the group is closed, because an abort inside an open group
// never completes its cleanup.
class GroupCalls {
 public:
  explicit GroupCalls(Comm &comm) : comm_(comm) { open_ = ncclGroupStart() == ncclSuccess; }
  ~GroupCalls() {
    if (open_) ncclGroupEnd();
  }
  GroupCalls(const GroupCalls &) = delete;
  GroupCalls &operator=(const GroupCalls &) = delete;
  void add(ncclResult_t r, const char *what) {
    if (failed_ == ncclSuccess && r != ncclSuccess && r != ncclInProgress) {
      failed_ = r;
      what_ = what;
    }
  }
  void close() {
    HORA_ENFORCE(open_, "ncclGroupStart failed");
    open_ = false;
    const ncclResult_t end = ncclGroupEnd();
    if (failed_ != ncclSuccess) comm_.call(failed_, what_);
    comm_.call(end, "ncclGroupEnd");
  }

 private:
  Comm &comm_;
  bool open_ = false;
  ncclResult_t failed_ = ncclSuccess;
  const char *what_ = "";
};

class NcclExecutor final : public DeviceExecutor {
 public:
  NcclExecutor(ControlPlane &control, int device, double timeoutS)
      : stream_(device), comm_(control, device, timeoutS) {
    cudaEvent_t e = nullptr;
    nccl_device::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    done_ = e;
    HORA_LOG(kInfo) << "NCCL " << NCCL_MAJOR << "." << NCCL_MINOR << " communicator: rank "
                    << comm_.rank() << " of " << comm_.size() << " on cuda:" << device;
  }
  ~NcclExecutor() override {
    cudaSetDevice(comm_.device());
    if (done_ != nullptr) cudaEventDestroy(done_);
  }

  // Every op: any failure after work may have been queued aborts the communicator, so that no
  // NCCL kernel keeps waiting (here or on a peer) and nothing writes the tensors later.
  void allreduce(const std::vector<Request *> &requests, const Response &response,
                 int contributors) override {
    guarded([&] { runAllreduce(requests, response, contributors); });
  }
  void broadcast(Request &request, const Response &response) override {
    guarded([&] { runBroadcast(request, response); });
  }
  void allgather(Request &request, const Response &response) override {
    guarded([&] { runAllgather(request, response); });
  }
  void alltoall(Request &request, const Response &response) override {
    guarded([&] { runAlltoall(request, response); });
  }
  void reducescatter(Request &request, const Response &response, int contributors) override {
    guarded([&] { runReducescatter(request, response, contributors); });
  }

 private:
  template <typename F>
  void guarded(F &&op) {
    comm_.usable();
    try {
      op();
    } catch (const Error &e) {
      // An op refused on its agreed parameters fails the same way on every rank, before any
      // work is queued: the communicator stays.
      if (blastRadius(e.status()) != BlastRadius::kThisOp) comm_.abort(e.message());
      throw;
    } catch (const std::exception &e) {
      comm_.abort(e.what());
      throw;
    }
  }

  void runAllreduce(const std::vector<Request *> &requests, const Response &response,
                    int contributors) {
    begin(requests);
    const RequestMsg &agreed = response.agreed;
    const DType dtype = agreed.dtype;
    const size_t esize = dtypeSize(dtype);
    const AllreducePlan plan = planAllreduce(dtype, agreed.reduceOp, agreed.prescale,
                                             agreed.postscale, contributors, comm_.size());
    std::vector<TensorArg> tensors;
    for (Request *r : requests) {
      for (const TensorArg &t : deviceTensors(*r)) tensors.push_back(t);
    }
    std::unique_ptr<PreMulSum> premul;
    if (plan.premulSum) premul = std::make_unique<PreMulSum>(comm_, dtype, plan.premulFactor);
    const ncclRedOp_t op = premul ? premul->get() : static_cast<ncclRedOp_t>(plan.op);

    if (tensors.size() == 1) {  // reduced where it lies
      const TensorArg &t = tensors[0];
      const void *src = t.in;
      if (plan.kernelPrescale != 1.0) {
        copy(t.out, t.in, static_cast<size_t>(t.numel) * esize);
        scale(t.out, t.numel, dtype, plan.kernelPrescale);
        src = t.out;
      }
      comm_.call(ncclAllReduce(src, t.out, static_cast<size_t>(t.numel), toNccl(dtype), op,
                               comm_.get(), stream()),
                 "ncclAllReduce");
      scale(t.out, t.numel, dtype, plan.kernelPostscale);
    } else {
      std::vector<int64_t> bytes;
      for (const TensorArg &t : tensors) bytes.push_back(t.numel * static_cast<int64_t>(esize));
      const Layout layout = packLayout(bytes, esize);
      char *buf = static_cast<char *>(fusion(static_cast<size_t>(layout.bytes)));
      std::vector<nccl_kernels::CopyItem> in, out;
      for (size_t i = 0; i < tensors.size(); ++i) {
        in.push_back({tensors[i].in, buf + layout.offsets[i], bytes[i]});
        out.push_back({buf + layout.offsets[i], tensors[i].out, bytes[i]});
      }
      nccl_device::check(nccl_kernels::batchedCopy(in, stream()), "packing the fusion buffer");
      scale(buf, layout.elements, dtype, plan.kernelPrescale);
      comm_.call(ncclAllReduce(buf, buf, static_cast<size_t>(layout.elements), toNccl(dtype), op,
                               comm_.get(), stream()),
                 "ncclAllReduce (fused)");
      scale(buf, layout.elements, dtype, plan.kernelPostscale);
      nccl_device::check(nccl_kernels::batchedCopy(out, stream()), "unpacking the fusion buffer");
    }
    end(response, "allreduce");
  }

  void runBroadcast(Request &request, const Response &response) {
    begin({&request});
    const size_t esize = dtypeSize(response.agreed.dtype);
    const std::vector<TensorArg> tensors = deviceTensors(request);
    GroupCalls group(comm_);
    for (const TensorArg &t : tensors) {
      group.add(ncclBroadcast(t.out, t.out, static_cast<size_t>(t.numel) * esize, ncclUint8,
                              response.agreed.root, comm_.get(), stream()),
                "ncclBroadcast");
    }
    group.close();
    end(response, "broadcast");
  }

  void runAllgather(Request &request, const Response &response) {
    begin({&request});
    const size_t n = static_cast<size_t>(comm_.size());
    const Shape &mine = request.msg().shapes.at(0);
    const int64_t rowBytes = rowElements(mine) * static_cast<int64_t>(dtypeSize(request.msg().dtype));
    std::vector<int64_t> blocks(n);
    Shape outShape = mine;
    outShape[0] = 0;
    for (size_t r = 0; r < n; ++r) {
      blocks[r] = response.firstDims.at(r) * rowBytes;
      outShape[0] += response.firstDims[r];
    }
    const GatherPlan plan = planAllgather(blocks);
    char *out = static_cast<char *>(deviceOutput(request, outShape, static_cast<size_t>(plan.totalBytes)));
    const void *in = deviceTensors(request).at(0).in;
    if (plan.uniform) {
      comm_.call(ncclAllGather(in, out, static_cast<size_t>(blocks[0]), ncclUint8, comm_.get(), stream()),
                 "ncclAllGather");
    } else {
      GroupCalls group(comm_);
      for (size_t r = 0; r < n; ++r) {
        if (blocks[r] == 0) continue;
        group.add(ncclBroadcast(in, out + plan.offsets[r], static_cast<size_t>(blocks[r]), ncclUint8,
                                static_cast<int>(r), comm_.get(), stream()),
                  "ncclBroadcast (allgather with uneven blocks)");
      }
      group.close();
    }
    end(response, "allgather");
  }

  void runAlltoall(Request &request, const Response &response) {
    begin({&request});
    const size_t n = static_cast<size_t>(comm_.size()), me = static_cast<size_t>(comm_.rank());
    const Shape &mine = request.msg().shapes.at(0);
    const int64_t rowBytes = rowElements(mine) * static_cast<int64_t>(dtypeSize(request.msg().dtype));
    std::vector<int64_t> sendBytes(n), recvBytes(n);
    request.receivedSplits.assign(n, 0);
    Shape outShape = mine;
    outShape[0] = 0;
    int64_t total = 0;
    for (size_t r = 0; r < n; ++r) {
      sendBytes[r] = response.firstDims.at(me * n + r) * rowBytes;
      request.receivedSplits[r] = response.firstDims.at(r * n + me);
      recvBytes[r] = request.receivedSplits[r] * rowBytes;
      outShape[0] += request.receivedSplits[r];
      total += recvBytes[r];
    }
    const AlltoallPlan plan = planAlltoall(comm_.rank(), sendBytes, recvBytes);
    char *out = static_cast<char *>(deviceOutput(request, outShape, static_cast<size_t>(total)));
    const char *in = static_cast<const char *>(deviceTensors(request).at(0).in);
    copy(out + plan.selfRecvOffset, in + plan.selfSendOffset, static_cast<size_t>(plan.selfBytes));
    GroupCalls group(comm_);
    for (const Transfer &t : plan.transfers) {
      if (t.sendBytes > 0) {
        group.add(ncclSend(in + t.sendOffset, static_cast<size_t>(t.sendBytes), ncclUint8, t.peer,
                           comm_.get(), stream()),
                  "ncclSend (alltoall)");
      }
      if (t.recvBytes > 0) {
        group.add(ncclRecv(out + t.recvOffset, static_cast<size_t>(t.recvBytes), ncclUint8, t.peer,
                           comm_.get(), stream()),
                  "ncclRecv (alltoall)");
      }
    }
    group.close();
    end(response, "alltoall");
  }

  void runReducescatter(Request &request, const Response &response, int contributors) {
    begin({&request});
    const RequestMsg &agreed = response.agreed;
    const DType dtype = agreed.dtype;
    const size_t esize = dtypeSize(dtype);
    const size_t n = static_cast<size_t>(comm_.size()), me = static_cast<size_t>(comm_.rank());
    const Shape &shape = agreed.shapes.at(0);
    const int64_t rows = shape.at(0), rowElems = rowElements(shape);
    const int64_t setSize = static_cast<int64_t>(n);
    std::vector<int64_t> blockRows(n), counts(n);
    for (size_t r = 0; r < n; ++r) {  // rows / size each, one more for the first rows % size
      blockRows[r] = rows / setSize + (static_cast<int64_t>(r) < rows % setSize ? 1 : 0);
      counts[r] = blockRows[r] * rowElems;
    }
    Shape outShape = shape;
    outShape[0] = blockRows[me];
    char *out = static_cast<char *>(deviceOutput(request, outShape, static_cast<size_t>(counts[me]) * esize));
    const AllreducePlan plan = planAllreduce(dtype, agreed.reduceOp, agreed.prescale,
                                             agreed.postscale, contributors, comm_.size());
    std::unique_ptr<PreMulSum> premul;
    if (plan.premulSum) premul = std::make_unique<PreMulSum>(comm_, dtype, plan.premulFactor);
    const ncclRedOp_t op = premul ? premul->get() : static_cast<ncclRedOp_t>(plan.op);
    const char *in = static_cast<const char *>(deviceTensors(request).at(0).in);
    if (plan.kernelPrescale != 1.0) {  // scaled into the fusion buffer, the input stays as it was
      const int64_t total = rows * rowElems;
      char *buf = static_cast<char *>(fusion(static_cast<size_t>(total) * esize));
      copy(buf, in, static_cast<size_t>(total) * esize);
      scale(buf, total, dtype, plan.kernelPrescale);
      in = buf;
    }
    const ScatterPlan split = planReducescatter(counts);
    if (split.uniform) {
      comm_.call(ncclReduceScatter(in, out, static_cast<size_t>(counts[0]), toNccl(dtype), op,
                                   comm_.get(), stream()),
                 "ncclReduceScatter");
    } else {
      GroupCalls group(comm_);
      for (size_t r = 0; r < n; ++r) {
        if (counts[r] == 0) continue;
        group.add(ncclReduce(in + split.offsets[r] * static_cast<int64_t>(esize), out,
                             static_cast<size_t>(counts[r]), toNccl(dtype), op, static_cast<int>(r),
                             comm_.get(), stream()),
                  "ncclReduce (reducescatter with uneven blocks)");
      }
      group.close();
    }
    scale(out, counts[me], dtype, plan.kernelPostscale);
    end(response, "reducescatter");
  }

  cudaStream_t stream() const { return static_cast<cudaStream_t>(stream_.handle()); }

  static int64_t rowElements(const Shape &shape) {
    int64_t e = 1;
    for (size_t d = 1; d < shape.size(); ++d) e *= shape[d];
    return e;
  }

  // Every call starts here: on this device, after the callers' work.
  void begin(const std::vector<Request *> &requests) {
    nccl_device::setDevice(comm_.device());  // guarded() has checked the communicator
    scratch_.clear();
    for (Request *r : requests) {
      if (r->readyEvent) stream_.waitFor(r->readyEvent.get());
    }
  }

  // Waits until the stream has run everything queued, watching the communicator: an NCCL error
  // or HORA_TIMEOUT_S aborts it. The engine thread sleeps in growing naps meanwhile.
  void end(const Response &response, const char *op) {
    nccl_device::check(cudaEventRecord(done_, stream()), "cudaEventRecord");
    const auto deadline = Clock::now() + comm_.deadline();
    auto nap = std::chrono::microseconds(1);
    while (!nccl_device::eventDone(done_)) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_.get(), &state);
      if (r != ncclSuccess) state = r;
      if (state != ncclSuccess && state != ncclInProgress) {
        comm_.fail(HORA_ERR_BACKEND, detail::concat(op, " '", response.agreed.name, "': NCCL error ",
                                                    ncclGetErrorString(state)));
      }
      if (Clock::now() > deadline) {
        comm_.fail(HORA_ERR_TIMEOUT, detail::concat(op, " '", response.agreed.name, "': not done on cuda:",
                                                    comm_.device(), " after ", comm_.deadline().count() / 1e9,
                                                    " s (HORA_TIMEOUT_S)"));
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
    scratch_.clear();
  }

  // The request's tensors, or for a rank that joined (its stand-in holds host memory) zeroed
  // device scratch of the same sizes.
  std::vector<TensorArg> deviceTensors(Request &request) {
    if (!request.isStandIn()) return request.tensors();
    std::vector<TensorArg> out;
    const size_t esize = dtypeSize(request.msg().dtype);
    for (const TensorArg &t : request.tensors()) {
      const size_t bytes = static_cast<size_t>(t.numel) * esize;
      scratch_.push_back(std::make_unique<nccl_device::Buffer>(comm_.device(), bytes + 1));
      void *p = scratch_.back()->data();
      nccl_device::check(cudaMemsetAsync(p, 0, bytes + 1, stream()), "cudaMemsetAsync");
      out.push_back(TensorArg{p, p, t.numel});
    }
    return out;
  }

  // Device memory for an output hora allocates (allgather, alltoall, reducescatter), owned by the
  // request once it completes.
  void *deviceOutput(Request &request, const Shape &shape, size_t bytes) {
    auto buffer = std::make_shared<nccl_device::Buffer>(comm_.device(), bytes + 1);
    void *data = buffer->data();
    request.adoptOutput(std::shared_ptr<void>(buffer, data), data, shape);
    return data;
  }

  // Grows in 16 MiB steps, and only grows: a cudaMalloc/cudaFree pair synchronises the device.
  void *fusion(size_t bytes) {
    if (!fusion_ || fusion_->size() < bytes) {
      fusion_.reset();  // free first: the old and new buffers need not both fit
      constexpr size_t kStep = size_t{16} << 20;
      fusion_ = std::make_unique<nccl_device::Buffer>(comm_.device(), (bytes + kStep - 1) / kStep * kStep);
    }
    return fusion_->data();
  }

  void copy(void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    nccl_device::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()),
                       "cudaMemcpyAsync");
  }

  void scale(void *buf, int64_t count, DType dtype, double factor) {
    nccl_device::check(nccl_kernels::scale(buf, count, dtype, factor, stream()), "scaling kernel");
  }

  nccl_device::Stream stream_;
  cudaEvent_t done_ = nullptr;
  std::unique_ptr<nccl_device::Buffer> fusion_;
  std::vector<std::unique_ptr<nccl_device::Buffer>> scratch_;  // stand-ins' zeros, per call
  // Last: destroyed first, so that its kernels are finalised or aborted before the buffers
  // they use are freed (cudaFree waits for the device).
  Comm comm_;
};

}  // namespace

std::unique_ptr<DeviceExecutor> createNcclExecutor(ControlPlane &control, int device, int localRank,
                                                   double timeoutS) {
  if (device < 0) {  // no tensor of this rank named one (it joined): its local rank's GPU
    const int gpus = nccl_device::deviceCount();
    if (gpus == 0) HORA_THROW(HORA_ERR_BACKEND, "no CUDA device: ", nccl_device::whyNoDevice());
    device = localRank % gpus;
  }
  return std::make_unique<NcclExecutor>(control, device, timeoutS);
}

}  // namespace hora
