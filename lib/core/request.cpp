// SPDX-License-Identifier: Apache-2.0
// Request completion and owned outputs.
#include "core/request.h"

#include <algorithm>
#include <cstring>

#include "core/op_table.h"

namespace hora {

Request::Request(RequestMsg msg, int32_t processSet, std::vector<TensorArg> tensors)
    : msg_(std::move(msg)),
      processSet_(processSet),
      tensors_(std::move(tensors)),
      submitted_(std::chrono::steady_clock::now()) {}

int64_t Request::bytes() const {
  int64_t n = 0;
  for (const TensorArg &t : tensors_) n += t.numel;
  return n * static_cast<int64_t>(dtypeSize(msg_.dtype));
}

std::shared_ptr<Request> Request::standIn(const Response &response, int32_t processSet) {
  RequestMsg msg = response.agreed;
  const size_t esize = dtypeSize(msg.dtype);
  const OpSpec &spec = opSpec(msg.op);
  const bool noRows = spec.firstDimFree;
  for (Shape &s : msg.shapes) {
    if (noRows && !s.empty()) s[0] = 0;
  }
  if (spec.firstDims == OpSpec::FirstDims::kSendSplits) {
    std::fill(msg.splits.begin(), msg.splits.end(), 0);
  }
  auto request = std::make_shared<Request>(msg, processSet, std::vector<TensorArg>{});
  request->standIn_ = true;
  if (!spec.carriesTensors) return request;
  for (const Shape &s : msg.shapes) {
    const int64_t n = numElements(s);
    request->scratch_.emplace_back(static_cast<size_t>(n) * esize + 1, uint8_t{0});
    void *data = request->scratch_.back().data();
    request->tensors_.push_back(TensorArg{data, data, n});
  }
  return request;
}

void *Request::allocateOutput(const Shape &shape) {
  const size_t bytes = static_cast<size_t>(numElements(shape)) * dtypeSize(msg_.dtype);
  // One spare byte keeps data non-null for empty outputs, as DLPack consumers expect.
  outputStorage_.reset(new uint8_t[bytes + 1]);
  return describeOutput(outputStorage_.get(), shape);
}

void Request::adoptOutput(std::shared_ptr<void> storage, void *data, const Shape &shape) {
  adoptedStorage_ = std::move(storage);
  describeOutput(data, shape);
}

void *Request::describeOutput(void *data, const Shape &shape) {
  outputShape_ = shape;
  output_ = DLTensor{};
  output_.data = data;
  output_.device = DLDevice{static_cast<DLDeviceType>(msg_.device.type), msg_.device.id};
  output_.ndim = static_cast<int32_t>(outputShape_.size());
  output_.shape = outputShape_.data();
  output_.strides = nullptr;
  output_.byte_offset = 0;
  switch (msg_.dtype) {
    case DType::kUInt8: output_.dtype = {kDLUInt, 8, 1}; break;
    case DType::kInt8: output_.dtype = {kDLInt, 8, 1}; break;
    case DType::kInt32: output_.dtype = {kDLInt, 32, 1}; break;
    case DType::kInt64: output_.dtype = {kDLInt, 64, 1}; break;
    case DType::kFloat16: output_.dtype = {kDLFloat, 16, 1}; break;
    case DType::kBFloat16: output_.dtype = {kDLBfloat, 16, 1}; break;
    case DType::kFloat32: output_.dtype = {kDLFloat, 32, 1}; break;
    case DType::kFloat64: output_.dtype = {kDLFloat, 64, 1}; break;
  }
  hasOutput_ = true;
  return output_.data;
}

void Request::complete(Status status) {
  if (settle(std::move(status))) wake();
}

bool Request::settle(Status status) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (done_) return false;
  done_ = true;
  status_ = std::move(status);
  return true;
}

void Request::wake() const { cv_.notify_all(); }

bool Request::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

Status Request::wait() const {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return done_; });
  return status_;
}

Status Request::status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return status_;
}

}  // namespace hora
