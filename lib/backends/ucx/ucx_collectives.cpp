// SPDX-License-Identifier: Apache-2.0
// Recursive doubling, the chunked ring, trees and direct exchanges on UcxComm.
#include "backends/ucx/ucx_collectives.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace hora::ucx {
namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

uint8_t *at(void *base, int64_t elems, size_t esize) {
  return static_cast<uint8_t *>(base) + static_cast<size_t>(elems) * esize;
}

// Chunk j of a segment [off, off + len) cut into k chunks of near-equal length.
struct Range {
  int64_t off, len;
};
Range chunkOf(int64_t off, int64_t len, int64_t k, int64_t j) {
  const int64_t per = (len + k - 1) / k;
  const int64_t begin = std::min(len, j * per);
  return {off + begin, std::min(len, begin + per) - begin};
}

// A ring over `members` (ranks, in ring order; this rank among them) and as many segments of
// `work` (offsets and lengths in elements), each segment cut into k chunks that flow on their own.
struct Ring {
  UcxComm &c;
  const std::vector<int> &members;
  const std::vector<int64_t> &segOff, &segLen;
  size_t esize;
  int64_t k;  // chunks per segment: the same on every rank of the ring
  int pos = 0, next = 0, prev = 0;

  Ring(UcxComm &comm, const std::vector<int> &m, const std::vector<int64_t> &off, const std::vector<int64_t> &len,
       size_t elementSize, int64_t chunks)
      : c(comm), members(m), segOff(off), segLen(len), esize(elementSize), k(chunks) {
    const int n = static_cast<int>(members.size());
    pos = static_cast<int>(std::find(members.begin(), members.end(), c.rank()) - members.begin());
    next = members[static_cast<size_t>(mod(pos + 1, n))];
    prev = members[static_cast<size_t>(mod(pos - 1, n))];
  }
  int size() const { return static_cast<int>(members.size()); }
  Range chunk(int seg, int64_t j) const { return chunkOf(segOff[seg], segLen[seg], k, j); }
  uint8_t *at(const Range &ch, void *base) const { return hora::ucx::at(base, ch.off, esize); }
  size_t bytes(const Range &ch) const { return static_cast<size_t>(ch.len) * esize; }

  // Sequence numbers each half takes: (size - 1) * k.
  uint32_t span() const { return static_cast<uint32_t>((size() - 1) * k); }

  // Step s: receive segment pos-s-2 from prev into scratch half s%2 and reduce it into work;
  // send segment pos-s-1 (reduced at step s-1) to next. Ends with segment pos reduced here.
  void reduceScatter(void *work, const Combine &combine, uint32_t seq, std::vector<uint8_t> &scratch) {
    const int n = size(), steps = n - 1;
    if (steps == 0) return;
    int64_t maxSeg = 0;
    for (int i = 0; i < n; ++i) maxSeg = std::max(maxSeg, segLen[static_cast<size_t>(i)]);
    const size_t half = static_cast<size_t>(maxSeg) * esize;
    scratch.resize(std::max<size_t>(1, 2 * half));
    auto tag = [&](int step, int64_t j) { return seq + static_cast<uint32_t>(step * k + j); };
    auto landing = [&](int s, int seg, const Range &ch) {
      return scratch.data() + (s % 2) * half + static_cast<size_t>(ch.off - segOff[seg]) * esize;
    };
    UcxComm::Batch sends(c);
    auto postRecvs = [&](int s) {
      auto b = std::make_unique<UcxComm::Batch>(c);
      const int seg = mod(pos - s - 2, n);
      for (int64_t j = 0; j < k; ++j) {
        const Range ch = chunk(seg, j);
        b->recv(prev, tag(s, j), landing(s, seg, ch), bytes(ch));
      }
      return b;
    };
    for (int64_t j = 0; j < k; ++j) {
      const Range ch = chunk(mod(pos - 1, n), j);
      sends.send(next, tag(0, j), at(ch, work), bytes(ch));
    }
    std::unique_ptr<UcxComm::Batch> recvs[2];
    recvs[0] = postRecvs(0);
    for (int s = 0; s < steps; ++s) {
      if (s + 1 < steps) recvs[(s + 1) % 2] = postRecvs(s + 1);
      const int seg = mod(pos - s - 2, n);
      for (int64_t j = 0; j < k; ++j) {
        recvs[s % 2]->waitOne(static_cast<size_t>(j));
        const Range ch = chunk(seg, j);
        combine(at(ch, work), landing(s, seg, ch), ch.len);
        if (s + 1 < steps) sends.send(next, tag(s + 1, j), at(ch, work), bytes(ch));
      }
    }
    sends.waitAll();
  }

