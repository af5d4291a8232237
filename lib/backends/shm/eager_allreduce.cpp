// SPDX-License-Identifier: Apache-2.0
#include "backends/shm/eager_allreduce.h"

#include <algorithm>

namespace hora {

// Stage, one barrier, then every rank reduces the whole vector from the staged copies, in rank
// order so that every rank computes the same bits: one wait per op, where the pipeline's hand-offs
// between ranks cost two. The staging halves alternate by eager op, so the next eager op's barrier
// is what makes reuse safe. Reduced straight into the output tensors, an L1-sized piece at a time
// (float16/bfloat16: through the float32 accumulator).
void EagerAllreduce::run(const ShmOp &o, const SpanTable &table) {
  const int64_t bytes = o.total * static_cast<int64_t>(o.esize);
  const uint64_t parity = ops_++ & 1;
  const int size = channel_.size();
  table.gatherIn(0, o.total, o.esize, channel_.eagerHalf(channel_.rank(), parity));
  channel_.barrier().wait("allreduce (eager)");
  checkPeers(channel_, o);
  if (o.half()) {
    acc_.resize(static_cast<size_t>(o.total));
    widenToFloat(channel_.eagerHalf(0, parity), acc_.data(), o.total, o.dtype, o.pre);
    for (int r = 1; r < size; ++r) {
      reduceWidenedInto(acc_.data(), channel_.eagerHalf(r, parity), o.total, o.dtype, o.op, o.pre);
    }
    tmp_.resize(static_cast<size_t>(bytes));
    narrowFromFloat(acc_.data(), tmp_.data(), o.total, o.dtype, o.post);
    table.scatterOut(0, o.total, o.esize, tmp_.data());
    return;
  }
  const int64_t sub = kShmSubBytes / static_cast<int64_t>(o.esize);
  table.forEach(0, o.total, o.esize, [&](const char *, char *out, int64_t at, int64_t c) {
    for (int64_t s = 0; s < c; s += sub) {
      const int64_t m = std::min(sub, c - s);
      const size_t from = static_cast<size_t>(at + s) * o.esize;  // in the staged vectors
      char *piece = out + static_cast<size_t>(s) * o.esize;
      copyBytes(piece, channel_.eagerHalf(0, parity) + from, static_cast<size_t>(m) * o.esize);
      scaleInPlace(piece, m, o.dtype, o.pre);
      for (int r = 1; r < size; ++r) {
        reduceScaledInto(piece, channel_.eagerHalf(r, parity) + from, m, o.dtype, o.op, o.pre);
      }
      scaleInPlace(piece, m, o.dtype, o.post);
    }
  });
}

}  // namespace hora
