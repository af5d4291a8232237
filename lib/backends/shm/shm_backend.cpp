// SPDX-License-Identifier: Apache-2.0
// ShmBackend: allreduce among the ranks of one host without a message-sized copy or allocation.
#include "backends/shm/shm_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "backends/shm/cma.h"
#include "backends/shm/shm_segment.h"
#include "base/error.h"
#include "base/logging.h"

namespace hora {
namespace {

constexpr int64_t kEagerBytes = 32 << 10;    // largest op that goes through the staging slots
constexpr int64_t kWindowBytes = 512 << 10;  // bytes of the vector per pipeline window
constexpr int kSlots = 4;                    // pipeline windows a rank's export/result rings hold
constexpr int64_t kSubBytes = 16 << 10;      // reduced, then published, while still in L1
// ShmBarrierState::Progress stages of the pipeline: windows each rank has exported, reduced
// (its share, published) and copied back.
constexpr int kExported = 0, kReduced = 1, kCopied = 2;
// HORA_SHM_STREAM=auto: rank 0 times a cache line bounced with each peer at the first pipelined
// operation and then every kProbeEvery windows (64 MiB), and ranks stream while that round trip
// is over kFarNs: about 60 ns between cores under one L3 here, 310 ns when the VM's two vCPUs
// sit on different CCDs of the host, which happens for minutes at a time.
constexpr uint64_t kProbeEvery = 128;
constexpr int kProbeRounds = 32;
constexpr double kFarNs = 150;
constexpr int64_t kAndBytes = 64 << 10;      // largest negotiation bit vector taken here
constexpr int64_t kChunkBytes = 128 << 10;   // single copy: peer data read per step, stays in L2
constexpr uint32_t kTableEntries = 4096;     // single copy: most tensors one op can publish
constexpr uint32_t kTableOverflow = ~0u;     // OpDescriptor::spans of a rank that had more

// One per rank, written only by its rank: who it is and the operation it is running, which peers
// check after the first barrier of each operation. A peer can be at most one operation ahead
// (it cannot pass that operation's barrier alone), so two descriptors, by sequence parity, keep
// its next one from overwriting the one being checked.
struct OpDescriptor {
  uint64_t seq;
  int64_t total;
  uint32_t dtype;
  uint32_t op;
  uint32_t spans;  // single copy: entries in the rank's table, or kTableOverflow
};
struct alignas(64) Slot {
  int32_t pid;
  uint64_t probeAddr;  // where this rank's cross-memory-attach probe value lives, in its memory
  OpDescriptor ops[2];
};
// Single copy: one tensor of a rank's operation, at addresses in that rank's process.
struct TableEntry {
  uint64_t in;
  uint64_t out;
  int64_t count;
};

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "the barrier's atomics must be address-free to live in shared memory");

constexpr size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

bool isHalf(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

std::string hostIdentity() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return std::string(name) + "/" + boot;
}

// This rank's tensors as one vector of elements: which bytes of which tensor hold [a, b).
class SpanTable {
 public:
  void assign(const std::vector<Backend::Span> &spans) {
    spans_ = spans;
    start_.resize(spans.size() + 1);
    start_[0] = 0;
    for (size_t i = 0; i < spans.size(); ++i) start_[i + 1] = start_[i] + spans[i].count;
  }

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

// A peer's published tensors (addresses in its process) as one vector of elements.
class PeerTable {
 public:
  void assign(const TableEntry *entries, uint32_t n) {
    entries_ = entries;
    start_.resize(n + 1);
    start_[0] = 0;
    for (uint32_t i = 0; i < n; ++i) start_[i + 1] = start_[i] + entries[i].count;
  }
  // The peer's input (or output) bytes holding elements [a, b), appended to a cleared `into`.
  void ranges(int64_t a, int64_t b, size_t esize, bool out, cma::IovList &into) const {
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

 private:
  const TableEntry *entries_ = nullptr;
  std::vector<int64_t> start_;
};

class ShmBackend final : public Backend {
 public:
  ShmBackend(std::unique_ptr<Backend> inner, std::unique_ptr<ShmSegment> segment, int rank,
             int size, double timeoutS, bool singleCopy, const std::string &stream)
      : inner_(std::move(inner)),
        segment_(std::move(segment)),
        rank_(rank),
        size_(size),
        timeoutS_(timeoutS),
        wantSingleCopy_(singleCopy),
        probeStream_(stream == "auto"),
        stream_(stream == "on"),
        name_(std::string(inner_->name()) + "+shm") {
    char *base = static_cast<char *>(segment_->base());
    slots_ = reinterpret_cast<Slot *>(base + slotsOffset());
    areas_ = base + areasOffset(size_);
    Slot &mine = slots_[rank_];
    mine.pid = getpid();
    probe_ = 0x686f7261'0000'0000ull ^ static_cast<uint64_t>(mine.pid);
    mine.probeAddr = reinterpret_cast<uint64_t>(&probe_);
    barrierState_ = reinterpret_cast<ShmBarrierState *>(base);
  }

