// SPDX-License-Identifier: Apache-2.0
// A backend that adds to another (the shared segment's allreduce in front of a plane, the
// hierarchy in front of that): every call goes to the inner backend unless the subclass
// overrides it. Decorators derive from this instead of from Backend, so that a hook added to
// Backend later reaches the inner backend through every decorator without any of them knowing
// of it (a hook forwarded by hand in each decorator is silently dropped by the one that forgets).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "core/backend.h"

namespace hora {

class WrappingBackend : public Backend {
 public:
  explicit WrappingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  const char *name() const override { return inner_->name(); }
  const BackendCaps &caps() const override { return inner_->caps(); }
  ControlPlane *negotiationPlane() override { return inner_->negotiationPlane(); }
  PeerBell *peerBell() override { return inner_->peerBell(); }
  void andWords(std::vector<uint64_t> &words) override { inner_->andWords(words); }
  void interrupt(const Status &why) override { inner_->interrupt(why); }
  // The inner backend's, after a collective it ran; the subclass's own (ranHere) otherwise.
  const char *lastAlgorithm() const override { return here_ ? hereAlgorithm_ : inner_->lastAlgorithm(); }

  void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) override {
    here_ = false;
    inner_->allreduce(in, out, count, dtype, op);
  }
  void allreduceSpans(const std::vector<Span> &spans, DType dtype, ReduceOp op, double prescale,
                      double postscale) override {
    here_ = false;
    inner_->allreduceSpans(spans, dtype, op, prescale, postscale);
  }
  void broadcast(void *buf, int64_t bytes, int root) override {
    here_ = false;
    inner_->broadcast(buf, bytes, root);
  }
  void allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) override {
    here_ = false;
    inner_->allgatherv(in, out, bytesPerRank);
  }
  void alltoallv(const void *in, const std::vector<int64_t> &sendBytes, void *out,
                 const std::vector<int64_t> &recvBytes) override {
    here_ = false;
    inner_->alltoallv(in, sendBytes, out, recvBytes);
  }
  void reducescatter(const void *in, void *out, const std::vector<int64_t> &counts, DType dtype,
                     ReduceOp op) override {
    here_ = false;
    inner_->reducescatter(in, out, counts, dtype, op);
  }

 protected:
  Backend &inner() { return *inner_; }
  const Backend &inner() const { return *inner_; }
  // A collective the subclass ran itself: lastAlgorithm() says `algorithm` (static text, or
  // nullptr) until the next one.
  void ranHere(const char *algorithm) {
    here_ = true;
    hereAlgorithm_ = algorithm;
  }

 private:
  std::unique_ptr<Backend> inner_;
  bool here_ = false;
  const char *hereAlgorithm_ = nullptr;
};

}  // namespace hora
