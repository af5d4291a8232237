// SPDX-License-Identifier: Apache-2.0
#include "core/collectives/link_backend.h"

#include <cstring>

#include "core/forming.h"
#include "core/kernels.h"

namespace hora {
namespace {

// The collective in the engine's words, or while a group forms (the phase names the purpose)
// in plain ones.
const char *label(const char *negotiating, const char *forming) {
  return FormingScope::current().empty() ? negotiating : forming;
}

// The lock that whoever drives `link` holds, if it has one.
std::unique_lock<std::mutex> holdDrive(Link &link) {
  std::mutex *m = link.driveLock();
  return m != nullptr ? std::unique_lock<std::mutex>(*m) : std::unique_lock<std::mutex>();
}

collectives::Combine combineFor(DType dtype, ReduceOp op) {
  return [dtype, op](void *dst, const void *src, int64_t count) { reduceInto(dst, src, count, dtype, op); };
}

}  // namespace

void LinkControlPlane::allreduceAnd(std::vector<uint64_t> &words) {
  if (words.empty() || size() == 1) return;
  static const collectives::Choices kByRule;
  static const collectives::Combine kAnd = [](void *dst, const void *src, int64_t n) {
    auto *d = static_cast<uint64_t *>(dst);
    const auto *s = static_cast<const uint64_t *>(src);
    for (int64_t i = 0; i < n; ++i) d[i] &= s[i];
  };
  auto hold = holdDrive(*link_);
  link_->guard(label("negotiation (waiting for every rank to start the same cycle)",
                     "the AND of every rank's words"),
               [&] {
                 collectives::allreduce(*link_, kByRule, words.data(), static_cast<int64_t>(words.size()),
                                        sizeof(uint64_t), kAnd, scratch_);
               });
}

std::vector<std::string> LinkControlPlane::gatherToRoot(const std::string &blob) {
  if (size() == 1) return {blob};
  std::vector<std::string> out;
  auto hold = holdDrive(*link_);
  link_->guard(label("negotiation (gathering requests at the coordinator)",
                     "gathering every rank's words at rank 0"),
               [&] { out = collectives::gatherBlobs(*link_, blob); });
  return out;
}

void LinkControlPlane::broadcastFromRoot(std::string &blob) {
  if (size() == 1) return;
  auto hold = holdDrive(*link_);
  link_->guard(label("negotiation (waiting for the coordinator's responses)",
                     "rank 0's words to every rank"),
               [&] { collectives::broadcastBlob(*link_, blob); });
}

LinkBackend::LinkBackend(std::shared_ptr<Link> link, const BackendCaps &caps, const Knobs &knobs,
                         bool negotiates)
    : link_(link), caps_(caps), choices_(collectives::Choices::parse(knobs.algorithm)),
      negotiates_(negotiates), control_(std::move(link)) {}

template <typename Body>
void LinkBackend::drive(const char *what, Body &&body) {
  auto hold = holdDrive(*link_);
  last_ = nullptr;
  if (link_->size() == 1) return;
  link_->guard(what, [&] { last_ = body(); });
}

void LinkBackend::allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  if (dtype == DType::kBool) {
    normalizeBools(out, in, count);  // a set of one reduces nothing, yet its result is 0 or 1
  } else if (in != out) {
    copyBytes(out, in, static_cast<size_t>(count) * dtypeSize(dtype));
  }
  const collectives::Combine combine = combineFor(dtype, op);
  drive("allreduce", [&] {
    return collectives::allreduce(*link_, choices_, out, count, dtypeSize(dtype), combine, scratch_);
  });
}

void LinkBackend::broadcast(void *buf, int64_t bytes, int root) {
  if (bytes == 0) return;
  drive("broadcast", [&] { return collectives::broadcast(*link_, choices_, buf, static_cast<size_t>(bytes), root); });
}

void LinkBackend::allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) {
  if (link_->size() == 1) {
    if (out != in && bytesPerRank[0] > 0) std::memmove(out, in, static_cast<size_t>(bytesPerRank[0]));
    return;
  }
  drive("allgatherv", [&] { return collectives::allgatherv(*link_, choices_, in, out, bytesPerRank); });
}

void LinkBackend::alltoallv(const void *in, const std::vector<int64_t> &sendBytes, void *out,
                            const std::vector<int64_t> &recvBytes) {
  if (link_->size() == 1) {
    if (out != in && sendBytes[0] > 0) std::memmove(out, in, static_cast<size_t>(sendBytes[0]));
    return;
  }
  drive("alltoallv", [&] { return collectives::alltoallv(*link_, choices_, in, sendBytes, out, recvBytes); });
}

void LinkBackend::reducescatter(const void *in, void *out, const std::vector<int64_t> &counts,
                                DType dtype, ReduceOp op) {
  const size_t esize = dtypeSize(dtype);
  const auto me = static_cast<size_t>(link_->rank());
  int64_t total = 0, before = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (r < me) before += counts[r];
    total += counts[r];
  }
  if (total == 0) return;
  work_.resize(static_cast<size_t>(total) * esize);
  if (dtype == DType::kBool) {
    normalizeBools(work_.data(), in, total);
  } else {
    copyBytes(work_.data(), in, static_cast<size_t>(total) * esize);
  }
  const collectives::Combine combine = combineFor(dtype, op);
  drive("reducescatter", [&] {
    return collectives::reducescatter(*link_, choices_, work_.data(), counts, esize, combine, scratch_);
  });
  if (counts[me] > 0) {
    copyBytes(out, work_.data() + static_cast<size_t>(before) * esize, static_cast<size_t>(counts[me]) * esize);
  }
}

}  // namespace hora