  // Per rank, in this order: two eager staging halves, the export and the result ring of the
  // pipeline (kSlots windows each), two negotiation bit vectors, the single-copy table.
  static constexpr size_t kExportAt = 2 * kEagerBytes;
  static constexpr size_t kResultAt = kExportAt + kSlots * kWindowBytes;
  static constexpr size_t kAndAt = kResultAt + kSlots * kWindowBytes;
  static constexpr size_t kTableAt = kAndAt + 2 * kAndBytes;
  static size_t areaBytes() { return roundUp(kTableAt + kTableEntries * sizeof(TableEntry), 4096); }
  static size_t slotsOffset() { return roundUp(sizeof(ShmBarrierState), 4096); }
  static size_t areasOffset(int size) {
    return roundUp(slotsOffset() + sizeof(Slot) * static_cast<size_t>(size), 4096);
  }
  static size_t segmentBytes(int size) {
    return areasOffset(size) + static_cast<size_t>(size) * areaBytes();
  }

  // Collective: every rank has written its pid, so the barrier can tell a lost peer.
  void connect(ControlPlane &control) {
    std::vector<uint64_t> flag{1};
    control.allreduceAnd(flag);
    std::vector<int> pids(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) pids[static_cast<size_t>(r)] = slots_[r].pid;
    // Spinning before sleeping pays only when every rank has a core of its own.
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    coreEach_ = cores >= size_;
    barrier_ = std::make_unique<ShmBarrier>(barrierState_, rank_, pids, timeoutS_, coreEach_);
    bell_ = std::make_unique<ShmBell>(barrierState_, rank_, size_);
    pids_ = std::move(pids);

    // Single copy needs every rank able to read every peer's memory: all take it or none does.
    std::string why = wantSingleCopy_ ? "" : "HORA_SHM is not cma";
    for (int r = 0; r < size_ && why.empty(); ++r) {
      if (r == rank_) continue;
      cma::canRead(pids_[static_cast<size_t>(r)], slots_[r].probeAddr,
                   0x686f7261'0000'0000ull ^ static_cast<uint64_t>(pids_[static_cast<size_t>(r)]), &why);
    }
    std::vector<uint64_t> ok{why.empty() ? 1u : 0u};
    control.allreduceAnd(ok);
    singleCopy_ = ok[0] != 0;
    if (singleCopy_) name_ += "/single-copy";
    if (!singleCopy_ && wantSingleCopy_) {
      HORA_LOG(kWarning) << "HORA_SHM=cma: shared-memory allreduce stages large tensors instead: "
                      << (why.empty() ? "another rank cannot read its peers' memory" : why);
    }
  }

  const char *name() const override { return name_.c_str(); }
  PeerBell *peerBell() override { return bell_.get(); }
  // allreduceSpans takes float16/bfloat16 itself; the other reductions go to inner_.
  bool reducesHalfNatively() const override { return inner_->reducesHalfNatively(); }

