// SPDX-License-Identifier: Apache-2.0
// One submitted collective with its independently computed expectation: submit now, check later.
#pragma once

#include <hora/hora.h>

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mp_harness.h"
#include "mp_ops.h"

namespace mp {

// Separating submit from check lets a test put many collectives, on several process sets, in
// flight at once and only then wait: that is what exercises concurrent negotiation. Every case
// computes what it expects from (set rank, set size) alone, never from another rank's data.
class Case {
 public:
  Case(std::string name, int32_t set) : name_(std::move(name)), set_(set) {}
  virtual ~Case() = default;
  Case(const Case &) = delete;
  Case &operator=(const Case &) = delete;

  const std::string &name() const { return name_; }
  int32_t set() const { return set_; }
  bool submitted() const { return static_cast<bool>(req_); }
  hora_request_t request() const { return req_.get(); }

  // Fills the input and submits; a refused submission is a test failure.
  void submit() {
    me_ = hora_process_set_rank(set_);
    n_ = hora_process_set_size(set_);
    hora_request_t req = nullptr;
    const hora_status_t s = doSubmit(&req);
    EXPECT_EQ(statusName(HORA_SUCCESS), statusName(s)) << name_ << ": " << lastError();
    if (s == HORA_SUCCESS) req_.reset(req);
  }

  // Waits and checks the result.
  void check() {
    if (!req_) return;
    const hora_status_t s = hora_wait(req_.get());
    EXPECT_EQ(statusName(HORA_SUCCESS), statusName(s)) << name_ << ": " << lastError();
    if (s == HORA_SUCCESS) doCheck();
    req_.reset();
  }

  void run() {
    submit();
    check();
  }

  // Polls until the request completes or `seconds` pass (scaled): a test that suspects a hang
  // (ops that may never pair up across ranks) fails with a message instead of tripping the watchdog.
  bool completesWithin(double seconds) const {
    return !req_ || mp::completesWithin(req_.get(), seconds);
  }

 protected:
  virtual hora_status_t doSubmit(hora_request_t *req) = 0;
  virtual void doCheck() = 0;

  // Output shape check shared by the ops whose output the runtime allocates.
  ::testing::AssertionResult outputShapeIs(const DLTensor *out, const DType &dt,
                                           const std::vector<int64_t> &shape) const {
    if (out == nullptr) return ::testing::AssertionFailure() << "no output";
    if (out->dtype.code != dt.code || out->dtype.bits != dt.bits || out->dtype.lanes != 1)
      return ::testing::AssertionFailure() << "output dtype differs from the input's";
    if (out->device.device_type != kDLCPU)
      return ::testing::AssertionFailure() << "output not on the CPU";
    if (out->ndim != static_cast<int>(shape.size()))
      return ::testing::AssertionFailure() << "output ndim " << out->ndim << ", expected " << shape.size();
    for (size_t d = 0; d < shape.size(); ++d) {
      if (out->shape[d] != shape[d])
        return ::testing::AssertionFailure() << "output dim " << d << " is " << out->shape[d]
                                             << ", expected " << shape[d];
    }
    if (product(shape) > 0 && out->data == nullptr)
      return ::testing::AssertionFailure() << "output data is NULL";
    return ::testing::AssertionSuccess();
  }

  std::string name_;
  int32_t set_;
  int me_ = -1, n_ = 0;
  Request req_;
};

// --- allreduce ---------------------------------------------------------------------------

class AllreduceCase : public Case {
 public:
  AllreduceCase(std::string name, int32_t set, const DType &dt, std::vector<int64_t> shape,
                hora_reduce_op_t op, int64_t salt, double pre = 1.0, double post = 1.0,
                bool unnamed = false)
      : Case(std::move(name), set), dt_(dt), shape_(std::move(shape)), op_(op), salt_(salt),
        pre_(pre), post_(post), unnamed_(unnamed) {}

 protected:
  hora_status_t doSubmit(hora_request_t *req) override {
    t_ = makeTensor(dt_, shape_);
    fillInputAs(*t_, op_, salt_, me_, n_);
    return hora_allreduce_async(unnamed_ ? nullptr : name_.c_str(), t_->dl(), t_->dl(), op_, pre_,
                                post_, set_, req);
  }
  void doCheck() override {
    EXPECT_TRUE(matchesReductionOf(*t_, op_, salt_, pre_, post_, n_)) << name_;
  }

