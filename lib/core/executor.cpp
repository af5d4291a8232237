// SPDX-License-Identifier: Apache-2.0
// Executor: the CPU-side work around each backend call.
#include "core/executor.h"

#include <cstring>

#include "base/error.h"

namespace hora {
namespace {

bool isHalf(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

void copyBytes(void *dst, const void *src, size_t n) {
  if (n != 0 && dst != src) std::memcpy(dst, src, n);
}

}  // namespace

void Executor::allreduce(const std::vector<Request *> &requests, const Response &response) {
  const RequestMsg &agreed = response.agreed;
  const DType dtype = agreed.dtype;
  const size_t esize = dtypeSize(dtype);
  const ReduceOp wireOp = agreed.reduceOp == ReduceOp::kAverage ? ReduceOp::kSum : agreed.reduceOp;
  const double pre = agreed.prescale;
  const double post =
      agreed.postscale * (agreed.reduceOp == ReduceOp::kAverage ? 1.0 / setSize_ : 1.0);

  std::vector<TensorArg> tensors;
  int64_t total = 0;
  for (Request *r : requests) {
    for (const TensorArg &t : r->tensors()) {
      tensors.push_back(t);
      total += t.numel;
    }
  }
  const bool widen = isHalf(dtype) && !backend_.reducesHalfNatively();

  if (!widen && tensors.size() == 1) {
    const TensorArg &t = tensors[0];
    if (pre != 1.0) {
      copyBytes(t.out, t.in, static_cast<size_t>(t.numel) * esize);
      scaleInPlace(t.out, t.numel, dtype, pre);
      backend_.allreduce(t.out, t.out, t.numel, dtype, wireOp);
    } else {
      backend_.allreduce(t.in, t.out, t.numel, dtype, wireOp);
    }
    if (post != 1.0) scaleInPlace(t.out, t.numel, dtype, post);
    return;
  }

  if (widen) {
    float *buf = static_cast<float *>(fusion_.get(static_cast<size_t>(total) * sizeof(float)));
    int64_t off = 0;
    for (const TensorArg &t : tensors) {
      widenToFloat(t.in, buf + off, t.numel, dtype, pre);
      off += t.numel;
    }
    backend_.allreduce(buf, buf, total, DType::kFloat32, wireOp);
    off = 0;
    for (const TensorArg &t : tensors) {
      narrowFromFloat(buf + off, t.out, t.numel, dtype, post);
      off += t.numel;
    }
    return;
  }

  auto *buf = static_cast<uint8_t *>(fusion_.get(static_cast<size_t>(total) * esize));
  size_t off = 0;
  for (const TensorArg &t : tensors) {
    copyBytes(buf + off, t.in, static_cast<size_t>(t.numel) * esize);
    off += static_cast<size_t>(t.numel) * esize;
  }
  if (pre != 1.0) scaleInPlace(buf, total, dtype, pre);
  backend_.allreduce(buf, buf, total, dtype, wireOp);
  if (post != 1.0) scaleInPlace(buf, total, dtype, post);
  off = 0;
  for (const TensorArg &t : tensors) {
    copyBytes(t.out, buf + off, static_cast<size_t>(t.numel) * esize);
    off += static_cast<size_t>(t.numel) * esize;
  }
}

void Executor::broadcast(Request &request, const Response &response) {
  const int64_t esize = static_cast<int64_t>(dtypeSize(response.agreed.dtype));
  for (const TensorArg &t : request.tensors()) {
    backend_.broadcast(t.out, t.numel * esize, response.agreed.root);
  }
}

void Executor::allgather(Request &request, const Response &response) {
  HORA_ENFORCE(request.tensors().size() == 1, "allgather of ", request.tensors().size(),
               " tensors");
  HORA_ENFORCE(response.firstDims.size() == static_cast<size_t>(setSize_),
               "allgather response has ", response.firstDims.size(), " first dimensions for ",
               setSize_, " ranks");
  const Shape &mine = request.msg().shapes.at(0);
  int64_t rowElems = 1;
  for (size_t d = 1; d < mine.size(); ++d) rowElems *= mine[d];
  const int64_t rowBytes = rowElems * static_cast<int64_t>(dtypeSize(request.msg().dtype));
  Shape outShape = mine;
  outShape[0] = 0;
  std::vector<int64_t> bytesPerRank;
  bytesPerRank.reserve(response.firstDims.size());
  for (int64_t rows : response.firstDims) {
    outShape[0] += rows;
    bytesPerRank.push_back(rows * rowBytes);
  }
  void *out = request.allocateOutput(outShape);
  backend_.allgatherv(request.tensors()[0].in, out, bytesPerRank);
}

}  // namespace hora