  bool allreduceSpans(const std::vector<Span> &spans, DType dtype, ReduceOp op, double prescale,
                      double postscale) override {
    run(spans, dtype, op, prescale, postscale);
    return true;
  }

  // The engine's negotiation AND through the segment: a sleeping peer is woken by the futex the
  // moment the last rank arrives, where polling a non-blocking MPI collective sleeps in growing
  // slices. Halves alternate by call, so the next call's barrier makes reuse safe.
  bool allreduceAnd(std::vector<uint64_t> &words) override {
    const size_t bytes = words.size() * sizeof(uint64_t);
    if (bytes > static_cast<size_t>(kAndBytes)) return false;
    const uint64_t parity = andOps_++ & 1;
    auto vector = [&](int r) {
      return reinterpret_cast<const uint64_t *>(area(r) + kAndAt + static_cast<size_t>(parity) * kAndBytes);
    };
    std::memcpy(const_cast<uint64_t *>(vector(rank_)), words.data(), bytes);
    barrier_->wait("negotiation");
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const uint64_t *theirs = vector(r);
      for (size_t i = 0; i < words.size(); ++i) words[i] &= theirs[i];
    }
    return true;
  }

  void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) override {
    run({{in, out, count}}, dtype, op, 1.0, 1.0);
  }

  void broadcast(void *buf, int64_t bytes, int root) override { inner_->broadcast(buf, bytes, root); }
  void allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) override {
    inner_->allgatherv(in, out, bytesPerRank);
  }
  void alltoallv(const void *in, const std::vector<int64_t> &sendBytes, void *out,
                 const std::vector<int64_t> &recvBytes) override {
    inner_->alltoallv(in, sendBytes, out, recvBytes);
  }
  void reducescatter(const void *in, void *out, const std::vector<int64_t> &counts, DType dtype,
                     ReduceOp op) override {
    inner_->reducescatter(in, out, counts, dtype, op);
  }

 private:
  struct Op {
    DType dtype;
    ReduceOp op;
    double pre;
    double post;
    size_t esize;
    int64_t total;
  };

  char *area(int r) const { return areas_ + static_cast<size_t>(r) * areaBytes(); }
  char *eagerHalf(int r, uint64_t parity) const {
    return area(r) + static_cast<size_t>(parity) * kEagerBytes;
  }
  char *exportSlot(int r, uint64_t window) const {
    return area(r) + kExportAt + static_cast<size_t>(window % kSlots) * kWindowBytes;
  }
  TableEntry *table(int r) const { return reinterpret_cast<TableEntry *>(area(r) + kTableAt); }
  char *resultSlot(int r, uint64_t window) const {
    return area(r) + kResultAt + static_cast<size_t>(window % kSlots) * kWindowBytes;
  }

  void run(const std::vector<Span> &spans, DType dtype, ReduceOp op, double pre, double post) {
    Op o{dtype, op, pre, post, dtypeSize(dtype), 0};
    for (const Span &s : spans) o.total += s.count;
    if (o.total == 0) return;  // every rank agrees: the total is part of the response
    table_.assign(spans);
    ++seq_;
    const bool eagerOp = o.total * static_cast<int64_t>(o.esize) <= kEagerBytes;
    const bool single = singleCopy_ && !eagerOp;
    const uint32_t published = !single ? 0 : spans.size() <= kTableEntries ? static_cast<uint32_t>(spans.size())
                                                                           : kTableOverflow;
    slots_[rank_].ops[seq_ & 1] = {seq_, o.total, static_cast<uint32_t>(dtype),
                                   static_cast<uint32_t>(op), published};
    if (eagerOp) {
      eager(o);
      return;
    }
    const int64_t unit = std::max<int64_t>(1, 64 / static_cast<int64_t>(o.esize));
    if (single && singleCopyRun(o, spans, unit)) return;
    pipeline(o, unit, /*checked=*/single);
  }