  // Segment pos is final here; step s receives segment pos-s-1 from prev in place and passes it
  // on at step s+1.
  void allgather(void *work, uint32_t seq) {
    const int n = size(), steps = n - 1;
    if (steps == 0) return;
    auto tag = [&](int step, int64_t j) { return seq + static_cast<uint32_t>(step * k + j); };
    UcxComm::Batch sends(c), gather(c);
    for (int s = 0; s < steps; ++s) {
      const int seg = mod(pos - s - 1, n);
      for (int64_t j = 0; j < k; ++j) {
        const Range ch = chunk(seg, j);
        gather.recv(prev, tag(s, j), at(ch, work), bytes(ch));
      }
    }
    for (int64_t j = 0; j < k; ++j) {
      const Range ch = chunk(pos, j);
      sends.send(next, tag(0, j), at(ch, work), bytes(ch));
    }
    for (int s = 0; s + 1 < steps; ++s) {
      const int seg = mod(pos - s - 1, n);
      for (int64_t j = 0; j < k; ++j) {
        gather.waitOne(static_cast<size_t>(s * k + j));
        const Range ch = chunk(seg, j);
        sends.send(next, tag(s + 1, j), at(ch, work), bytes(ch));
      }
    }
    gather.waitAll();
    sends.waitAll();
  }
};

// Chunks per segment for segments of up to maxSegElems elements.
int64_t chunksFor(const Tuning &t, int64_t maxSegElems, size_t esize) {
  const int64_t chunkElems = std::max<int64_t>(1, static_cast<int64_t>(t.chunkBytes / esize));
  return std::max<int64_t>(1, (maxSegElems + chunkElems - 1) / chunkElems);
}

// [off, off+count) cut into n near-equal segments.
void splitEven(int64_t off, int64_t count, int n, std::vector<int64_t> *segOff, std::vector<int64_t> *segLen) {
  segOff->resize(static_cast<size_t>(n));
  segLen->resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    (*segOff)[static_cast<size_t>(i)] = off + count * i / n;
    (*segLen)[static_cast<size_t>(i)] = off + count * (i + 1) / n - (*segOff)[static_cast<size_t>(i)];
  }
}

// Recursive doubling on the whole vector (see the header).
void recursiveDoubling(UcxComm &c, void *buf, int64_t count, size_t esize, const Combine &combine,
                       std::vector<uint8_t> &scratch) {
  const int n = c.size(), r = c.rank();
  int p2 = 1, rounds = 0;
  while (p2 * 2 <= n) {
    p2 *= 2;
    ++rounds;
  }
  const uint32_t seq = c.reserve(static_cast<uint32_t>(rounds + 2));
  const size_t bytes = static_cast<size_t>(count) * esize;
  scratch.resize(std::max<size_t>(1, bytes));
  const int extra = n - p2;
  if (r >= p2) {  // fold into rank r - p2, get the result back last
    UcxComm::Batch b(c);
    b.send(r - p2, seq, buf, bytes);
    b.recv(r - p2, seq + static_cast<uint32_t>(rounds + 1), scratch.data(), bytes);
    b.waitAll();
    std::memcpy(buf, scratch.data(), bytes);
    return;
  }
  if (r < extra) {
    UcxComm::Batch b(c);
    b.recv(r + p2, seq, scratch.data(), bytes);
    b.waitAll();
    combine(buf, scratch.data(), count);
  }
  for (int mask = 1, round = 1; mask < p2; mask <<= 1, ++round) {
    const int peer = r ^ mask;
    UcxComm::Batch b(c);
    b.recv(peer, seq + static_cast<uint32_t>(round), scratch.data(), bytes);
    b.send(peer, seq + static_cast<uint32_t>(round), buf, bytes);
    b.waitAll();
    combine(buf, scratch.data(), count);
  }
  if (r < extra) {
    UcxComm::Batch b(c);
    b.send(r + p2, seq + static_cast<uint32_t>(rounds + 1), buf, bytes);
    b.waitAll();
  }
}

