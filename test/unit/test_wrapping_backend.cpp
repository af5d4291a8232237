// SPDX-License-Identifier: Apache-2.0
// WrappingBackend: a decorator that overrides nothing passes every call, hook and answer of
// Backend to the inner backend; one that runs a collective itself names its own algorithm
// until the next forwarded one.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/wrapping_backend.h"

namespace hora {
namespace {

// Records every call it gets, in order.
class Recorder final : public Backend {
 public:
  explicit Recorder(std::vector<std::string> &calls) : calls_(calls) { caps_.negotiationWords = 7; }
  const char *name() const override { return "recorder"; }
  const BackendCaps &caps() const override { return caps_; }
  void allreduce(const void *, void *, int64_t, DType, ReduceOp) override { calls_.push_back("allreduce"); }
  void allreduceSpans(const std::vector<Span> &, DType, ReduceOp, double, double) override {
    calls_.push_back("allreduceSpans");
  }
  void andWords(std::vector<uint64_t> &) override { calls_.push_back("andWords"); }
  ControlPlane *negotiationPlane() override {
    calls_.push_back("negotiationPlane");
    return nullptr;
  }
  PeerBell *peerBell() override {
    calls_.push_back("peerBell");
    return nullptr;
  }
  void interrupt(const Status &why) override { calls_.push_back("interrupt " + why.message); }
  const char *lastAlgorithm() const override { return "inner's"; }
  void broadcast(void *, int64_t, int) override { calls_.push_back("broadcast"); }
  void allgatherv(const void *, void *, const std::vector<int64_t> &) override { calls_.push_back("allgatherv"); }
  void alltoallv(const void *, const std::vector<int64_t> &, void *, const std::vector<int64_t> &) override {
    calls_.push_back("alltoallv");
  }
  void reducescatter(const void *, void *, const std::vector<int64_t> &, DType, ReduceOp) override {
    calls_.push_back("reducescatter");
  }
 private:
  std::vector<std::string> &calls_;
  BackendCaps caps_;
};

class Transparent final : public WrappingBackend {
 public:
  using WrappingBackend::WrappingBackend;
};

// Runs allreduce itself; everything else is the inner backend's.
class OwnAllreduce final : public WrappingBackend {
 public:
  using WrappingBackend::WrappingBackend;
  void allreduce(const void *, void *, int64_t, DType, ReduceOp) override { ranHere("own"); }
};

TEST(WrappingBackend, EveryCallAndHookReachesTheInnerBackend) {
  std::vector<std::string> calls;
  Transparent outer(std::make_unique<Recorder>(calls));
  EXPECT_STREQ(outer.name(), "recorder");
  EXPECT_EQ(outer.caps().negotiationWords, 7);
  EXPECT_EQ(outer.negotiationPlane(), nullptr);
  EXPECT_EQ(outer.peerBell(), nullptr);
  float x = 1.0f;
  std::vector<uint64_t> words(1);
  outer.allreduce(&x, &x, 1, DType::kFloat32, ReduceOp::kSum);
  outer.allreduceSpans({{&x, &x, 1}}, DType::kFloat32, ReduceOp::kSum, 1.0, 1.0);
  outer.andWords(words);
  outer.broadcast(&x, 4, 0);
  outer.allgatherv(&x, &x, {4});
  outer.alltoallv(&x, {4}, &x, {4});
  outer.reducescatter(&x, &x, {1}, DType::kFloat32, ReduceOp::kSum);
  outer.interrupt(Status{HORA_ERR_SHUT_DOWN, "why"});
  EXPECT_EQ(calls, (std::vector<std::string>{"negotiationPlane", "peerBell", "allreduce", "allreduceSpans", "andWords", "broadcast", "allgatherv",
                                             "alltoallv", "reducescatter", "interrupt why"}));
  EXPECT_STREQ(outer.lastAlgorithm(), "inner's");
}

TEST(WrappingBackend, ACollectiveRunHereNamesItsOwnAlgorithmUntilTheNextForwardedOne) {
  std::vector<std::string> calls;
  OwnAllreduce outer(std::make_unique<Recorder>(calls));
  float x = 1.0f;
  outer.allreduce(&x, &x, 1, DType::kFloat32, ReduceOp::kSum);
  EXPECT_TRUE(calls.empty()) << "run here, not forwarded";
  EXPECT_STREQ(outer.lastAlgorithm(), "own");
  outer.broadcast(&x, 4, 0);
  EXPECT_STREQ(outer.lastAlgorithm(), "inner's");
}

}  // namespace
}  // namespace hora