  // Large ops when ranks may read each other's memory (cross-memory attach): every rank
  // publishes where its tensors lie; barrier; rank r reduces share r of the whole vector, a
  // chunk at a time: its own input into its output, then each peer's input, read straight from
  // the peer's tensors into a cache-sized buffer, into it; barrier; every rank reads each peer's
  // reduced share from the peer's output into its own; barrier, after which a rank may hand its
  // tensors back. About 2.5 times the vector's bytes cross memory per rank, where staging through
  // the segment takes about 4.5; it wins only where the kernel's copy is about as fast as
  // memcpy, which it is not on this machine class (see shm_backend.h). Returns false, having passed only the first barrier, when some
  // rank has more tensors than its table holds; every rank then sees that and stages instead.
  bool singleCopyRun(const Op &o, const std::vector<Span> &spans, int64_t unit) {
    TableEntry *mine = table(rank_);
    if (spans.size() <= kTableEntries) {
      for (size_t i = 0; i < spans.size(); ++i) {
        mine[i] = {reinterpret_cast<uint64_t>(spans[i].in), reinterpret_cast<uint64_t>(spans[i].out),
                   spans[i].count};
      }
    }
    barrier_->wait("allreduce (publish)");
    checkPeers(o);
    peers_.resize(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      const uint32_t n = slots_[r].ops[seq_ & 1].spans;
      if (n == kTableOverflow) return false;
      if (r != rank_) peers_[static_cast<size_t>(r)].assign(table(r), n);
    }

    const int64_t units = (o.total + unit - 1) / unit;
    auto share = [&](int r) { return std::min(o.total, units * r / size_ * unit); };
    const int64_t mineA = share(rank_), mineB = share(rank_ + 1);
    const int64_t chunk = std::max<int64_t>(unit, kChunkBytes / static_cast<int64_t>(o.esize) / unit * unit);
    peerChunk_.resize(static_cast<size_t>(chunk) * o.esize);
    for (int64_t a = mineA; a < mineB; a += chunk) reduceChunk(o, a, std::min(mineB, a + chunk));
    barrier_->wait("allreduce (reduce)");

    for (int step = 1; step < size_; ++step) {
      const int r = (rank_ + step) % size_;  // staggered: ranks do not all read one owner at once
      local_.clear();
      table_.forEach(share(r), share(r + 1), o.esize, [&](const char *, char *out, int64_t, int64_t n) {
        local_.add(out, static_cast<size_t>(n) * o.esize);
      });
      peers_[static_cast<size_t>(r)].ranges(share(r), share(r + 1), o.esize, /*out=*/true, remote_);
      cma::read(pids_[static_cast<size_t>(r)], r, local_, remote_, "allreduce (gather)");
    }
    barrier_->wait("allreduce (done)");
    return true;
  }