// Every rank sends its vector to every other and reduces all of them itself, in rank order, so
// that every rank computes the same bits: one message latency instead of log2(P).
void directAllreduce(UcxComm &c, void *buf, int64_t count, size_t esize, const Combine &combine,
                     std::vector<uint8_t> &scratch) {
  const int n = c.size(), r = c.rank();
  const uint32_t seq = c.reserve(1);
  const size_t bytes = static_cast<size_t>(count) * esize;
  scratch.resize(std::max<size_t>(1, static_cast<size_t>(n) * bytes));
  auto slot = [&](int p) { return scratch.data() + static_cast<size_t>(p) * bytes; };
  std::memcpy(slot(r), buf, bytes);
  UcxComm::Batch b(c);
  for (int i = 1; i < n; ++i) {
    const int p = mod(r - i, n);
    b.recv(p, seq, slot(p), bytes);
  }
  for (int i = 1; i < n; ++i) b.send(mod(r + i, n), seq, slot(r), bytes);
  b.waitAll();
  std::memcpy(buf, slot(0), bytes);
  for (int p = 1; p < n; ++p) combine(buf, slot(p), count);
}

// Across hosts with several ranks on some: each host's ranks send their vectors to its lowest
// rank (shared memory), which reduces them in rank order; these leaders exchange their hosts'
// results directly and each reduces them in host order; each leader sends the result back to
// its host. Every rank gets the same bits, and only one message per leader pair crosses hosts.
void hostAwareAllreduce(UcxComm &c, void *buf, int64_t count, size_t esize, const Combine &combine,
                        std::vector<uint8_t> &scratch) {
  const int r = c.rank();
  const std::vector<std::vector<int>> &hosts = c.hosts();
  const std::vector<int> &mine = hosts[static_cast<size_t>(c.hostIndex())];
  const int leader = mine[0];
  const uint32_t seq = c.reserve(3);
  const size_t bytes = static_cast<size_t>(count) * esize;
  if (r != leader) {
    UcxComm::Batch b(c);
    b.send(leader, seq, buf, bytes);
    b.recv(leader, seq + 2, buf, bytes);  // arrives only after the leader has everyone's vector
    b.waitAll();
    return;
  }
  const size_t slots = std::max(mine.size(), hosts.size());
  scratch.resize(std::max<size_t>(1, slots * bytes));
  auto slot = [&](size_t i) { return scratch.data() + i * bytes; };
  {
    UcxComm::Batch b(c);
    for (size_t i = 1; i < mine.size(); ++i) b.recv(mine[i], seq, slot(i), bytes);
    b.waitAll();
  }
  for (size_t i = 1; i < mine.size(); ++i) combine(buf, slot(i), count);
  UcxComm::Batch b(c);
  const size_t me = static_cast<size_t>(c.hostIndex());
  for (size_t h = 0; h < hosts.size(); ++h) {
    if (h != me) b.recv(hosts[h][0], seq + 1, slot(h), bytes);
  }
  for (size_t h = 0; h < hosts.size(); ++h) {
    if (h != me) b.send(hosts[h][0], seq + 1, buf, bytes);
  }
  b.waitAll();
  std::memcpy(slot(me), buf, bytes);
  std::memcpy(buf, slot(0), bytes);
  for (size_t h = 1; h < hosts.size(); ++h) combine(buf, slot(h), count);
  UcxComm::Batch down(c);
  for (size_t i = 1; i < mine.size(); ++i) down.send(mine[i], seq + 2, buf, bytes);
  down.waitAll();
}

// Whether hostAwareAllreduce fits: several hosts, some with several ranks, few hosts.
bool hostAwareFits(const UcxComm &c) {
  const size_t hosts = c.hosts().size();
  return hosts > 1 && hosts < static_cast<size_t>(c.size()) && hosts <= 16;
}

