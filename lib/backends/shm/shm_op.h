// SPDX-License-Identifier: Apache-2.0
// One allreduce as the intra-host algorithms see it: what it reduces, this rank's tensors as one
// vector, and the check that every peer runs the same operation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/shm/shm_channel.h"
#include "base/dtype.h"
#include "core/backend.h"
#include "core/kernels.h"

namespace hora {

constexpr int64_t kShmSubBytes = 16 << 10;  // reduced, then published, while still in L1

struct ShmOp {
  uint64_t seq;  // allreduces run on the channel, counting this one: the same on every rank
  DType dtype;
  ReduceOp op;
  double pre;
  double post;
  size_t esize;
  int64_t total;  // elements over all spans
  bool half() const { return dtype == DType::kFloat16 || dtype == DType::kBFloat16; }
  // Shares of the vector are cut on multiples of this many elements (64 bytes).
  int64_t unit() const { return std::max<int64_t>(1, 64 / static_cast<int64_t>(esize)); }
};

// The operation over `spans` as the algorithms see it: element size and count (seq stays 0 until
// the caller numbers it).
inline ShmOp shmOpOver(const std::vector<Backend::Span> &spans, DType dtype, ReduceOp op, double pre,
                       double post) {
  ShmOp o{0, dtype, op, pre, post, dtypeSize(dtype), 0};
  for (const Backend::Span &s : spans) o.total += s.count;
  return o;
}

// Writes this rank's descriptor of `o` for the peers to check; `spans` is what the single-copy
// path publishes (ShmChannel::OpDescriptor::spans), 0 for the others.
void announce(ShmChannel &channel, const ShmOp &o, uint32_t spans);
// After the first barrier of an operation: every peer must be running the same one. Throws
// Error(HORA_ERR_INTERNAL) naming the first that is not.
void checkPeers(const ShmChannel &channel, const ShmOp &o);

// This rank's tensors as one vector of elements: which bytes of which tensor hold [a, b).
class SpanTable {
 public:
  void assign(const std::vector<Backend::Span> &spans) {
    spans_ = spans;
    start_.resize(spans.size() + 1);
    start_[0] = 0;
    for (size_t i = 0; i < spans.size(); ++i) start_[i + 1] = start_[i] + spans[i].count;
  }
  const std::vector<Backend::Span> &spans() const { return spans_; }

  // Calls fn(in, out, offsetInRange, count) for each piece of [a, b), in order.
  template <typename Fn>
  void forEach(int64_t a, int64_t b, size_t esize, Fn &&fn) const {
    size_t i = static_cast<size_t>(std::upper_bound(start_.begin(), start_.end(), a) - start_.begin()) - 1;
    for (int64_t at = a; at < b && i < spans_.size(); ++i) {
      const int64_t end = std::min(b, start_[i + 1]);
      if (end <= at) continue;
      const size_t skip = static_cast<size_t>(at - start_[i]) * esize;
      fn(static_cast<const char *>(spans_[i].in) + skip, static_cast<char *>(spans_[i].out) + skip,
         at - a, end - at);
      at = end;
    }
  }
  // Copies input elements [a, b) into dst / dst into output elements [a, b).
  // `copy` is copyBytes, or streamBytes where the caller fences before publishing.
  using Copy = void (*)(void *, const void *, size_t);
  void gatherIn(int64_t a, int64_t b, size_t esize, char *dst, Copy copy = copyBytes) const {
    forEach(a, b, esize, [&](const char *in, char *, int64_t at, int64_t n) {
      copy(dst + static_cast<size_t>(at) * esize, in, static_cast<size_t>(n) * esize);
    });
  }
  void scatterOut(int64_t a, int64_t b, size_t esize, const char *src) const {
    forEach(a, b, esize, [&](const char *, char *out, int64_t at, int64_t n) {
      copyBytes(out, src + static_cast<size_t>(at) * esize, static_cast<size_t>(n) * esize);
    });
  }

 private:
  std::vector<Backend::Span> spans_;
  std::vector<int64_t> start_;
};

}  // namespace hora