  // Share elements [a, b) of this rank: its own input, then every peer's in rank order.
  void reduceChunk(const Op &o, int64_t a, int64_t b) {
    const int64_t n = b - a;
    char *theirs = peerChunk_.data();
    auto readPeer = [&](int r) {
      local_.clear();
      local_.add(theirs, static_cast<size_t>(n) * o.esize);
      peers_[static_cast<size_t>(r)].ranges(a, b, o.esize, /*out=*/false, remote_);
      cma::read(pids_[static_cast<size_t>(r)], r, local_, remote_, "allreduce (reduce)");
    };
    if (isHalf(o.dtype)) {
      acc_.resize(static_cast<size_t>(n));
      ownChunk_.resize(static_cast<size_t>(n) * o.esize);
      table_.gatherIn(a, b, o.esize, ownChunk_.data());
      widenToFloat(ownChunk_.data(), acc_.data(), n, o.dtype, o.pre);
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        readPeer(r);
        reduceWidenedInto(acc_.data(), theirs, n, o.dtype, o.op, o.pre);
      }
      narrowFromFloat(acc_.data(), ownChunk_.data(), n, o.dtype, o.post);
      table_.scatterOut(a, b, o.esize, ownChunk_.data());
      return;
    }
    table_.forEach(a, b, o.esize, [&](const char *in, char *out, int64_t, int64_t c) {
      if (in != out) std::memcpy(out, in, static_cast<size_t>(c) * o.esize);
      scaleInPlace(out, c, o.dtype, o.pre);
    });
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      readPeer(r);
      table_.forEach(a, b, o.esize, [&](const char *, char *out, int64_t at, int64_t c) {
        reduceScaledInto(out, theirs + static_cast<size_t>(at) * o.esize, c, o.dtype, o.op, o.pre);
      });
    }
    table_.forEach(a, b, o.esize, [&](const char *, char *out, int64_t, int64_t c) {
      scaleInPlace(out, c, o.dtype, o.post);
    });
  }

  // After the first barrier of an operation: every peer must be running the same one.
  void checkPeers(const Op &o) {
    for (int r = 0; r < size_; ++r) {
      const OpDescriptor &peer = slots_[r].ops[seq_ & 1];
      if (peer.seq != seq_ || peer.total != o.total || peer.dtype != static_cast<uint32_t>(o.dtype) ||
          peer.op != static_cast<uint32_t>(o.op)) {
        HORA_THROW(HORA_ERR_INTERNAL, "shared-memory allreduce out of step: rank ", rank_,
                   " runs op ", seq_, " (", o.total, " x ", dtypeName(o.dtype), ", ",
                   reduceOpName(o.op), "), rank ", r, " op ", peer.seq, " (", peer.total, " x ",
                   dtypeName(static_cast<DType>(peer.dtype)), ")");
      }
    }
  }

  // Large ops: a pipeline over windows of the vector, each cut into one share per rank on
  // 64-byte multiples. Rank r, for window w:
  //   export:    copies each peer's share of its input into its export ring;
  //   reduce:    once every peer has exported w, reduces share r (its own input and the peers'
  //              exports) into its output and publishes it in its result ring;
  //   copy back: once every peer has reduced w, copies their results into its output.
  // A rank runs export(w), reduce(w - 1), copy back(w - 2) in turn and waits only for the
  // counters of the data it needs (ShmBarrier::awaitPeers), never for a barrier of everyone: a
  // rank that falls up to a window behind (a preempted core, a page fault) costs nothing, where
  // lockstep barriers made every such stall everyone's, and on a busy VM kept both ranks
  // sleeping and waking. A ring slot is rewritten kSlots windows later, once every peer is done
  // with it. Windows are numbered across operations, the same on every rank.
  void pipeline(const Op &o, int64_t unit, bool checked) {
    const int64_t window = kWindowBytes / static_cast<int64_t>(o.esize) / unit * unit;
    const int64_t n = (o.total + window - 1) / window;
    const uint64_t first = windows_;
    // Timing a round trip means spinning on it, which an oversubscribed host cannot afford and
    // where it would time the scheduler: there the stores stay cached.
    if (probeStream_ && coreEach_ && first >= nextProbe_) probe(first);
    windows_ += static_cast<uint64_t>(n);
    auto range = [&](int64_t t) {
      return std::make_pair(t * window, std::min(o.total, (t + 1) * window));
    };
    for (int64_t t = 0; t < n + 2; ++t) {
      if (t + 1 < n) touchPages(o, range(t + 1));
      if (t < n) exportWindow(o, first + t, range(t), unit);
      if (t >= 1 && t <= n) reduceWindow(o, first + t - 1, range(t - 1), unit, !checked && t == 1);
      if (t >= 2) copyBackWindow(o, first + t - 2, range(t - 2), unit);
    }
  }

  // One prefetch per 4 KiB page of the next window's input: the hardware prefetchers stop at page
  // boundaries and each new page starts with a page walk, which under a VM's nested paging is
  // long; started a window early, the walks overlap this window's copies (ResNet-50 step here
  // about 5% faster).
  void touchPages(const Op &o, std::pair<int64_t, int64_t> range) const {
    table_.forEach(range.first, range.second, o.esize, [&](const char *in, char *, int64_t, int64_t c) {
      const char *end = in + static_cast<size_t>(c) * o.esize;
      for (const char *p = in; p < end; p += 4096) __builtin_prefetch(p, 0, 0);
    });
  }

  // How this rank copies into the segment for the peers to read (see probe()).
  SpanTable::Copy publishCopy() const { return stream_ ? streamBytes : copyBytes; }

  // Collective (every rank calls it at the same window): rank 0 bounces a cache line with each
  // peer in turn, and each rank streams while its own link to rank 0 is slow (rank 0: any link).
  // Cached stores hand the staged data to a reader through the shared L3; where the ranks share
  // none, every line moves between the two cores' caches one at a time, and in one run here
  // that made the data path 4-5 times slower than going through memory with streaming stores.
  void probe(uint64_t window) {
    nextProbe_ = window + kProbeEvery;
    double worst = 0;
    for (int r = 1; r < size_; ++r) {
      if (rank_ == 0 || rank_ == r) worst = std::max(worst, barrier_->pingPong(rank_ == 0 ? r : 0, kProbeRounds));
    }
    const bool far = worst > kFarNs;
    if (far != stream_) {
      HORA_LOG(kInfo) << "shared-memory allreduce: cache-line round trip " << static_cast<int>(worst)
                      << " ns to " << (rank_ == 0 ? "the slowest peer" : "rank 0") << "; "
                      << (far ? "streaming the staged data through memory" : "cached stores");
    }
    stream_ = far;
  }

  // Share r of window [a, b): elements [share(r), share(r + 1)).
  struct Shares {
    int64_t a, b, units, unit;
    int size;
    int64_t operator()(int r) const { return std::min(b, a + units * r / size * unit); }
  };
  Shares sharesOf(std::pair<int64_t, int64_t> range, int64_t unit) const {
    return {range.first, range.second, (range.second - range.first + unit - 1) / unit, unit, size_};
  }

  void exportWindow(const Op &o, uint64_t w, std::pair<int64_t, int64_t> range, int64_t unit) {
    if (w >= kSlots) barrier_->awaitPeers(kReduced, w - kSlots + 1, "allreduce (export)");
    const Shares share = sharesOf(range, unit);
    char *exported = exportSlot(rank_, w);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      table_.gatherIn(share(r), share(r + 1), o.esize,
                      exported + static_cast<size_t>(share(r) - share.a) * o.esize, publishCopy());
    }
    if (stream_) streamFence();
    barrier_->publish(kExported, w + 1);
  }

  void reduceWindow(const Op &o, uint64_t w, std::pair<int64_t, int64_t> range, int64_t unit,
                    bool check) {
    barrier_->awaitPeers(kExported, w + 1, "allreduce (reduce)");
    if (check) checkPeers(o);
    if (w >= kSlots) barrier_->awaitPeers(kCopied, w - kSlots + 1, "allreduce (reduce)");
    const Shares share = sharesOf(range, unit);
    const int64_t mineA = share(rank_), mineB = share(rank_ + 1), n = mineB - mineA;
    char *result = resultSlot(rank_, w);
    const size_t offset = static_cast<size_t>(mineA - share.a) * o.esize;  // in the window
    if (n > 0 && isHalf(o.dtype)) {
      acc_.resize(static_cast<size_t>(n));
      table_.gatherIn(mineA, mineB, o.esize, result);  // staged, then widened in cache
      widenToFloat(result, acc_.data(), n, o.dtype, o.pre);
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) reduceWidenedInto(acc_.data(), exportSlot(r, w) + offset, n, o.dtype, o.op, o.pre);
      }
      narrowFromFloat(acc_.data(), result, n, o.dtype, o.post);
      table_.scatterOut(mineA, mineB, o.esize, result);
    } else if (n > 0) {
      // Reduced in the output tensors themselves, a piece small enough for L1 at a time, and
      // published from there: the share crosses memory once each way.
      const int64_t sub = kSubBytes / static_cast<int64_t>(o.esize);
      const SpanTable::Copy publish = publishCopy();
      table_.forEach(mineA, mineB, o.esize, [&](const char *in, char *out, int64_t at, int64_t c) {
        for (int64_t s = 0; s < c; s += sub) {
          const int64_t m = std::min(sub, c - s);
          const size_t bytes = static_cast<size_t>(m) * o.esize;
          const size_t skip = static_cast<size_t>(s) * o.esize;
          const size_t from = offset + static_cast<size_t>(at + s) * o.esize;  // in the window
          char *piece = out + skip;
          if (in != out) copyBytes(piece, in + skip, bytes);
          scaleInPlace(piece, m, o.dtype, o.pre);
          for (int r = 0; r < size_; ++r) {
            if (r != rank_) reduceScaledInto(piece, exportSlot(r, w) + from, m, o.dtype, o.op, o.pre);
          }
          scaleInPlace(piece, m, o.dtype, o.post);
          publish(result + static_cast<size_t>(at + s) * o.esize, piece, bytes);
        }
      });
      if (stream_) streamFence();
    }
    barrier_->publish(kReduced, w + 1);
  }

  void copyBackWindow(const Op &o, uint64_t w, std::pair<int64_t, int64_t> range, int64_t unit) {
    barrier_->awaitPeers(kReduced, w + 1, "allreduce (gather)");
    const Shares share = sharesOf(range, unit);
    for (int step = 1; step < size_; ++step) {
      const int r = (rank_ + step) % size_;  // staggered: ranks do not all read one owner at once
      table_.scatterOut(share(r), share(r + 1), o.esize, resultSlot(r, w));
    }
    barrier_->publish(kCopied, w + 1);
  }

  // Small ops: stage, one barrier, then every rank reduces the whole vector from the staged
  // copies, in rank order so that every rank computes the same bits: one wait per op, where the
  // pipeline's hand-offs between ranks cost two. The staging halves alternate by eager op, so the
  // next eager op's barrier is what makes reuse safe. Reduced straight into the output tensors,
  // an L1-sized piece at a time (float16/bfloat16: through the float32 accumulator).
  void eager(const Op &o) {
    const int64_t bytes = o.total * static_cast<int64_t>(o.esize);
    const uint64_t parity = eagerOps_++ & 1;
    table_.gatherIn(0, o.total, o.esize, eagerHalf(rank_, parity));
    barrier_->wait("allreduce (eager)");
    checkPeers(o);
    if (isHalf(o.dtype)) {
      acc_.resize(static_cast<size_t>(o.total));
      widenToFloat(eagerHalf(0, parity), acc_.data(), o.total, o.dtype, o.pre);
      for (int r = 1; r < size_; ++r) {
        reduceWidenedInto(acc_.data(), eagerHalf(r, parity), o.total, o.dtype, o.op, o.pre);
      }
      tmp_.resize(static_cast<size_t>(bytes));
      narrowFromFloat(acc_.data(), tmp_.data(), o.total, o.dtype, o.post);
      table_.scatterOut(0, o.total, o.esize, tmp_.data());
      return;
    }
    const int64_t sub = kSubBytes / static_cast<int64_t>(o.esize);
    table_.forEach(0, o.total, o.esize, [&](const char *, char *out, int64_t at, int64_t c) {
      for (int64_t s = 0; s < c; s += sub) {
        const int64_t m = std::min(sub, c - s);
        const size_t from = static_cast<size_t>(at + s) * o.esize;  // in the staged vectors
        char *piece = out + static_cast<size_t>(s) * o.esize;
        copyBytes(piece, eagerHalf(0, parity) + from, static_cast<size_t>(m) * o.esize);
        scaleInPlace(piece, m, o.dtype, o.pre);
        for (int r = 1; r < size_; ++r) {
          reduceScaledInto(piece, eagerHalf(r, parity) + from, m, o.dtype, o.op, o.pre);
        }
        scaleInPlace(piece, m, o.dtype, o.post);
      }
    });
  }

  std::unique_ptr<Backend> inner_;
  std::unique_ptr<ShmSegment> segment_;
  const int rank_;
  const int size_;
  const double timeoutS_;
  const bool wantSingleCopy_;
  const bool probeStream_;        // HORA_SHM_STREAM=auto: probe() decides stream_
  bool stream_;                   // non-temporal stores into the segment (see probe())
  uint64_t nextProbe_ = 0;        // window at which the next pipelined operation probes
  bool coreEach_ = false;         // at least as many CPUs as ranks (set by connect())
  std::string name_;  // "<inner>+shm", with "/single-copy" once connect() found it possible
  bool singleCopy_ = false;      // every rank can read every peer's memory (process_vm_readv)
  uint64_t probe_ = 0;           // read by peers at connect to tell whether they can
  std::vector<int> pids_;
  ShmBarrierState *barrierState_ = nullptr;
  Slot *slots_ = nullptr;
  char *areas_ = nullptr;
  std::unique_ptr<ShmBarrier> barrier_;
  std::unique_ptr<ShmBell> bell_;
  uint64_t seq_ = 0;
  uint64_t windows_ = 0;    // pipeline windows run, over all operations: picks the ring slots
  uint64_t eagerOps_ = 0;   // eager operations run: picks the staging half
  uint64_t andOps_ = 0;     // negotiation ANDs run: picks the bit-vector half
  SpanTable table_;
  std::vector<char> tmp_;   // the eager float16/bfloat16 result, before it is scattered
  std::vector<float> acc_;  // float32 accumulator for float16/bfloat16
  // Single copy: the peers' tables of this op, a peer's chunk and (float16/bfloat16) this rank's,
  // and the two sides of a process_vm_readv.
  std::vector<PeerTable> peers_;
  std::vector<char> peerChunk_, ownChunk_;
  cma::IovList local_, remote_;
};

}  // namespace