// Every host with the same number of ranks, several hosts, several ranks on each.
bool hierarchicalFits(const UcxComm &c) {
  const std::vector<std::vector<int>> &hosts = c.hosts();
  if (hosts.size() < 2 || hosts[0].size() < 2) return false;
  for (const std::vector<int> &h : hosts) {
    if (h.size() != hosts[0].size()) return false;
  }
  return true;
}

// Large vectors across hosts of R ranks each: a ring reduce-scatter inside each host (shared
// memory) leaves local rank l with slice l of its host's sum; the H ranks of local index l, one per
// host, allreduce slice l over a ring of their own; a ring allgather inside each host completes
// the vector. Each host sends 2(H-1)/H of the vector to other hosts, where a flat ring over all n
// ranks sends 2(n-1)/n of it over each of its cross-host hops (1.5 against 1 for 2 hosts x 2).
// Each element is reduced by one rank in the end and copied to the rest: every rank has the same
// bits.
void hierarchicalAllreduce(UcxComm &c, const Tuning &t, void *buf, int64_t count, size_t esize,
                           const Combine &combine, std::vector<uint8_t> &scratch) {
  const std::vector<std::vector<int>> &hosts = c.hosts();
  const int R = static_cast<int>(hosts[0].size()), H = static_cast<int>(hosts.size());
  const std::vector<int> &local = hosts[static_cast<size_t>(c.hostIndex())];
  const int l = static_cast<int>(std::find(local.begin(), local.end(), c.rank()) - local.begin());
  std::vector<int> peers(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) peers[static_cast<size_t>(h)] = hosts[static_cast<size_t>(h)][static_cast<size_t>(l)];

  std::vector<int64_t> slotOff, slotLen, subOff, subLen;
  splitEven(0, count, R, &slotOff, &slotLen);
  const int64_t maxSlot = (count + R - 1) / R;
  splitEven(slotOff[static_cast<size_t>(l)], slotLen[static_cast<size_t>(l)], H, &subOff, &subLen);
  Ring inside(c, local, slotOff, slotLen, esize, chunksFor(t, maxSlot, esize));
  Ring across(c, peers, subOff, subLen, esize, chunksFor(t, (maxSlot + H - 1) / H, esize));
  // The same reservation on every rank: both rings' spans depend only on count, R and H.
  const uint32_t seq = c.reserve(2 * inside.span() + 2 * across.span());
  inside.reduceScatter(buf, combine, seq, scratch);
  across.reduceScatter(buf, combine, seq + inside.span(), scratch);
  across.allgather(buf, seq + inside.span() + across.span());
  inside.allgather(buf, seq + inside.span() + 2 * across.span());
}

// Binomial tree from `root`: this rank's parent (or -1) and children, as real ranks.
void binomial(int n, int r, int root, int *parent, std::vector<int> *children) {
  const int vr = mod(r - root, n);
  int mask = 1;
  *parent = -1;
  while (mask < n) {
    if (vr & mask) {
      *parent = mod(vr - mask + root, n);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) children->push_back(mod(vr + mask + root, n));
  }
}

}  // namespace

Tuning Tuning::fromKnobs(const Knobs &knobs) {
  Tuning t;
  t.smallBytes = static_cast<size_t>(knobs.ucxSmallKiB) << 10;
  t.directBytes = static_cast<size_t>(knobs.ucxDirectKiB) << 10;
  t.chunkBytes = static_cast<size_t>(knobs.ucxChunkKiB) << 10;
  t.topologyAware = knobs.hierarchical != "off";
  return t;
}

