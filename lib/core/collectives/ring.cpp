// SPDX-License-Identifier: Apache-2.0
// The ring family: reduce-scatter and allgather around a ring of ranks, each block cut into
// chunks that flow on their own (a chunk goes on to the next rank the moment it has been reduced
// or received, so the ring's steps overlap and the link stays busy); the ring allreduce, the
// two-level ring across hosts, the ring reduce-scatter and the ring allgatherv. Every block is
// reduced along one fixed chain of ranks and copied to the rest: every rank gets the same bits.
#include <algorithm>
#include <cstring>
#include <memory>

#include "core/collectives/algorithms.h"
#include "core/collectives/common.h"

namespace hora::collectives {
namespace {

struct Range {
  int64_t off, len;
};

// Chunk j of [off, off + len) cut into k chunks of near-equal length.
Range chunkOf(int64_t off, int64_t len, int64_t k, int64_t j) {
  const int64_t per = (len + k - 1) / k;
  const int64_t begin = std::min(len, j * per);
  return {off + begin, std::min(len, begin + per) - begin};
}

// Chunks per block for blocks of up to maxElems elements of esize bytes.
int64_t chunksFor(const Link &link, int64_t maxElems, size_t esize) {
  const int64_t chunkElems = std::max<int64_t>(1, static_cast<int64_t>(link.tuning().chunkBytes / esize));
  return std::max<int64_t>(1, (maxElems + chunkElems - 1) / chunkElems);
}

// [off, off + count) cut into n near-equal blocks.
void splitEven(int64_t off, int64_t count, int n, std::vector<int64_t> *blockOff,
               std::vector<int64_t> *blockLen) {
  blockOff->resize(static_cast<size_t>(n));
  blockLen->resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    (*blockOff)[static_cast<size_t>(i)] = off + count * i / n;
    (*blockLen)[static_cast<size_t>(i)] = off + count * (i + 1) / n - (*blockOff)[static_cast<size_t>(i)];
  }
}

// A ring over `members` (ranks in ring order, this rank among them) and as many blocks of the
// buffer (offsets and lengths in elements), each block cut into k chunks.
class Ring {
 public:
  // The members of a ring agree on its blocks, hence on its chunks.
  Ring(Link &link, const std::vector<int> &members, std::vector<int64_t> blockOff,
       std::vector<int64_t> blockLen, size_t esize)
      : link_(link), off_(std::move(blockOff)), len_(std::move(blockLen)), esize_(esize),
        n_(static_cast<int>(members.size())) {
    pos_ = static_cast<int>(std::find(members.begin(), members.end(), link.rank()) - members.begin());
    next_ = members[static_cast<size_t>(mod(pos_ + 1, n_))];
    prev_ = members[static_cast<size_t>(mod(pos_ - 1, n_))];
    const int64_t longest = *std::max_element(len_.begin(), len_.end());
    k_ = chunksFor(link, longest, esize);
    longestBytes_ = static_cast<size_t>(longest) * esize;
  }

  // Step s receives block pos-s-2 from prev into scratch half s%2 and reduces it into the
  // buffer, and sends block pos-s-1 (reduced at step s-1) to next. Ends with block pos reduced
  // here.
  void reduceScatter(void *work, const Combine &combine, std::vector<uint8_t> &scratch) {
    const int steps = n_ - 1;
    if (steps == 0) return;
    uint8_t *halves = grow(scratch, 2 * longestBytes_);
    auto landing = [&](int s, int b, const Range &ch) {
      return halves + static_cast<size_t>(s % 2) * longestBytes_ +
             static_cast<size_t>(ch.off - off_[static_cast<size_t>(b)]) * esize_;
    };
    auto postRecvs = [&](int s) {
      auto t = std::make_unique<Transfers>(link_);
      const int b = mod(pos_ - s - 2, n_);
      for (int64_t j = 0; j < k_; ++j) {
        const Range ch = chunk(b, j);
        t->recv(prev_, landing(s, b, ch), bytes(ch));
      }
      return t;
    };
    Transfers sends(link_);
    for (int64_t j = 0; j < k_; ++j) {
      const Range ch = chunk(mod(pos_ - 1, n_), j);
      sends.send(next_, at(work, ch.off, esize_), bytes(ch));
    }
    std::unique_ptr<Transfers> recvs[2];
    recvs[0] = postRecvs(0);
    for (int s = 0; s < steps; ++s) {
      if (s + 1 < steps) recvs[(s + 1) % 2] = postRecvs(s + 1);
      const int b = mod(pos_ - s - 2, n_);
      for (int64_t j = 0; j < k_; ++j) {
        recvs[s % 2]->waitOne(static_cast<size_t>(j));
        const Range ch = chunk(b, j);
        combine(at(work, ch.off, esize_), landing(s, b, ch), ch.len);
        if (s + 1 < steps) sends.send(next_, at(work, ch.off, esize_), bytes(ch));
      }
    }
    sends.waitAll();
  }