std::unique_ptr<Backend> wrapWithShm(std::unique_ptr<Backend> inner, Group &group,
                                     const Knobs &knobs, std::string *why) {
  ControlPlane &control = group.control();
  if (knobs.shm == "off") {
    *why = "HORA_SHM=off";
    return inner;
  }
  if (control.size() == 1) {
    *why = "a group of one";
    return inner;
  }
  if (control.size() > ShmBarrierState::kMaxRanks) {
    *why = detail::concat("more than ", ShmBarrierState::kMaxRanks, " ranks");
    return inner;
  }
  // All on one host? Rank 0 compares host names and boot ids and tells the others.
  std::vector<std::string> hosts = control.gatherToRoot(hostIdentity());
  std::string verdict;
  if (control.rank() == 0) {
    for (size_t r = 1; r < hosts.size() && verdict.empty(); ++r) {
      if (hosts[r] != hosts[0]) {
        verdict = detail::concat("rank ", r, " is on another host (", hosts[r].substr(0, hosts[r].find('/')),
                                 ", rank 0 on ", hosts[0].substr(0, hosts[0].find('/')), ")");
      }
    }
  }
  control.broadcastFromRoot(verdict);
  if (!verdict.empty()) {
    *why = verdict;
    return inner;
  }
  std::unique_ptr<ShmSegment> segment =
      ShmSegment::create(control, ShmBackend::segmentBytes(control.size()), why);
  if (!segment) return inner;
  auto shm = std::make_unique<ShmBackend>(std::move(inner), std::move(segment), control.rank(),
                                          control.size(), knobs.timeoutS, knobs.shm == "cma",
                                          knobs.shmStream);
  shm->connect(control);
  return shm;
}

}  // namespace hora