 private:
  DType dt_;
  std::vector<int64_t> shape_;
  hora_reduce_op_t op_;
  int64_t salt_;
  double pre_, post_;
  bool unnamed_;
  std::unique_ptr<HostTensor> t_;
};

// --- broadcast ---------------------------------------------------------------------------

// Distinct per (rank, element, salt), so a rank that kept its own data is caught.
inline double bcValue(const DType &dt, int r, int64_t i, int64_t salt) {
  if (dt.floating && dt.bits >= 32) return r * 100000.0 + i * 3.0 + salt;
  const int64_t v = (r * 41 + i * 7 + salt * 13) % 100;
  return dt.isSigned ? static_cast<double>(v - 50) : static_cast<double>(v);
}

class BroadcastCase : public Case {
 public:
  BroadcastCase(std::string name, int32_t set, const DType &dt, std::vector<int64_t> shape,
                int root, int64_t salt, bool unnamed = false)
      : Case(std::move(name), set), dt_(dt), shape_(std::move(shape)), root_(root), salt_(salt),
        unnamed_(unnamed) {}

 protected:
  hora_status_t doSubmit(hora_request_t *req) override {
    t_ = makeTensor(dt_, shape_);
    t_->fill([&](int64_t i) { return bcValue(dt_, me_, i, salt_); });
    return hora_broadcast_async(unnamed_ ? nullptr : name_.c_str(), t_->dl(), root_, set_, req);
  }
  void doCheck() override {
    EXPECT_TRUE(matches(*t_, [&](int64_t i) { return bcValue(dt_, root_, i, salt_); }))
        << name_ << " (root " << root_ << " of the set)";
  }

 private:
  DType dt_;
  std::vector<int64_t> shape_;
  int root_;
  int64_t salt_;
  bool unnamed_;
  std::unique_ptr<HostTensor> t_;
};

// --- allgather ---------------------------------------------------------------------------

// Identifies (rank, row, column); narrow types wrap but still catch rows out of order.
inline double rowValue(const DType &dt, int r, int64_t row, int64_t col, int64_t salt) {
  if (dt.floating && dt.bits >= 32) return r * 1000000.0 + row * 64.0 + col + salt * 100000.0;
  const int64_t v = (r * 37 + row * 11 + col * 3 + salt * 7) % 100;
  return dt.isSigned ? static_cast<double>(v - 50) : static_cast<double>(v);
}

class AllgatherCase : public Case {
 public:
  // rowsOf(set rank) = rows that rank contributes.
  AllgatherCase(std::string name, int32_t set, const DType &dt, std::function<int64_t(int)> rowsOf,
                std::vector<int64_t> trailing, int64_t salt, bool unnamed = false)
      : Case(std::move(name), set), dt_(dt), rowsOf_(std::move(rowsOf)),
        trailing_(std::move(trailing)), salt_(salt), unnamed_(unnamed) {}

 protected:
  hora_status_t doSubmit(hora_request_t *req) override {
    std::vector<int64_t> shape = {rowsOf_(me_)};
    shape.insert(shape.end(), trailing_.begin(), trailing_.end());
    const int64_t w = product(trailing_);
    t_ = makeTensor(dt_, shape);
    t_->fill([&](int64_t i) { return rowValue(dt_, me_, i / w, i % w, salt_); });
    return hora_allgather_async(unnamed_ ? nullptr : name_.c_str(), t_->dl(), set_, req);
  }
  void doCheck() override {
    const int64_t w = product(trailing_);
    std::vector<std::pair<int, int64_t>> origin;  // (rank, row) of each output row
    for (int q = 0; q < n_; ++q)
      for (int64_t row = 0; row < rowsOf_(q); ++row) origin.emplace_back(q, row);
    std::vector<int64_t> shape = {static_cast<int64_t>(origin.size())};
    shape.insert(shape.end(), trailing_.begin(), trailing_.end());
    const DLTensor *out = hora_request_output(req_.get());
    const auto shapeOk = outputShapeIs(out, dt_, shape);
    EXPECT_TRUE(shapeOk) << name_;
    if (!shapeOk) return;
    EXPECT_TRUE(matches(*out, [&](int64_t i) {
      const auto &o = origin[static_cast<size_t>(i / w)];
      return rowValue(dt_, o.first, o.second, i % w, salt_);
    })) << name_;
  }

 private:
  DType dt_;
  std::function<int64_t(int)> rowsOf_;
  std::vector<int64_t> trailing_;
  int64_t salt_;
  bool unnamed_;
  std::unique_ptr<HostTensor> t_;
};

// --- alltoall ----------------------------------------------------------------------------

class AlltoallCase : public Case {
 public:
  // split(src, dst) = rows set rank src sends to set rank dst. nullSplits passes NULL (the
  // split must then be even).
  AlltoallCase(std::string name, int32_t set, const DType &dt,
               std::function<int64_t(int, int)> split, std::vector<int64_t> trailing,
               int64_t salt, bool nullSplits = false, bool unnamed = false)
      : Case(std::move(name), set), dt_(dt), split_(std::move(split)),
        trailing_(std::move(trailing)), salt_(salt), nullSplits_(nullSplits), unnamed_(unnamed) {}