void allreduce(UcxComm &c, const Tuning &t, void *buf, int64_t count, size_t esize, const Combine &combine,
               std::vector<uint8_t> &scratch) {
  const int n = c.size();
  if (n == 1 || count == 0) return;
  if (static_cast<size_t>(count) * esize <= t.smallBytes && t.topologyAware && hostAwareFits(c)) {
    hostAwareAllreduce(c, buf, count, esize, combine, scratch);
    return;
  }
  if (static_cast<size_t>(count) * esize * static_cast<size_t>(n - 1) <= t.directBytes) {
    directAllreduce(c, buf, count, esize, combine, scratch);
    return;
  }
  if (static_cast<size_t>(count) * esize <= t.smallBytes || count < n) {
    recursiveDoubling(c, buf, count, esize, combine, scratch);
    return;
  }
  if (t.topologyAware && hierarchicalFits(c)) {
    hierarchicalAllreduce(c, t, buf, count, esize, combine, scratch);
    return;
  }
  std::vector<int> all(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  std::vector<int64_t> off, len;
  splitEven(0, count, n, &off, &len);
  Ring ring(c, all, off, len, esize, chunksFor(t, (count + n - 1) / n, esize));
  const uint32_t seq = c.reserve(2 * ring.span());
  ring.reduceScatter(buf, combine, seq, scratch);
  ring.allgather(buf, seq + ring.span());
}

void reduceScatterInPlace(UcxComm &c, const Tuning &t, void *work, const std::vector<int64_t> &counts,
                          size_t esize, const Combine &combine, std::vector<uint8_t> &scratch) {
  const int n = c.size();
  if (n == 1) return;
  std::vector<int64_t> off(static_cast<size_t>(n));
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    off[static_cast<size_t>(i)] = total;
    total += counts[static_cast<size_t>(i)];
  }
  if (total == 0) return;
  if (static_cast<size_t>(total) * esize <= t.smallBytes) {
    recursiveDoubling(c, work, total, esize, combine, scratch);
    return;
  }
  std::vector<int> all(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  const int64_t maxSeg = *std::max_element(counts.begin(), counts.end());
  Ring ring(c, all, off, counts, esize, chunksFor(t, maxSeg, esize));
  ring.reduceScatter(work, combine, c.reserve(ring.span()), scratch);
}

void broadcast(UcxComm &c, const Tuning &t, void *buf, size_t bytes, int root) {
  const int n = c.size(), r = c.rank();
  if (n == 1 || bytes == 0) return;
  if (bytes <= t.smallBytes) {
    const uint32_t seq = c.reserve(1);
    int parent;
    std::vector<int> children;
    binomial(n, r, root, &parent, &children);
    if (parent >= 0) {
      UcxComm::Batch b(c);
      b.recv(parent, seq, buf, bytes);
      b.waitAll();
    }
    UcxComm::Batch b(c);
    for (int child : children) b.send(child, seq, buf, bytes);
    b.waitAll();
    return;
  }
  // A chain in rank order from the root; each chunk is passed on as soon as it has arrived.
  const int64_t k = static_cast<int64_t>((bytes + t.chunkBytes - 1) / t.chunkBytes);
  const uint32_t seq = c.reserve(static_cast<uint32_t>(k));
  const int vr = mod(r - root, n);
  const int prev = mod(r - 1, n), next = mod(r + 1, n);
  UcxComm::Batch recvs(c), sends(c);
  if (vr > 0) {
    for (int64_t j = 0; j < k; ++j) {
      const Range ch = chunkOf(0, static_cast<int64_t>(bytes), k, j);
      recvs.recv(prev, seq + static_cast<uint32_t>(j), at(buf, ch.off, 1), static_cast<size_t>(ch.len));
    }
  }
  for (int64_t j = 0; j < k; ++j) {
    if (vr > 0) recvs.waitOne(static_cast<size_t>(j));
    if (vr + 1 < n) {
      const Range ch = chunkOf(0, static_cast<int64_t>(bytes), k, j);
      sends.send(next, seq + static_cast<uint32_t>(j), at(buf, ch.off, 1), static_cast<size_t>(ch.len));
    }
  }
  sends.waitAll();
}

void allgatherv(UcxComm &c, const void *in, void *out, const std::vector<int64_t> &bytesPerRank) {
  const int n = c.size(), r = c.rank();
  const uint32_t seq = c.reserve(1);
  std::vector<int64_t> off(static_cast<size_t>(n));
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    off[static_cast<size_t>(i)] = total;
    total += bytesPerRank[static_cast<size_t>(i)];
  }
  const size_t mine = static_cast<size_t>(bytesPerRank[static_cast<size_t>(r)]);
  uint8_t *myOut = at(out, off[static_cast<size_t>(r)], 1);
  if (mine > 0 && myOut != in) std::memmove(myOut, in, mine);
  UcxComm::Batch b(c);
  for (int p = 0; p < n; ++p) {
    if (p == r || bytesPerRank[static_cast<size_t>(p)] == 0) continue;
    b.recv(p, seq, at(out, off[static_cast<size_t>(p)], 1), static_cast<size_t>(bytesPerRank[static_cast<size_t>(p)]));
  }
  for (int i = 1; i < n && mine > 0; ++i) b.send(mod(r + i, n), seq, myOut, mine);
  b.waitAll();
}

