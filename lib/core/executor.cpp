// SPDX-License-Identifier: Apache-2.0
// Executor: the CPU-side work around each backend call.
#include "core/executor.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"

namespace hora {
namespace {

bool isHalf(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

// Packing and unpacking: the vector copy of kernels.h, which has no slow relative alignment.
void packBytes(void *dst, const void *src, size_t n) {
  if (dst != src) copyBytes(dst, src, n);
}

}  // namespace

void Executor::allreduce(const std::vector<Request *> &requests, const Response &response) {
  const RequestMsg &agreed = response.agreed;
  const DType dtype = agreed.dtype;
  const size_t esize = dtypeSize(dtype);
  const ReduceOp wireOp = agreed.reduceOp == ReduceOp::kAverage ? ReduceOp::kSum : agreed.reduceOp;
  const double pre = agreed.prescale;
  const double post = postscaleFor(response);

  std::vector<TensorArg> tensors;
  std::vector<Backend::Span> spans;
  int64_t total = 0;
  for (Request *r : requests) {
    for (const TensorArg &t : r->tensors()) {
      tensors.push_back(t);
      spans.push_back({t.in, t.out, t.numel});
      total += t.numel;
    }
  }
  if (backend_.caps().reducesSpansInPlace) {
    Step step(*this, "REDUCE_IN_PLACE");
    backend_.allreduceSpans(spans, dtype, wireOp, pre, post);
    return;
  }

  const bool widen = isHalf(dtype) && !backend_.caps().reduces(dtype);

  if (!widen && tensors.size() == 1) {
    const TensorArg &t = tensors[0];
    if (pre != 1.0) {
      packBytes(t.out, t.in, static_cast<size_t>(t.numel) * esize);
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
    {
      Step step(*this, "FUSION_COPY_IN");
      for (const TensorArg &t : tensors) {
        widenToFloat(t.in, buf + off, t.numel, dtype, pre);
        off += t.numel;
      }
    }
    {
      Step step(*this, "COLLECTIVE");
      backend_.allreduce(buf, buf, total, DType::kFloat32, wireOp);
    }
    Step step(*this, "FUSION_COPY_OUT");
    off = 0;
    for (const TensorArg &t : tensors) {
      narrowFromFloat(buf + off, t.out, t.numel, dtype, post);
      off += t.numel;
    }
    return;
  }

  auto *buf = static_cast<uint8_t *>(fusion_.get(static_cast<size_t>(total) * esize));
  size_t off = 0;
  {
    Step step(*this, "FUSION_COPY_IN");
    for (const TensorArg &t : tensors) {
      packBytes(buf + off, t.in, static_cast<size_t>(t.numel) * esize);
      off += static_cast<size_t>(t.numel) * esize;
    }
    if (pre != 1.0) scaleInPlace(buf, total, dtype, pre);
  }
  {
    Step step(*this, "COLLECTIVE");
    backend_.allreduce(buf, buf, total, dtype, wireOp);
  }
  Step step(*this, "FUSION_COPY_OUT");
  if (post != 1.0) scaleInPlace(buf, total, dtype, post);
  off = 0;
  for (const TensorArg &t : tensors) {
    packBytes(t.out, buf + off, static_cast<size_t>(t.numel) * esize);
    off += static_cast<size_t>(t.numel) * esize;
  }
}

double Executor::postscaleFor(const Response &response) const {
  const RequestMsg &agreed = response.agreed;
  if (agreed.reduceOp != ReduceOp::kAverage) return agreed.postscale;
  const int contributors = setSize_ - static_cast<int>(response.joined.size());
  return agreed.postscale / std::max(1, contributors);
}

void Executor::broadcast(Request &request, const Response &response) {
  const int64_t esize = static_cast<int64_t>(dtypeSize(response.agreed.dtype));
  for (const TensorArg &t : request.tensors()) {
    backend_.broadcast(t.out, t.numel * esize, response.agreed.root);
  }
}

void Executor::allgather(const std::vector<Request *> &requests,
                         const std::vector<const Response *> &responses) {
  const size_t n = static_cast<size_t>(setSize_), me = static_cast<size_t>(rank_);
  struct Item {
    int64_t rowBytes = 0;
    std::vector<int64_t> rows;  // per rank
    char *out = nullptr;
  };
  std::vector<Item> items(requests.size());
  std::vector<int64_t> blockBytes(n, 0);  // per rank, all tensors
  for (size_t i = 0; i < requests.size(); ++i) {
    Request &request = *requests[i];
    const Response &response = *responses[i];
    HORA_ENFORCE(request.tensors().size() == 1 && response.firstDims.size() == n,
                 "allgather '", request.name(), "' with ", request.tensors().size(),
                 " tensors and ", response.firstDims.size(), " first dimensions");
    const Shape &mine = request.msg().shapes.at(0);
    int64_t rowElems = 1;
    for (size_t d = 1; d < mine.size(); ++d) rowElems *= mine[d];
    Item &item = items[i];
    item.rowBytes = rowElems * static_cast<int64_t>(dtypeSize(request.msg().dtype));
    item.rows = response.firstDims;
    Shape outShape = mine;
    outShape[0] = 0;
    for (size_t r = 0; r < n; ++r) {
      outShape[0] += item.rows[r];
      blockBytes[r] += item.rows[r] * item.rowBytes;
    }
    item.out = static_cast<char *>(request.allocateOutput(outShape));
  }
  if (requests.size() == 1) {
    backend_.allgatherv(requests[0]->tensors()[0].in, items[0].out, blockBytes);
    return;
  }
  std::vector<int64_t> offset(n, 0);
  int64_t total = 0;
  for (size_t r = 0; r < n; ++r) {
    offset[r] = total;
    total += blockBytes[r];
  }
  char *buf = static_cast<char *>(fusion_.get(static_cast<size_t>(total)));
  char *p = buf + offset[me];
  for (size_t i = 0; i < items.size(); ++i) {
    const size_t bytes = static_cast<size_t>(items[i].rows[me] * items[i].rowBytes);
    packBytes(p, requests[i]->tensors()[0].in, bytes);
    p += bytes;
  }
  backend_.allgatherv(buf + offset[me], buf, blockBytes);
  std::vector<int64_t> written(items.size(), 0);
  for (size_t r = 0; r < n; ++r) {
    const char *q = buf + offset[r];
    for (size_t i = 0; i < items.size(); ++i) {
      const int64_t bytes = items[i].rows[r] * items[i].rowBytes;
      packBytes(items[i].out + written[i], q, static_cast<size_t>(bytes));
      written[i] += bytes;
      q += bytes;
    }
  }
}

void Executor::alltoall(Request &request, const Response &response) {
  const size_t n = static_cast<size_t>(setSize_);
  HORA_ENFORCE(response.firstDims.size() == n * n, "alltoall response has ",
               response.firstDims.size(), " splits for ", setSize_, " ranks");
  const Shape &mine = request.msg().shapes.at(0);
  int64_t rowElems = 1;
  for (size_t d = 1; d < mine.size(); ++d) rowElems *= mine[d];
  const int64_t rowBytes = rowElems * static_cast<int64_t>(dtypeSize(request.msg().dtype));
  const size_t me = static_cast<size_t>(rank_);
  std::vector<int64_t> sendBytes(n), recvBytes(n);
  request.receivedSplits.assign(n, 0);
  Shape outShape = mine;
  outShape[0] = 0;
  for (size_t r = 0; r < n; ++r) {
    sendBytes[r] = response.firstDims[me * n + r] * rowBytes;
    const int64_t rows = response.firstDims[r * n + me];
    request.receivedSplits[r] = rows;
    recvBytes[r] = rows * rowBytes;
    outShape[0] += rows;
  }
  void *out = request.allocateOutput(outShape);
  backend_.alltoallv(request.tensors()[0].in, sendBytes, out, recvBytes);
}

void Executor::reducescatter(const std::vector<Request *> &requests,
                             const std::vector<const Response *> &responses) {
  const Response &first = *responses.front();
  const RequestMsg &agreed = first.agreed;
  const DType dtype = agreed.dtype;
  const size_t esize = dtypeSize(dtype);
  const size_t n = static_cast<size_t>(setSize_), me = static_cast<size_t>(rank_);
  const ReduceOp wireOp = agreed.reduceOp == ReduceOp::kAverage ? ReduceOp::kSum : agreed.reduceOp;
  const double pre = agreed.prescale;
  const double post = postscaleFor(first);

  struct Item {
    const void *in = nullptr;
    void *out = nullptr;
    std::vector<int64_t> count;  // elements of each rank's block
    std::vector<int64_t> start;  // where each rank's block starts in the input
  };
  std::vector<Item> items(requests.size());
  std::vector<int64_t> counts(n, 0);
  int64_t total = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Shape &shape = responses[i]->agreed.shapes.at(0);
    const int64_t rows = shape.at(0);
    int64_t rowElems = 1;
    for (size_t d = 1; d < shape.size(); ++d) rowElems *= shape[d];
    Item &item = items[i];
    item.in = requests[i]->tensors().at(0).in;
    int64_t at = 0;
    for (size_t r = 0; r < n; ++r) {
      const int64_t blockRows = rows / setSize_ + (static_cast<int64_t>(r) < rows % setSize_ ? 1 : 0);
      item.start.push_back(at);
      item.count.push_back(blockRows * rowElems);
      counts[r] += blockRows * rowElems;
      at += blockRows * rowElems;
      if (r == me) {
        Shape outShape = shape;
        outShape[0] = blockRows;
        item.out = requests[i]->allocateOutput(outShape);
      }
    }
    total += at;
  }
  const int64_t mine = counts[me];
  const bool widen = isHalf(dtype) && !backend_.caps().reduces(dtype);

  if (!widen && items.size() == 1) {
    const Item &item = items[0];
    const void *in = item.in;
    if (pre != 1.0) {
      void *buf = fusion_.get(static_cast<size_t>(total) * esize);
      packBytes(buf, item.in, static_cast<size_t>(total) * esize);
      scaleInPlace(buf, total, dtype, pre);
      in = buf;
    }
    backend_.reducescatter(in, item.out, counts, dtype, wireOp);
    if (post != 1.0) scaleInPlace(item.out, mine, dtype, post);
    return;
  }

  // Rank-major packing: rank 0's block of every tensor, then rank 1's, ...; this rank's reduced
  // blocks land after the packed input.
  const DType wire = widen ? DType::kFloat32 : dtype;
  const size_t wsize = dtypeSize(wire);
  char *buf = static_cast<char *>(fusion_.get(static_cast<size_t>(total + mine) * wsize));
  char *p = buf;
  for (size_t r = 0; r < n; ++r) {
    for (const Item &item : items) {
      const int64_t c = item.count[r];
      const char *src = static_cast<const char *>(item.in) + item.start[r] * static_cast<int64_t>(esize);
      if (widen) widenToFloat(src, reinterpret_cast<float *>(p), c, dtype, pre);
      else packBytes(p, src, static_cast<size_t>(c) * esize);
      p += c * static_cast<int64_t>(wsize);
    }
  }
  if (!widen && pre != 1.0) scaleInPlace(buf, total, dtype, pre);
  char *reduced = buf + total * static_cast<int64_t>(wsize);
  backend_.reducescatter(buf, reduced, counts, wire, wireOp);
  if (!widen && post != 1.0) scaleInPlace(reduced, mine, dtype, post);
  for (const Item &item : items) {
    const int64_t c = item.count[me];
    if (widen) narrowFromFloat(reinterpret_cast<const float *>(reduced), item.out, c, dtype, post);
    else packBytes(item.out, reduced, static_cast<size_t>(c) * esize);
    reduced += c * static_cast<int64_t>(wsize);
  }
}

}  // namespace hora
