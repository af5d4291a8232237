// SPDX-License-Identifier: Apache-2.0
// Request completion and owned outputs.
#include "core/request.h"

#include <algorithm>
#include <cstring>

#include "core/device_executor.h"
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
    case DType::kInt16: output_.dtype = {kDLInt, 16, 1}; break;
    case DType::kInt32: output_.dtype = {kDLInt, 32, 1}; break;
    case DType::kInt64: output_.dtype = {kDLInt, 64, 1}; break;
    case DType::kFloat16: output_.dtype = {kDLFloat, 16, 1}; break;
    case DType::kBFloat16: output_.dtype = {kDLBfloat, 16, 1}; break;
    case DType::kFloat32: output_.dtype = {kDLFloat, 32, 1}; break;
    case DType::kFloat64: output_.dtype = {kDLFloat, 64, 1}; break;
    case DType::kBool: output_.dtype = {kDLBoolCode, 8, 1}; break;
  }
  hasOutput_ = true;
  return output_.data;
}

void Request::complete(Status status) {
  if (settle(std::move(status))) wake();
}

bool Request::settle(Status status) {
  std::shared_ptr<DeviceEnd> end;  // dropped outside the lock: it gives an event back
  std::lock_guard<std::mutex> lock(mutex_);
  if (done_) return false;
  done_ = true;
  status_ = std::move(status);
  end.swap(end_);
  return true;
}

void Request::launched(std::shared_ptr<DeviceEnd> end) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;
    end_ = std::move(end);
  }
  cv_.notify_all();
}

bool Request::isLaunched() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !done_ && end_ != nullptr;
}

// Under the lock, so that the end cannot be dropped (its event given back to the pool and
// recorded for a later op) between the check and the stream's wait.
Status Request::waitOnStream(void *stream) const {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return done_ || end_ != nullptr; });
  if (done_) return status_;
  end_->streamWait(stream);
  return Status::success();
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

namespace {
// A token's bits, high to low: 1 (the tag), the generation, 1 + the slot index.
constexpr unsigned kTokenBits = sizeof(uintptr_t) * 8;
constexpr unsigned kIndexBits = kTokenBits >= 64 ? 32 : 20;
constexpr unsigned kGenerationBits = kTokenBits - 1 - kIndexBits;
constexpr uintptr_t kTag = uintptr_t{1} << (kTokenBits - 1);
constexpr uintptr_t kIndexMask = (uintptr_t{1} << kIndexBits) - 1;
constexpr uintptr_t kGenerationMask = (uintptr_t{1} << kGenerationBits) - 1;
}  // namespace

uintptr_t RequestHandles::add(RequestPtr request) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    if (slots_.size() >= kIndexMask) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "too many live requests (", slots_.size(),
                 "): free the finished ones with hora_request_free");
    }
    index = slots_.size();
    slots_.emplace_back();
  }
  Slot &slot = slots_[index];
  slot.request = std::move(request);
  ++live_;
  return kTag | (slot.generation << kIndexBits) | static_cast<uintptr_t>(index + 1);
}

bool RequestHandles::decode(uintptr_t token, size_t *index) const {
  if ((token & kTag) == 0) return false;
  const uintptr_t slot = token & kIndexMask;
  if (slot == 0 || slot > slots_.size()) return false;
  *index = static_cast<size_t>(slot - 1);
  const Slot &s = slots_[*index];
  return s.request != nullptr && s.generation == ((token & ~kTag) >> kIndexBits);
}

RequestPtr RequestHandles::find(uintptr_t token) const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t index;
  return decode(token, &index) ? slots_[index].request : nullptr;
}

RequestPtr RequestHandles::remove(uintptr_t token) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t index;
  if (!decode(token, &index)) return nullptr;
  Slot &slot = slots_[index];
  RequestPtr request = std::move(slot.request);
  slot.request = nullptr;
  slot.generation = (slot.generation + 1) & kGenerationMask;
  if (slot.generation == 0) slot.generation = 1;
  free_.push_back(index);
  --live_;
  return request;
}

size_t RequestHandles::live() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

}  // namespace hora