void alltoallv(UcxComm &c, const void *in, const std::vector<int64_t> &sendBytes, void *out,
               const std::vector<int64_t> &recvBytes) {
  const int n = c.size(), r = c.rank();
  const uint32_t seq = c.reserve(1);
  std::vector<int64_t> sendOff(static_cast<size_t>(n)), recvOff(static_cast<size_t>(n));
  for (int i = 1; i < n; ++i) {
    sendOff[static_cast<size_t>(i)] = sendOff[static_cast<size_t>(i - 1)] + sendBytes[static_cast<size_t>(i - 1)];
    recvOff[static_cast<size_t>(i)] = recvOff[static_cast<size_t>(i - 1)] + recvBytes[static_cast<size_t>(i - 1)];
  }
  const auto self = static_cast<size_t>(r);
  if (recvBytes[self] > 0) {
    std::memmove(at(out, recvOff[self], 1), at(const_cast<void *>(in), sendOff[self], 1),
                 static_cast<size_t>(recvBytes[self]));
  }
  UcxComm::Batch b(c);
  for (int i = 1; i < n; ++i) {
    const auto p = static_cast<size_t>(mod(r - i, n));
    if (recvBytes[p] > 0) b.recv(static_cast<int>(p), seq, at(out, recvOff[p], 1), static_cast<size_t>(recvBytes[p]));
  }
  for (int i = 1; i < n; ++i) {
    const auto p = static_cast<size_t>(mod(r + i, n));
    if (sendBytes[p] > 0) {
      b.send(static_cast<int>(p), seq, at(const_cast<void *>(in), sendOff[p], 1), static_cast<size_t>(sendBytes[p]));
    }
  }
  b.waitAll();
}

void andWords(UcxComm &c, std::vector<uint64_t> &words, std::vector<uint8_t> &scratch) {
  if (c.size() == 1 || words.empty()) return;
  auto fn = hostAwareFits(c) ? hostAwareAllreduce
            : words.size() * 8 * static_cast<size_t>(c.size() - 1) <= (16u << 10) ? directAllreduce
                                                                                  : recursiveDoubling;
  fn(
      c, words.data(), static_cast<int64_t>(words.size()), sizeof(uint64_t),
      [](void *dst, const void *src, int64_t count) {
        auto *d = static_cast<uint64_t *>(dst);
        const auto *s = static_cast<const uint64_t *>(src);
        for (int64_t i = 0; i < count; ++i) d[i] &= s[i];
      },
      scratch);
}

std::vector<std::string> gatherToRoot(UcxComm &c, const std::string &blob) {
  const uint32_t seq = c.reserve(1);
  std::vector<std::string> out;
  if (c.rank() != 0) {
    UcxComm::Batch b(c);
    b.send(0, seq, blob.data(), blob.size());
    b.waitAll();
    return out;
  }
  out.resize(static_cast<size_t>(c.size()));
  out[0] = blob;
  for (int p = 1; p < c.size(); ++p) out[static_cast<size_t>(p)] = c.recvAny(p, seq);
  return out;
}

void broadcastFromRoot(UcxComm &c, std::string &blob) {
  if (c.size() == 1) return;
  const uint32_t seq = c.reserve(1);
  int parent;
  std::vector<int> children;
  binomial(c.size(), c.rank(), 0, &parent, &children);
  if (parent >= 0) blob = c.recvAny(parent, seq);
  UcxComm::Batch b(c);
  for (int child : children) b.send(child, seq, blob.data(), blob.size());
  b.waitAll();
}

}  // namespace hora::ucx