 protected:
  hora_status_t doSubmit(hora_request_t *req) override {
    splits_.clear();
    int64_t rows = 0;
    for (int d = 0; d < n_; ++d) {
      splits_.push_back(split_(me_, d));
      rows += splits_.back();
    }
    std::vector<int64_t> shape = {rows};
    shape.insert(shape.end(), trailing_.begin(), trailing_.end());
    const int64_t w = product(trailing_);
    t_ = makeTensor(dt_, shape);
    t_->fill([&](int64_t i) { return rowValue(dt_, me_, i / w, i % w, salt_); });
    return hora_alltoall_async(unnamed_ ? nullptr : name_.c_str(), t_->dl(),
                               nullSplits_ ? nullptr : splits_.data(), set_, req);
  }
  void doCheck() override {
    const int64_t w = product(trailing_);
    // Rows arrive ordered by source rank; from source q come q's rows destined to ranks < me
    // skipped, then the split(q, me) rows for this rank.
    std::vector<std::pair<int, int64_t>> origin;
    for (int q = 0; q < n_; ++q) {
      int64_t first = 0;
      for (int d = 0; d < me_; ++d) first += split_(q, d);
      for (int64_t k = 0; k < split_(q, me_); ++k) origin.emplace_back(q, first + k);
    }
    std::vector<int64_t> shape = {static_cast<int64_t>(origin.size())};
    shape.insert(shape.end(), trailing_.begin(), trailing_.end());
    const DLTensor *out = hora_request_output(req_.get());
    const auto shapeOk = outputShapeIs(out, dt_, shape);
    EXPECT_TRUE(shapeOk) << name_;
    const int64_t *recv = hora_request_received_splits(req_.get());
    EXPECT_NE(nullptr, recv) << name_ << ": no received splits";
    if (recv != nullptr) {
      for (int q = 0; q < n_; ++q)
        EXPECT_EQ(split_(q, me_), recv[q]) << name_ << ": rows received from set rank " << q;
    }
    if (!shapeOk) return;
    EXPECT_TRUE(matches(*out, [&](int64_t i) {
      const auto &o = origin[static_cast<size_t>(i / w)];
      return rowValue(dt_, o.first, o.second, i % w, salt_);
    })) << name_;
    EXPECT_TRUE(matches(*t_, [&](int64_t i) { return rowValue(dt_, me_, i / w, i % w, salt_); }))
        << name_ << ": alltoall modified its input";
  }

 private:
  DType dt_;
  std::function<int64_t(int, int)> split_;
  std::vector<int64_t> trailing_;
  int64_t salt_;
  bool nullSplits_, unnamed_;
  std::vector<int64_t> splits_;
  std::unique_ptr<HostTensor> t_;
};

// --- reducescatter -----------------------------------------------------------------------

class ReducescatterCase : public Case {
 public:
  // shape is the full input, identical on every rank.
  ReducescatterCase(std::string name, int32_t set, const DType &dt, std::vector<int64_t> shape,
                    hora_reduce_op_t op, int64_t salt, bool unnamed = false)
      : Case(std::move(name), set), dt_(dt), shape_(std::move(shape)), op_(op), salt_(salt),
        unnamed_(unnamed) {}

 protected:
  hora_status_t doSubmit(hora_request_t *req) override {
    t_ = makeTensor(dt_, shape_);
    fillInputAs(*t_, op_, salt_, me_, n_);
    return hora_reducescatter_async(unnamed_ ? nullptr : name_.c_str(), t_->dl(), op_, set_, req);
  }
  void doCheck() override {
    const int64_t rows = shape_.at(0);
    const int64_t w = product(std::vector<int64_t>(shape_.begin() + 1, shape_.end()));
    std::vector<int64_t> shape = shape_;
    shape[0] = blockRows(rows, n_, me_);
    const DLTensor *out = hora_request_output(req_.get());
    const auto shapeOk = outputShapeIs(out, dt_, shape);
    EXPECT_TRUE(shapeOk) << name_;
    if (!shapeOk) return;
    EXPECT_TRUE(matchesReductionOf(*out, dt_, op_, salt_, n_, blockStart(rows, n_, me_) * w))
        << name_ << " (" << opName(op_) << ", block " << me_ << " of " << n_ << ")";
    EXPECT_TRUE(matches(*t_, [&](int64_t j) { return inputValue(op_, dt_, me_, n_, j, salt_); }))
        << name_ << ": reducescatter modified its input";
  }

 private:
  DType dt_;
  std::vector<int64_t> shape_;
  hora_reduce_op_t op_;
  int64_t salt_;
  bool unnamed_;
  std::unique_ptr<HostTensor> t_;
};

// Submits every case, then checks every one: all are in flight together.
inline void runAll(std::vector<std::unique_ptr<Case>> &cases) {
  for (auto &c : cases) c->submit();
  for (auto &c : cases) c->check();
}

}  // namespace mp
