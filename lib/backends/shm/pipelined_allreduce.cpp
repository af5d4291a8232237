// SPDX-License-Identifier: Apache-2.0
#include "backends/shm/pipelined_allreduce.h"

#include <algorithm>

#include "base/logging.h"

namespace hora {
namespace {

// ShmBarrierState::Progress stages of the pipeline: windows each rank has exported, reduced
// (its share, published) and copied back.
constexpr int kExported = 0, kReduced = 1, kCopied = 2;
static_assert(kCopied < ShmBarrierState::kStages, "one progress counter per stage");
// HORA_SHM_STREAM=auto: rank 0 times a cache line bounced with each peer at the first pipelined
// operation and then every kProbeEvery windows (64 MiB), and ranks stream while that round trip
// is over kFarNs: about 60 ns between cores under one L3 here, 310 ns when the VM's two vCPUs
// sit on different CCDs of the host, which happens for minutes at a time.
constexpr uint64_t kProbeEvery = 128;
constexpr int kProbeRounds = 32;
constexpr double kFarNs = 150;

}  // namespace

// A pipeline over windows of the vector, each cut into one share per rank on 64-byte multiples.
// Rank r, for window w:
//   export:    copies each peer's share of its input into its export ring;
//   reduce:    once every peer has exported w, reduces share r (its own input and the peers'
//              exports) into its output and publishes it in its result ring;
//   copy back: once every peer has reduced w, copies their results into its output.
// A rank runs export(w), reduce(w - 1), copy back(w - 2) in turn and waits only for the counters
// of the data it needs (ShmBarrier::awaitPeers), never for a barrier of everyone: a rank that
// falls up to a window behind (a preempted core, a page fault) costs nothing, where lockstep
// barriers made every such stall everyone's, and on a busy VM kept both ranks sleeping and
// waking. A ring slot is rewritten kSlots windows later, once every peer is done with it. Windows
// are numbered across operations, the same on every rank.
void PipelinedAllreduce::run(const ShmOp &o, const SpanTable &table, bool checked) {
  const int64_t unit = o.unit();
  const int64_t window = ShmChannel::kWindowBytes / static_cast<int64_t>(o.esize) / unit * unit;
  const int64_t n = (o.total + window - 1) / window;
  const uint64_t first = windows_;
  // Timing a round trip means spinning on it, which an oversubscribed host cannot afford and
  // where it would time the scheduler: there the stores stay cached.
  if (probeStream_ && channel_.coreEach() && first >= nextProbe_) probe(first);
  windows_ += static_cast<uint64_t>(n);
  auto range = [&](int64_t t) { return Range(t * window, std::min(o.total, (t + 1) * window)); };
  for (int64_t t = 0; t < n + 2; ++t) {
    if (t + 1 < n) touchPages(o, table, range(t + 1));
    if (t < n) exportWindow(o, table, first + t, range(t), unit);
    if (t >= 1 && t <= n) reduceWindow(o, table, first + t - 1, range(t - 1), unit, !checked && t == 1);
    if (t >= 2) copyBackWindow(o, table, first + t - 2, range(t - 2), unit);
  }
}

// One prefetch per 4 KiB page of the next window's input: the hardware prefetchers stop at page
// boundaries and each new page starts with a page walk, which under a VM's nested paging is
// long; started a window early, the walks overlap this window's copies (ResNet-50 step here
// about 5% faster).
void PipelinedAllreduce::touchPages(const ShmOp &o, const SpanTable &table, Range range) const {
  table.forEach(range.first, range.second, o.esize, [&](const char *in, char *, int64_t, int64_t c) {
    const char *end = in + static_cast<size_t>(c) * o.esize;
    for (const char *p = in; p < end; p += 4096) __builtin_prefetch(p, 0, 0);
  });
}

// Collective (every rank calls it at the same window): rank 0 bounces a cache line with each
// peer in turn, and each rank streams while its own link to rank 0 is slow (rank 0: any link).
// Cached stores hand the staged data to a reader through the shared L3; where the ranks share
// none, every line moves between the two cores' caches one at a time, and in one run here
// that made the data path 4-5 times slower than going through memory with streaming stores.
void PipelinedAllreduce::probe(uint64_t window) {
  const int rank = channel_.rank();
  nextProbe_ = window + kProbeEvery;
  double worst = 0;
  for (int r = 1; r < channel_.size(); ++r) {
    if (rank == 0 || rank == r) {
      worst = std::max(worst, channel_.barrier().pingPong(rank == 0 ? r : 0, kProbeRounds));
    }
  }
  const bool far = worst > kFarNs;
  if (far != stream_) {
    HORA_LOG(kInfo) << "shared-memory allreduce: cache-line round trip " << static_cast<int>(worst)
                    << " ns to " << (rank == 0 ? "the slowest peer" : "rank 0") << "; "
                    << (far ? "streaming the staged data through memory" : "cached stores");
  }
  stream_ = far;
}

void PipelinedAllreduce::exportWindow(const ShmOp &o, const SpanTable &table, uint64_t w,
                                      Range range, int64_t unit) {
  ShmBarrier &barrier = channel_.barrier();
  if (w >= ShmChannel::kSlots) barrier.awaitPeers(kReduced, w - ShmChannel::kSlots + 1, "allreduce (export)");
  const Shares share = sharesOf(range, unit);
  char *exported = channel_.exportSlot(channel_.rank(), w);
  for (int r = 0; r < channel_.size(); ++r) {
    if (r == channel_.rank()) continue;
    table.gatherIn(share(r), share(r + 1), o.esize,
                   exported + static_cast<size_t>(share(r) - share.a) * o.esize, publishCopy());
  }
  if (stream_) streamFence();
  barrier.publish(kExported, w + 1);
}

void PipelinedAllreduce::reduceWindow(const ShmOp &o, const SpanTable &table, uint64_t w,
                                      Range range, int64_t unit, bool check) {
  ShmBarrier &barrier = channel_.barrier();
  const int rank = channel_.rank(), size = channel_.size();
  barrier.awaitPeers(kExported, w + 1, "allreduce (reduce)");
  if (check) checkPeers(channel_, o);
  if (w >= ShmChannel::kSlots) barrier.awaitPeers(kCopied, w - ShmChannel::kSlots + 1, "allreduce (reduce)");
  const Shares share = sharesOf(range, unit);
  const int64_t mineA = share(rank), mineB = share(rank + 1), n = mineB - mineA;
  char *result = channel_.resultSlot(rank, w);
  const size_t offset = static_cast<size_t>(mineA - share.a) * o.esize;  // in the window
  if (n > 0 && o.half()) {
    acc_.resize(static_cast<size_t>(n));
    table.gatherIn(mineA, mineB, o.esize, result);  // staged, then widened in cache
    widenToFloat(result, acc_.data(), n, o.dtype, o.pre);
    for (int r = 0; r < size; ++r) {
      if (r != rank) {
        reduceWidenedInto(acc_.data(), channel_.exportSlot(r, w) + offset, n, o.dtype, o.op, o.pre);
      }
    }
    narrowFromFloat(acc_.data(), result, n, o.dtype, o.post);
    table.scatterOut(mineA, mineB, o.esize, result);
  } else if (n > 0) {
    // Reduced in the output tensors themselves, a piece small enough for L1 at a time, and
    // published from there: the share crosses memory once each way.
    const int64_t sub = kShmSubBytes / static_cast<int64_t>(o.esize);
    const SpanTable::Copy publish = publishCopy();
    table.forEach(mineA, mineB, o.esize, [&](const char *in, char *out, int64_t at, int64_t c) {
      for (int64_t s = 0; s < c; s += sub) {
        const int64_t m = std::min(sub, c - s);
        const size_t bytes = static_cast<size_t>(m) * o.esize;
        const size_t skip = static_cast<size_t>(s) * o.esize;
        const size_t from = offset + static_cast<size_t>(at + s) * o.esize;  // in the window
        char *piece = out + skip;
        if (in != out) copyBytes(piece, in + skip, bytes);
        scaleInPlace(piece, m, o.dtype, o.pre);
        for (int r = 0; r < size; ++r) {
          if (r != rank) reduceScaledInto(piece, channel_.exportSlot(r, w) + from, m, o.dtype, o.op, o.pre);
        }
        scaleInPlace(piece, m, o.dtype, o.post);
        publish(result + static_cast<size_t>(at + s) * o.esize, piece, bytes);
      }
    });
    if (stream_) streamFence();
  }
  barrier.publish(kReduced, w + 1);
}

void PipelinedAllreduce::copyBackWindow(const ShmOp &o, const SpanTable &table, uint64_t w,
                                        Range range, int64_t unit) {
  channel_.barrier().awaitPeers(kReduced, w + 1, "allreduce (gather)");
  const Shares share = sharesOf(range, unit);
  const int rank = channel_.rank(), size = channel_.size();
  for (int step = 1; step < size; ++step) {
    const int r = (rank + step) % size;  // staggered: ranks do not all read one owner at once
    table.scatterOut(share(r), share(r + 1), o.esize, channel_.resultSlot(r, w));
  }
  channel_.barrier().publish(kCopied, w + 1);
}

}  // namespace hora
