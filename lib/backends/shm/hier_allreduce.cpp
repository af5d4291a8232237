// SPDX-License-Identifier: Apache-2.0
#include "backends/shm/hier_allreduce.h"

#include <algorithm>

#include "base/error.h"

namespace hora {
namespace {

// ShmBarrierState::Progress stages: windows each rank has exported, reduced (done reading the
// peers' exports), published (its reduced share in its result ring) and copied back.
constexpr int kHierExported = 0, kHierReduced = 1, kHierCopied = 2, kHierPublished = 3;
static_assert(kHierPublished < ShmBarrierState::kStages, "one progress counter per stage");

}  // namespace

// Three phases over the pipeline's windows (each cut into one share per owner on 64-byte
// multiples), where rank r of this host:
//   1. reduce-scatter: exports the owners' shares of its input (export ring); owner r, once every
//      rank has exported a window, reduces share r of it (its own input and every export, pre
//      applied) into its scratch, all windows' shares back to back;
//   2. across hosts: owner r allreduces its scratch with owner r of every other host, through the
//      set's cross-host plane (one call: the network sees one large message per owner);
//   3. allgather: owner r writes its final shares (post applied) into its output and its result
//      ring; every rank copies the owners' shares into its output.
// Phases 1 and 3 are pipelined as PipelinedAllreduce's stages are: a rank waits only for the
// counters of the data it needs, and a ring slot is rewritten kSlots windows later. Every rank of
// every host ends with the bits the cross step produced, which the plane makes the same on each
// of its ranks.
void HierAllreduce::run(const std::vector<Backend::Span> &spans, DType dtype, ReduceOp op, double pre,
                        double post) {
  ShmOp o = shmOpOver(spans, dtype, op, pre, post);
  if (o.total == 0) return;  // every rank agrees: the total is part of the response
  table_.assign(spans);
  o.seq = ++seq_;
  announce(channel_, o, 0);
  wide_ = o.half() && !halfAcross_;
  const int64_t unit = o.unit();
  const int64_t window = ShmChannel::kWindowBytes / static_cast<int64_t>(o.esize) / unit * unit;
  const int64_t n = (o.total + window - 1) / window;
  const uint64_t first = windows_;
  windows_ += static_cast<uint64_t>(n);
  auto range = [&](int64_t t) { return Range(t * window, std::min(o.total, (t + 1) * window)); };
  const int me = channel_.rank();
  if (owner()) {
    offsets_.assign(static_cast<size_t>(n + 1), 0);
    for (int64_t t = 0; t < n; ++t) {
      const Shares share = sharesOf(range(t), unit);
      offsets_[static_cast<size_t>(t + 1)] = offsets_[static_cast<size_t>(t)] + share(me + 1) - share(me);
    }
    scratch_.resize(static_cast<size_t>(offsets_.back()) * scratchElement(o));
  }

  // 1. Reduce-scatter inside the host. Every rank checks, once the peers have exported the first
  // window (and so announced this op), that they run the same one.
  for (int64_t t = 0; t <= n; ++t) {
    if (t < n) exportWindow(o, first + t, range(t), unit);
    if (t == 0) {
      channel_.barrier().awaitPeers(kHierExported, first + 1, "hierarchical allreduce (export)");
      checkPeers(channel_, o);
    }
    if (t >= 1 && owner()) reduceWindow(o, first + t - 1, t - 1, range(t - 1), unit);
  }

  // 2. Across hosts, then the post-scaling (float16/bfloat16 through float32 get it as they are
  // narrowed in phase 3).
  if (owner()) {
    const int64_t count = offsets_.back();
    if (count > 0) {
      try {
        cross_(scratch_.data(), count, wide_ ? DType::kFloat32 : o.dtype, o.op);
      } catch (const Error &e) {
        channel_.barrier().fail(e.status());  // the host's other ranks wait for this share
        throw;
      }
    }
    if (!wide_) scaleInPlace(scratch_.data(), count, o.dtype, o.post);
  }

  // 3. Allgather inside the host.
  for (int64_t t = 0; t <= n; ++t) {
    if (t < n) publishWindow(o, first + t, t, range(t), unit);
    if (t >= 1) copyWindow(o, first + t - 1, range(t - 1), unit);
  }
}

void HierAllreduce::exportWindow(const ShmOp &o, uint64_t w, Range range, int64_t unit) {
  ShmBarrier &barrier = channel_.barrier();
  if (w >= ShmChannel::kSlots) {
    barrier.awaitPeers(kHierReduced, w - ShmChannel::kSlots + 1, "hierarchical allreduce (export)");
  }
  const Shares share = sharesOf(range, unit);
  char *exported = channel_.exportSlot(channel_.rank(), w);
  for (int r = 0; r < owners_; ++r) {
    if (r == channel_.rank()) continue;
    table_.gatherIn(share(r), share(r + 1), o.esize, exported + static_cast<size_t>(share(r) - share.a) * o.esize);
  }
  barrier.publish(kHierExported, w + 1);
  if (!owner()) barrier.publish(kHierReduced, w + 1);  // it reads no export
}

void HierAllreduce::reduceWindow(const ShmOp &o, uint64_t w, int64_t t, Range range, int64_t unit) {
  ShmBarrier &barrier = channel_.barrier();
  const int me = channel_.rank(), size = channel_.size();
  barrier.awaitPeers(kHierExported, w + 1, "hierarchical allreduce (reduce)");
  const Shares share = sharesOf(range, unit);
  const int64_t a = share(me), c = share(me + 1) - a;
  const size_t offset = static_cast<size_t>(a - share.a) * o.esize;  // in the window
  char *dst = scratchAt(o, t);
  if (c > 0 && o.half()) {
    // In float32 over the whole host, rounded once (if at all) before crossing.
    acc_.resize(static_cast<size_t>(c));
    staged_.resize(static_cast<size_t>(c) * o.esize);
    table_.gatherIn(a, a + c, o.esize, staged_.data());
    widenToFloat(staged_.data(), acc_.data(), c, o.dtype, o.pre);
    for (int r = 0; r < size; ++r) {
      if (r != me) reduceWidenedInto(acc_.data(), channel_.exportSlot(r, w) + offset, c, o.dtype, o.op, o.pre);
    }
    if (wide_) {
      copyBytes(dst, acc_.data(), static_cast<size_t>(c) * sizeof(float));
    } else {
      narrowFromFloat(acc_.data(), dst, c, o.dtype, 1.0);
    }
  } else if (c > 0) {
    const int64_t sub = kShmSubBytes / static_cast<int64_t>(o.esize);
    for (int64_t s = 0; s < c; s += sub) {  // an L1-sized piece at a time
      const int64_t m = std::min(sub, c - s);
      char *piece = dst + static_cast<size_t>(s) * o.esize;
      const size_t from = offset + static_cast<size_t>(s) * o.esize;
      table_.gatherIn(a + s, a + s + m, o.esize, piece);
      scaleInPlace(piece, m, o.dtype, o.pre);
      for (int r = 0; r < size; ++r) {
        if (r != me) reduceScaledInto(piece, channel_.exportSlot(r, w) + from, m, o.dtype, o.op, o.pre);
      }
    }
  }
  barrier.publish(kHierReduced, w + 1);
}

void HierAllreduce::publishWindow(const ShmOp &o, uint64_t w, int64_t t, Range range, int64_t unit) {
  ShmBarrier &barrier = channel_.barrier();
  if (owner()) {
    if (w >= ShmChannel::kSlots) {
      barrier.awaitPeers(kHierCopied, w - ShmChannel::kSlots + 1, "hierarchical allreduce (publish)");
    }
    const Shares share = sharesOf(range, unit);
    const int me = channel_.rank();
    const int64_t a = share(me), c = share(me + 1) - a;
    char *result = channel_.resultSlot(me, w) + static_cast<size_t>(a - share.a) * o.esize;
    if (c > 0) {
      if (wide_) {
        narrowFromFloat(reinterpret_cast<const float *>(scratchAt(o, t)), result, c, o.dtype, o.post);
      } else {
        copyBytes(result, scratchAt(o, t), static_cast<size_t>(c) * o.esize);
      }
      table_.scatterOut(a, a + c, o.esize, result);
    }
  }
  barrier.publish(kHierPublished, w + 1);
}

void HierAllreduce::copyWindow(const ShmOp &o, uint64_t w, Range range, int64_t unit) {
  channel_.barrier().awaitPeers(kHierPublished, w + 1, "hierarchical allreduce (gather)");
  const Shares share = sharesOf(range, unit);
  const int me = channel_.rank();
  for (int step = 1; step <= owners_; ++step) {
    const int r = (me + step) % owners_;  // staggered: ranks do not all read one owner at once
    if (r == me) continue;
    table_.scatterOut(share(r), share(r + 1), o.esize,
                      channel_.resultSlot(r, w) + static_cast<size_t>(share(r) - share.a) * o.esize);
  }
  channel_.barrier().publish(kHierCopied, w + 1);
}

}  // namespace hora