  // Block pos is final here; step s receives block pos-s-1 from prev in place and passes it on
  // at step s+1.
  void allgather(void *work) {
    const int steps = n_ - 1;
    if (steps == 0) return;
    Transfers sends(link_), gather(link_);
    for (int s = 0; s < steps; ++s) {
      const int b = mod(pos_ - s - 1, n_);
      for (int64_t j = 0; j < k_; ++j) {
        const Range ch = chunk(b, j);
        gather.recv(prev_, at(work, ch.off, esize_), bytes(ch));
      }
    }
    for (int64_t j = 0; j < k_; ++j) {
      const Range ch = chunk(pos_, j);
      sends.send(next_, at(work, ch.off, esize_), bytes(ch));
    }
    for (int s = 0; s + 1 < steps; ++s) {
      const int b = mod(pos_ - s - 1, n_);
      for (int64_t j = 0; j < k_; ++j) {
        gather.waitOne(static_cast<size_t>(s * k_ + j));
        const Range ch = chunk(b, j);
        sends.send(next_, at(work, ch.off, esize_), bytes(ch));
      }
    }
    gather.waitAll();
    sends.waitAll();
  }

 private:
  Range chunk(int b, int64_t j) const {
    return chunkOf(off_[static_cast<size_t>(b)], len_[static_cast<size_t>(b)], k_, j);
  }
  size_t bytes(const Range &ch) const { return static_cast<size_t>(ch.len) * esize_; }

  Link &link_;
  std::vector<int64_t> off_, len_;
  size_t esize_;
  int n_, pos_ = 0, next_ = 0, prev_ = 0;
  int64_t k_ = 1;
  size_t longestBytes_ = 0;
};

std::vector<int> everyRank(const Link &link) {
  std::vector<int> all(static_cast<size_t>(link.size()));
  for (int r = 0; r < link.size(); ++r) all[static_cast<size_t>(r)] = r;
  return all;
}

}  // namespace

// Reduce-scatter then allgather around all ranks, size blocks of whole elements.
void ringAllreduce(Link &link, const Call &call) {
  std::vector<int64_t> off, len;
  splitEven(0, call.count, link.size(), &off, &len);
  Ring ring(link, everyRank(link), off, len, call.esize);
  ring.reduceScatter(call.buf, *call.combine, *call.scratch);
  ring.allgather(call.buf);
}

// Large vectors across hosts of R ranks each: a ring reduce-scatter inside each host leaves
// local rank l with slice l of its host's sum; the H ranks of local index l, one per host,
// allreduce slice l over a ring of their own; a ring allgather inside each host completes the
// vector. Each host sends 2(H-1)/H of the vector to other hosts, where a flat ring over all n
// ranks sends 2(n-1)/n of it over each of its cross-host hops (1.5 against 1 for 2 hosts x 2).
void hierarchicalRingAllreduce(Link &link, const Call &call) {
  const std::vector<std::vector<int>> &hosts = link.hosts();
  const int R = static_cast<int>(hosts[0].size()), H = static_cast<int>(hosts.size());
  const std::vector<int> &local = hosts[static_cast<size_t>(link.hostIndex())];
  const auto l = static_cast<size_t>(std::find(local.begin(), local.end(), link.rank()) - local.begin());
  std::vector<int> peers(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) peers[static_cast<size_t>(h)] = hosts[static_cast<size_t>(h)][l];
  std::vector<int64_t> slotOff, slotLen, subOff, subLen;
  splitEven(0, call.count, R, &slotOff, &slotLen);
  splitEven(slotOff[l], slotLen[l], H, &subOff, &subLen);
  Ring inside(link, local, slotOff, slotLen, call.esize);
  Ring across(link, peers, subOff, subLen, call.esize);
  inside.reduceScatter(call.buf, *call.combine, *call.scratch);
  across.reduceScatter(call.buf, *call.combine, *call.scratch);
  across.allgather(call.buf);
  inside.allgather(call.buf);
}

// Every host with the same number of ranks, several hosts, several ranks on each.
bool hostsAreEven(const Link &link) {
  const std::vector<std::vector<int>> &hosts = link.hosts();
  if (hosts.size() < 2 || hosts[0].size() < 2) return false;
  for (const std::vector<int> &h : hosts) {
    if (h.size() != hosts[0].size()) return false;
  }
  return true;
}

// The ring's first half on `buf` (every block, counts[r] elements each): block r ends reduced
// on rank r.
void ringReduceScatter(Link &link, const Call &call) {
  const std::vector<int64_t> off = offsetsOf(*call.sizes);
  Ring ring(link, everyRank(link), std::vector<int64_t>(off.begin(), off.end() - 1), *call.sizes,
            call.esize);
  ring.reduceScatter(call.buf, *call.combine, *call.scratch);
}

// Each rank's block around the ring, size-1 steps, each step one exchange with both neighbours.
void ringAllgatherv(Link &link, const Call &call) {
  const std::vector<int64_t> &bytes = *call.sizes;
  const std::vector<int64_t> off = offsetsOf(bytes);
  const int n = link.size(), r = link.rank();
  uint8_t *data = static_cast<uint8_t *>(call.out);
  const auto me = static_cast<size_t>(r);
  if (bytes[me] > 0 && data + off[me] != call.in) std::memmove(data + off[me], call.in, static_cast<size_t>(bytes[me]));
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  for (int step = 0; step + 1 < n; ++step) {
    const auto send = static_cast<size_t>(mod(r - step, n)), recv = static_cast<size_t>(mod(r - step - 1, n));
    Transfers t(link);
    t.recv(left, data + off[recv], static_cast<size_t>(bytes[recv]));
    t.send(right, data + off[send], static_cast<size_t>(bytes[send]));
    t.waitAll();
  }
}

}  // namespace hora::collectives
