// SPDX-License-Identifier: Apache-2.0
#include "backends/shm/cma_allreduce.h"

#include <algorithm>
#include <cstring>

#include "base/logging.h"

namespace hora {
namespace {

constexpr int64_t kChunkBytes = 128 << 10;  // peer data read per step, stays in L2

uint64_t probeValue(int pid) { return 0x686f7261'0000'0000ull ^ static_cast<uint64_t>(pid); }

}  // namespace

void CmaAllreduce::PeerTable::assign(const ShmChannel::TableEntry *entries, uint32_t n) {
  entries_ = entries;
  start_.resize(n + 1);
  start_[0] = 0;
  for (uint32_t i = 0; i < n; ++i) start_[i + 1] = start_[i] + entries[i].count;
}

void CmaAllreduce::PeerTable::ranges(int64_t a, int64_t b, size_t esize, bool out,
                                     cma::IovList &into) const {
  into.clear();
  size_t i = static_cast<size_t>(std::upper_bound(start_.begin(), start_.end(), a) - start_.begin()) - 1;
  for (int64_t at = a; at < b && i + 1 < start_.size(); ++i) {
    const int64_t end = std::min(b, start_[i + 1]);
    if (end <= at) continue;
    const uint64_t base = out ? entries_[i].out : entries_[i].in;
    into.add(reinterpret_cast<const void *>(base + static_cast<uint64_t>(at - start_[i]) * esize),
             static_cast<size_t>(end - at) * esize);
    at = end;
  }
}

CmaAllreduce::CmaAllreduce(ShmChannel &channel) : channel_(channel) {
  ShmChannel::Slot &mine = channel_.slot(channel_.rank());
  probe_ = probeValue(mine.pid);
  mine.probeAddr = reinterpret_cast<uint64_t>(&probe_);
}

bool CmaAllreduce::agree(ControlPlane &control, bool want) {
  std::string why = want ? "" : "HORA_SHM is not cma";
  for (int r = 0; r < channel_.size() && why.empty(); ++r) {
    if (r == channel_.rank()) continue;
    cma::canRead(channel_.pid(r), channel_.slot(r).probeAddr, probeValue(channel_.pid(r)), &why);
  }
  std::vector<uint64_t> ok{why.empty() ? 1u : 0u};
  control.allreduceAnd(ok);
  const bool agreed = ok[0] != 0;
  if (!agreed && want) {
    HORA_LOG(kWarning) << "HORA_SHM=cma: shared-memory allreduce stages large tensors instead: "
                       << (why.empty() ? "another rank cannot read its peers' memory" : why);
  }
  return agreed;
}

// Every rank publishes where its tensors lie; barrier; rank r reduces share r of the whole vector,
// a chunk at a time: its own input into its output, then each peer's input, read straight from the
// peer's tensors into a cache-sized buffer, into it; barrier; every rank reads each peer's reduced
// share from the peer's output into its own; barrier, after which a rank may hand its tensors
// back. About 2.5 times the vector's bytes cross memory per rank, where staging through the
// segment takes about 4.5; it wins only where the kernel's copy is about as fast as memcpy, which
// it is not on this machine class (see shm_backend.h).
bool CmaAllreduce::run(const ShmOp &o, const SpanTable &table) {
  const int rank = channel_.rank(), size = channel_.size();
  const std::vector<Backend::Span> &spans = table.spans();
  ShmChannel::TableEntry *mine = channel_.table(rank);
  if (spans.size() <= ShmChannel::kTableEntries) {
    for (size_t i = 0; i < spans.size(); ++i) {
      mine[i] = {reinterpret_cast<uint64_t>(spans[i].in), reinterpret_cast<uint64_t>(spans[i].out),
                 spans[i].count};
    }
  }
  channel_.barrier().wait("allreduce (publish)");
  checkPeers(channel_, o);
  peers_.resize(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const uint32_t n = channel_.slot(r).ops[o.seq & 1].spans;
    if (n == ShmChannel::kTableOverflow) return false;
    if (r != rank) peers_[static_cast<size_t>(r)].assign(channel_.table(r), n);
  }

  const int64_t unit = o.unit();
  const int64_t units = (o.total + unit - 1) / unit;
  auto share = [&](int r) { return std::min(o.total, units * r / size * unit); };
  const int64_t mineA = share(rank), mineB = share(rank + 1);
  const int64_t chunk = std::max<int64_t>(unit, kChunkBytes / static_cast<int64_t>(o.esize) / unit * unit);
  peerChunk_.resize(static_cast<size_t>(chunk) * o.esize);
  for (int64_t a = mineA; a < mineB; a += chunk) reduceChunk(o, table, a, std::min(mineB, a + chunk));
  channel_.barrier().wait("allreduce (reduce)");

  for (int step = 1; step < size; ++step) {
    const int r = (rank + step) % size;  // staggered: ranks do not all read one owner at once
    local_.clear();
    table.forEach(share(r), share(r + 1), o.esize, [&](const char *, char *out, int64_t, int64_t n) {
      local_.add(out, static_cast<size_t>(n) * o.esize);
    });
    peers_[static_cast<size_t>(r)].ranges(share(r), share(r + 1), o.esize, /*out=*/true, remote_);
    cma::read(channel_.pid(r), r, local_, remote_, "allreduce (gather)");
  }
  channel_.barrier().wait("allreduce (done)");
  return true;
}

// Share elements [a, b) of this rank: its own input, then every peer's in rank order.
void CmaAllreduce::reduceChunk(const ShmOp &o, const SpanTable &table, int64_t a, int64_t b) {
  const int rank = channel_.rank(), size = channel_.size();
  const int64_t n = b - a;
  char *theirs = peerChunk_.data();
  auto readPeer = [&](int r) {
    local_.clear();
    local_.add(theirs, static_cast<size_t>(n) * o.esize);
    peers_[static_cast<size_t>(r)].ranges(a, b, o.esize, /*out=*/false, remote_);
    cma::read(channel_.pid(r), r, local_, remote_, "allreduce (reduce)");
  };
  if (o.half()) {
    acc_.resize(static_cast<size_t>(n));
    ownChunk_.resize(static_cast<size_t>(n) * o.esize);
    table.gatherIn(a, b, o.esize, ownChunk_.data());
    widenToFloat(ownChunk_.data(), acc_.data(), n, o.dtype, o.pre);
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      readPeer(r);
      reduceWidenedInto(acc_.data(), theirs, n, o.dtype, o.op, o.pre);
    }
    narrowFromFloat(acc_.data(), ownChunk_.data(), n, o.dtype, o.post);
    table.scatterOut(a, b, o.esize, ownChunk_.data());
    return;
  }
  table.forEach(a, b, o.esize, [&](const char *in, char *out, int64_t, int64_t c) {
    if (in != out) std::memcpy(out, in, static_cast<size_t>(c) * o.esize);
    scaleInPlace(out, c, o.dtype, o.pre);
  });
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    readPeer(r);
    table.forEach(a, b, o.esize, [&](const char *, char *out, int64_t at, int64_t c) {
      reduceScaledInto(out, theirs + static_cast<size_t>(at) * o.esize, c, o.dtype, o.op, o.pre);
    });
  }
  table.forEach(a, b, o.esize, [&](const char *, char *out, int64_t, int64_t c) {
    scaleInPlace(out, c, o.dtype, o.post);
  });
}

}  // namespace hora
