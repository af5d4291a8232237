// SPDX-License-Identifier: Apache-2.0
// The fake device: CUDA and NCCL semantics on host memory and threads, for CPU unit tests.
#include "fake_device.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <utility>

#include "base/error.h"
#include "time_scale.h"

// How the fake stands for a GPU, and what a test can rely on:
//
// - Memory is host memory (256-byte aligned, filled with 0xA5 like uninitialised device memory).
//   release() is stream-ordered like cudaFreeAsync: liveBytes() drops at the call, the memory is
//   freed when the stream's worker reaches it (at once on the default stream, nullptr).
// - Each stream has a worker thread running its queued ops in order; nullptr is the legacy
//   default stream, which here runs an op at once on the calling thread (waitEvent on it blocks
//   the caller). hold(true) pauses every worker before its next op.
// - An event is done when the worker has run its most recent record (CUDA's rule); one never
//   recorded is done. An unknown or destroyed handle is misuse: FakeMisuse from calls that may
//   throw, a message and abort() from noexcept ones.
// - NCCL: commInit returns kNcclInProgress; commAsyncError says kNcclInProgress until every rank
//   of the id called commInit. Calls on a communicator before then are refused (ncclInvalidUsage),
//   as NCCL's non-blocking mode requires. Each call (or each groupStart..groupEnd, per stream and
//   communicator) becomes one op on its stream. Collectives meet at the communicator's k-th
//   rendezvous (k counts this rank's ops with collectives); every rank reads the inputs it needs
//   from its peers' memory, then all wait until every rank has read, then each writes its own
//   outputs (so in-place ops are safe). Ranks that disagree on a rendezvous (kind, count, dtype,
//   op, root) all get ncclInvalidUsage. send/recv match per (sender, receiver) in call order,
//   like NCCL, without involving other ranks; different sizes give both ncclInvalidUsage.
// - Launches at N > 1 are non-blocking, as NCCL's with two or more ranks (launchInProgress(), on
//   by default): a call outside a group, or a groupEnd, on a communicator of two or more ranks
//   returns kNcclInProgress and queues nothing yet; the work reaches its stream when
//   commAsyncError is next asked about that communicator (the second time it is asked). Until
//   then every NCCL call on the communicator is refused (ncclInvalidUsage), and any work queued
//   on a stream whose launch is pending aborts the process (it would run before the NCCL
//   kernel on a GPU: an event recorded there completes early).
// - A rank's op ends without writing when its communicator is aborted, destroyed or in error;
//   a rank waiting for a peer whose communicator is aborted or destroyed gets ncclRemoteError.
//   A peer merely in error is waited for, as on a GPU, until it aborts.
// - Every wait of the fake is bounded (60 s times HORA_TEST_TIME_SCALE): past it the process
//   aborts with a message instead of hanging CI.
//
// The call log: one entry per DeviceApi call, with the calling thread:
//   deviceCount  whyNoDevice  setDevice <d>  multiprocessors <d>  kernelsRunOn <d>
//   createStream  destroyStream  createEvent  destroyEvent  recordEvent  eventDone  waitEvent
//   synchronizeEvent  hostCallback  allocate <bytes>  release <bytes>  copy <bytes>  zero <bytes>
//   batchedCopy items=<n> bytes=<total>  scale count=<n> dtype=<name> factor=<f>
//   createCancelFlag  destroyCancelFlag  ncclVersion  ncclErrorString <r>  uniqueId
//   commInit size=<n> rank=<r> maxCTAs=<m>  commAsyncError  commLastError  commFinalize
//   commDestroy  commAbort  createPreMulSum dtype=<name> factor=<f>  destroyRedOp <op>
//   memAlloc <bytes>  memFree <bytes>  commRegister <bytes>  commDeregister
//   groupStart  groupEnd  allReduce count=<n> op=<op> dtype=<name>  broadcast bytes=<n> root=<r>
//   allGather bytes=<n>  reduceScatter count=<n> op=<op> dtype=<name>
//   reduce count=<n> op=<op> dtype=<name> root=<r>  send bytes=<n> peer=<p>  recv bytes=<n> peer=<p>
// and, from the stream workers, "stream: " entries for what did not run normally:
//   "stream: batchedCopy cancelled", "stream: allReduce stalled",
//   "stream: allReduce skipped (aborted)", "stream: allReduce ended without writing (<why>)".

namespace hora::test {

namespace fake_detail {

using Clock = std::chrono::steady_clock;
constexpr double kWaitLimitS = 60.0;
constexpr int kNcclUnhandledCudaError = 1;
constexpr int kNcclInvalidArgument = 4;
constexpr int kNcclInvalidUsage = 5;
constexpr int kNcclRemoteError = 6;
constexpr int kNumBuiltinOps = 5;  // sum, prod, max, min, avg: ncclNumOps
constexpr int kPreMulSum = -1;     // Call::op of an operator made by createPreMulSum
constexpr size_t kAlign = 256;

[[noreturn]] void die(const std::string &why) {
  std::fprintf(stderr, "FakeDevice: %s\n", why.c_str());
  std::fflush(stderr);
  std::abort();
}

// Waits for pred on cv; past the limit the process aborts: a test must fail, not hang CI.
template <typename Pred>
void waitOrDie(std::unique_lock<std::mutex> &lock, std::condition_variable &cv, Pred pred, int rank,
               const char *what) {
  const auto end = Clock::now() + hora_test::scaled(kWaitLimitS);
  while (!pred()) {
    if (cv.wait_until(lock, end) == std::cv_status::timeout && !pred()) {
      die(detail::concat("rank ", rank, ": ", what, " for ", kWaitLimitS * hora_test::timeScale(),
                         " s: the test hangs; aborting it"));
    }
  }
}

struct Op {
  std::function<void()> run;
};

struct Stream {
  std::thread worker;
  std::deque<std::unique_ptr<Op>> queue;
  uint64_t queued = 0, done = 0;
  bool stopping = false;
  int device = 0;
  int launching = 0;  // NCCL launches pending on it (returned kNcclInProgress, not settled)
};

struct Event {
  uint64_t recordGen = 0;  // records made (host side)
  uint64_t doneGen = 0;    // the latest record a worker has run
};

enum class Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kReduce, kSend, kRecv };

const char *kindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce: return "allReduce";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kAllGather: return "allGather";
    case Kind::kReduceScatter: return "reduceScatter";
    case Kind::kReduce: return "reduce";
    case Kind::kSend: return "send";
    case Kind::kRecv: return "recv";
  }
  return "?";
}

// One NCCL call. count: elements for reductions, bytes for the byte-wise calls. root: the root,
// or the peer of send/recv.
struct Call {
  Kind kind;
  const void *in;
  void *out;
  size_t count;
  DType dtype;
  int op;  // 0..4, or kPreMulSum with factor
  double factor;
  int root;
  int redOp;  // the operator as the caller named it (for messages)
};

struct SendPost {
  const void *data;
  size_t bytes;
  int to;
  bool consumed = false, mismatch = false, withdrawn = false;
};

struct CommGroup;
struct PendingCall {
  std::shared_ptr<CommGroup> group;
  int rank;
  Stream *stream;
  Call call;
};

// The k-th rendezvous of a communicator's collectives.
struct Slot {
  std::vector<const std::vector<Call> *> posted;  // per rank, while it waits there
  int arrived = 0;
  bool complete = false;  // every rank arrived: from here on none leaves before reading
  int readDone = 0;
  int departed = 0;
};

struct RankState {
  bool joined = false, aborted = false, destroyed = false, finalizing = false;
  int error = 0;
  std::string lastError;
  uint64_t nextSeq = 0;  // the next rendezvous of this rank's collectives
  int pending = 0;       // ops queued and not finished
  int active = 0;        // workers inside an op of it now
  std::vector<PendingCall> launching;  // a launch that returned kNcclInProgress, not yet queued
  int launchPolls = 0;                 // commAsyncError calls until it is
  uint64_t nextSplit = 0;              // the next commSplit of this rank's on the communicator
};

// A communicator: what its ranks share. Its mutex guards everything in it.
struct CommGroup {
  CommGroup(std::string id_, int size_) : id(std::move(id_)), size(size_), ranks(size_) {}
  const std::string id;
  const int size;
  std::mutex mutex;
  std::condition_variable cv;
  int joined = 0;
  std::vector<RankState> ranks;
  std::map<uint64_t, Slot> slots;
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<SendPost>>> channels;  // (from, to)
  std::map<uint64_t, std::vector<std::pair<int, int>>> splits;  // each split's (color, key) per rank

  bool gone(int r) const { return ranks[r].aborted || ranks[r].destroyed; }
};

// A rank's handle on a communicator (what CommHandle points at).
struct Comm {
  std::shared_ptr<CommGroup> group;
  int rank;
  int device;
  std::map<int, std::pair<DType, double>> redOps;  // made by createPreMulSum; guarded by the device's mutex
  int nextRedOp = kNumBuiltinOps;
};


struct NcclItem {
  std::shared_ptr<CommGroup> group;
  int rank;
  uint64_t seq = 0;
  std::vector<Call> colls;  // collectives, in call order
  std::vector<Call> p2p;    // sends and receives, in call order
  std::string name;
};

// ---- Elements.

bool isIntegral(DType t) { return !isFloating(t); }

double loadF(const char *base, size_t i, DType t) {
  switch (t) {
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, base + i * 2, 2);
      return halfToFloat(h);
    }
    case DType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, base + i * 2, 2);
      return bfloat16ToFloat(b);
    }
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, base + i * 4, 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, base + i * 8, 8);
      return d;
    }
  }
}

void storeF(char *base, size_t i, DType t, double v) {
  switch (t) {
    case DType::kFloat16: {
      const uint16_t h = floatToHalf(static_cast<float>(v));
      std::memcpy(base + i * 2, &h, 2);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t b = floatToBfloat16(static_cast<float>(v));
      std::memcpy(base + i * 2, &b, 2);
      break;
    }
    case DType::kFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(base + i * 4, &f, 4);
      break;
    }
    default:
      std::memcpy(base + i * 8, &v, 8);
  }
}

int64_t loadI(const char *base, size_t i, DType t) {
  switch (t) {
    case DType::kUInt8:
    case DType::kBool: return static_cast<uint8_t>(base[i]);  // bool: ncclUint8 on a GPU
    case DType::kInt8: return static_cast<int8_t>(base[i]);
    case DType::kInt32: {
      int32_t v;
      std::memcpy(&v, base + i * 4, 4);
      return v;
    }
    default: {
      int64_t v;
      std::memcpy(&v, base + i * 8, 8);
      return v;
    }
  }
}

// Two's complement wrap-around into the dtype, as integer arithmetic on a GPU does.
void storeI(char *base, size_t i, DType t, uint64_t bits) {
  switch (t) {
    case DType::kUInt8:
    case DType::kBool:
    case DType::kInt8: base[i] = static_cast<char>(static_cast<uint8_t>(bits)); break;
    case DType::kInt32: {
      const uint32_t v = static_cast<uint32_t>(bits);
      std::memcpy(base + i * 4, &v, 4);
      break;
    }
    default: std::memcpy(base + i * 8, &bits, 8);
  }
}

// The elementwise reduction of `count` elements of every input; factors[p] is input p's
// PreMulSum factor. Floating types in double, integers in 64 bits, then converted back.
std::vector<char> reduce(const std::vector<const char *> &ins, const std::vector<double> &factors,
                         size_t count, DType t, int op) {
  const size_t esize = dtypeSize(t);
  std::vector<char> out(count * esize);
  const size_t n = ins.size();
  if (isIntegral(t)) {
    for (size_t i = 0; i < count; ++i) {
      uint64_t acc = op == 1 ? 1 : 0;  // unsigned: overflow wraps instead of being undefined
      int64_t best = loadI(ins[0], i, t);
      for (size_t p = 0; p < n; ++p) {
        const int64_t v = loadI(ins[p], i, t);
        switch (op) {
          case 0:
          case 4: acc += static_cast<uint64_t>(v); break;
          case 1: acc *= static_cast<uint64_t>(v); break;
          case 2: best = std::max(best, v); break;
          case 3: best = std::min(best, v); break;
          default:
            acc += static_cast<uint64_t>(static_cast<int64_t>(factors[p])) * static_cast<uint64_t>(v);
        }
      }
      if (op == 2 || op == 3) acc = static_cast<uint64_t>(best);
      if (op == 4) acc = static_cast<uint64_t>(static_cast<int64_t>(acc) / static_cast<int64_t>(n));
      storeI(out.data(), i, t, acc);
    }
  } else {
    for (size_t i = 0; i < count; ++i) {
      double acc = op == 1 ? 1.0 : 0.0;
      double best = loadF(ins[0], i, t);
      for (size_t p = 0; p < n; ++p) {
        const double v = loadF(ins[p], i, t);
        switch (op) {
          case 0:
          case 4: acc += v; break;
          case 1: acc *= v; break;
          case 2: best = std::max(best, v); break;
          case 3: best = std::min(best, v); break;
          default: acc += factors[p] * v;
        }
      }
      if (op == 2 || op == 3) acc = best;
      if (op == 4) acc /= static_cast<double>(n);
      storeF(out.data(), i, t, acc);
    }
  }
  return out;
}

// "" when every rank's collectives at a rendezvous agree, else what differs.
std::string disagreement(const std::vector<const std::vector<Call> *> &posted) {
  const std::vector<Call> &first = *posted[0];
  for (size_t p = 1; p < posted.size(); ++p) {
    const std::vector<Call> &other = *posted[p];
    if (other.size() != first.size()) {
      return detail::concat("rank 0 queued ", first.size(), " collectives in this group, rank ", p,
                            " queued ", other.size());
    }
    for (size_t i = 0; i < first.size(); ++i) {
      const Call &a = first[i], &b = other[i];
      if (a.kind != b.kind || a.count != b.count || a.dtype != b.dtype || a.op != b.op ||
          a.root != b.root) {
        return detail::concat("rank 0 called ", kindName(a.kind), " count=", a.count, " dtype=",
                              dtypeName(a.dtype), " op=", a.op, " root=", a.root, ", rank ", p,
                              " called ", kindName(b.kind), " count=", b.count, " dtype=",
                              dtypeName(b.dtype), " op=", b.op, " root=", b.root);
      }
    }
  }
  return "";
}

using Outputs = std::vector<std::pair<void *, std::vector<char>>>;

// Rank r's outputs of the collectives at a complete rendezvous, read from every rank's inputs.
void computeCollectives(const std::vector<const std::vector<Call> *> &posted, int r, Outputs &outputs) {
  const size_t n = posted.size();
  const std::vector<Call> &mine = *posted[static_cast<size_t>(r)];
  for (size_t i = 0; i < mine.size(); ++i) {
    const Call &c = mine[i];
    auto input = [&](size_t p) { return static_cast<const char *>((*posted[p])[i].in); };
    std::vector<double> factors(n);
    for (size_t p = 0; p < n; ++p) factors[p] = (*posted[p])[i].factor;
    switch (c.kind) {
      case Kind::kAllReduce:
      case Kind::kReduce: {
        if (c.kind == Kind::kReduce && c.root != r) break;
        std::vector<const char *> ins(n);
        for (size_t p = 0; p < n; ++p) ins[p] = input(p);
        outputs.emplace_back(c.out, reduce(ins, factors, c.count, c.dtype, c.op));
        break;
      }
      case Kind::kReduceScatter: {
        const size_t offset = static_cast<size_t>(r) * c.count * dtypeSize(c.dtype);
        std::vector<const char *> ins(n);
        for (size_t p = 0; p < n; ++p) ins[p] = input(p) + offset;
        outputs.emplace_back(c.out, reduce(ins, factors, c.count, c.dtype, c.op));
        break;
      }
      case Kind::kBroadcast: {
        const char *src = input(static_cast<size_t>(c.root));
        outputs.emplace_back(c.out, std::vector<char>(src, src + c.count));
        break;
      }
      case Kind::kAllGather: {
        std::vector<char> all(n * c.count);
        for (size_t p = 0; p < n; ++p) {
          if (c.count > 0) std::memcpy(all.data() + p * c.count, input(p), c.count);
        }
        outputs.emplace_back(c.out, std::move(all));
        break;
      }
      default: break;
    }
  }
}

std::vector<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

}  // namespace fake_detail

using namespace fake_detail;

namespace {

std::atomic<uint64_t> nextSerial{1};

// Per thread, keyed by FakeDevice::serial_: cudaSetDevice's device and NCCL's open group.
struct GroupState {
  int depth = 0;
  std::vector<PendingCall> calls;
};
thread_local std::map<uint64_t, int> tCurrentDevice;
thread_local std::map<uint64_t, GroupState> tGroups;

const std::set<std::string> &ncclCalls() {
  static const std::set<std::string> names = {
      "commInit", "commSplit", "commAsyncError", "commFinalize", "commDestroy", "commAbort", "createPreMulSum",
      "destroyRedOp", "groupStart", "groupEnd", "allReduce", "broadcast", "allGather",
      "reduceScatter", "reduce", "send", "recv", "memAlloc", "memFree", "commRegister",
      "commDeregister"};
  return names;
}

const std::set<std::string> &throwingCalls() {
  static const std::set<std::string> names = {
      "setDevice", "multiprocessors", "createStream", "createEvent", "recordEvent", "eventDone",
      "synchronizeEvent", "waitEvent", "hostCallback", "allocate", "copy", "zero", "batchedCopy", "scale",
      "createCancelFlag", "uniqueId"};
  return names;
}

}  // namespace

// ---- FakeCluster.

std::string FakeCluster::newUniqueId() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string id = detail::concat("fake-nccl-id-", nextId_++);
  id.resize(128, '\0');
  return id;
}

int FakeCluster::communicators() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(groups_.size());
}

std::shared_ptr<CommGroup> FakeCluster::join(const std::string &id, int size, int rank, int *result) {
  std::shared_ptr<CommGroup> g;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = groups_.find(id);
    if (it == groups_.end()) it = groups_.emplace(id, std::make_shared<CommGroup>(id, size)).first;
    g = it->second;
  }
  std::lock_guard<std::mutex> lock(g->mutex);
  if (g->size != size || g->ranks[static_cast<size_t>(rank)].joined) {
    *result = kNcclInvalidUsage;
    return nullptr;
  }
  g->ranks[static_cast<size_t>(rank)].joined = true;
  ++g->joined;
  g->cv.notify_all();
  *result = gpu::kNcclInProgress;
  return g;
}

// ---- FakeDevice: construction, controls, what happened.

FakeDevice::FakeDevice(FakeCluster &cluster, int rank, int deviceCount, int multiprocessors)
    : cluster_(cluster), rank_(rank), multiprocessors_(multiprocessors), serial_(nextSerial++),
      deviceCount_(deviceCount) {}

FakeDevice::~FakeDevice() {
  std::vector<Comm *> live;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held_ = false;
    cv_.notify_all();
    live.assign(comms_.begin(), comms_.end());
    comms_.clear();
  }
  stallArmed_ = false;
  for (Comm *c : live) endComm(c, false);
  std::map<Stream *, std::unique_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    streams.swap(streams_);
  }
  for (auto &s : streams) stopStream(s.second.get());
  for (auto &m : memory_) std::free(m.first);
  for (auto &m : ncclMemory_) std::free(m.first);
  for (auto &r : registrations_) delete static_cast<char *>(r.first);
  for (int *f : cancelFlags_) delete f;
  for (int *f : deadCancelFlags_) delete f;
}

void FakeDevice::hold(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  held_ = on;
  cv_.notify_all();
}

void FakeDevice::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  waitOrDie(lock, cv_, [&] {
    for (auto &s : streams_) {
      if (s.second->done != s.second->queued) return false;
    }
    return true;
  }, rank_, held_ ? "drain(): streams still held" : "drain(): streams not done");
}

void FakeDevice::failNext(const std::string &call, int ncclResult) {
  if (ncclCalls().count(call) == 0) {
    throw FakeMisuse("FakeDevice::failNext: '" + call + "' is not an NCCL call of DeviceApi");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  failNext_[call].push_back(ncclResult);
}

void FakeDevice::throwNext(const std::string &call) {
  if (throwingCalls().count(call) == 0) {
    throw FakeMisuse("FakeDevice::throwNext: '" + call + "' is not a DeviceApi call that throws");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ++throwNext_[call];
}

void FakeDevice::failAsync(int ncclResult) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (comms_.empty()) {
    pendingAsync_ = ncclResult;
    return;
  }
  for (Comm *c : comms_) {
    std::lock_guard<std::mutex> g(c->group->mutex);
    RankState &me = c->group->ranks[static_cast<size_t>(c->rank)];
    if (me.error == 0) {
      me.error = ncclResult;
      me.lastError = "injected by FakeDevice::failAsync";
    }
    c->group->cv.notify_all();
  }
}

void FakeDevice::stall(bool on) {
  if (on) {
    stallArmed_ = true;
    return;
  }
  stallArmed_ = false;
  ++stallGen_;
  std::lock_guard<std::mutex> lock(mutex_);
  for (Comm *c : comms_) {
    std::lock_guard<std::mutex> g(c->group->mutex);
    c->group->cv.notify_all();
  }
}

void FakeDevice::setDeviceCount(int count) {
  std::lock_guard<std::mutex> lock(mutex_);
  deviceCount_ = count;
}

void FakeDevice::setWhyNoDevice(std::string why) {
  std::lock_guard<std::mutex> lock(mutex_);
  whyNoDevice_ = std::move(why);
}

void FakeDevice::setKernelsReason(std::string why) {
  std::lock_guard<std::mutex> lock(mutex_);
  kernelsReason_ = std::move(why);
}

void FakeDevice::log(std::string text) const {
  std::lock_guard<std::mutex> lock(logMutex_);
  log_.push_back(Entry{std::move(text), std::this_thread::get_id()});
}

std::vector<std::string> FakeDevice::calls() const {
  std::lock_guard<std::mutex> lock(logMutex_);
  std::vector<std::string> out;
  for (const Entry &e : log_) out.push_back(e.text);
  return out;
}

int FakeDevice::count(const std::string &prefix) const {
  std::lock_guard<std::mutex> lock(logMutex_);
  int n = 0;
  for (const Entry &e : log_) n += e.text.compare(0, prefix.size(), prefix) == 0 ? 1 : 0;
  return n;
}

std::vector<std::string> FakeDevice::callsFrom(std::thread::id thread) const {
  std::lock_guard<std::mutex> lock(logMutex_);
  std::vector<std::string> out;
  for (const Entry &e : log_) {
    if (e.thread == thread) out.push_back(e.text);
  }
  return out;
}

void FakeDevice::clearCalls() {
  std::lock_guard<std::mutex> lock(logMutex_);
  log_.clear();
}

int FakeDevice::currentDevice() const {
  auto it = tCurrentDevice.find(serial_);
  return it == tCurrentDevice.end() ? -1 : it->second;
}

std::vector<FakeDevice::InitRecord> FakeDevice::inits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return inits_;
}

int FakeDevice::lastInitMaxCTAs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return inits_.empty() ? -1 : inits_.back().maxCTAs;
}

std::vector<int> FakeDevice::lastInitAffinity() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return inits_.empty() ? std::vector<int>{} : inits_.back().cpus;
}

int FakeDevice::allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocations_;
}

int FakeDevice::releases() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return releases_;
}

size_t FakeDevice::liveBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return liveBytes_;
}

int FakeDevice::liveAllocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(memory_.size());
}

int FakeDevice::liveStreams() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(streams_.size());
}

int FakeDevice::liveEvents() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(events_.size());
}

int FakeDevice::liveComms() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(comms_.size());
}

int FakeDevice::liveCancelFlags() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(cancelFlags_.size());
}

// ---- Helpers.

bool FakeDevice::injectedFailure(const std::string &call, int *result) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = failNext_.find(call);
  if (it == failNext_.end() || it->second.empty()) return false;
  *result = it->second.front();
  it->second.erase(it->second.begin());
  return true;
}

void FakeDevice::maybeThrow(const char *call) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = throwNext_.find(call);
    if (it == throwNext_.end() || it->second == 0) return;
    --it->second;
  }
  if (std::strcmp(call, "allocate") == 0) {
    HORA_THROW(HORA_ERR_BACKEND, call, ": CUDA error cudaErrorMemoryAllocation (out of memory)",
               " [injected by FakeDevice::throwNext]");
  }
  HORA_THROW(HORA_ERR_BACKEND, call, ": CUDA error cudaErrorLaunchFailure (unspecified launch failure)",
             " [injected by FakeDevice::throwNext]");
}

void FakeDevice::requireDevice(const char *call) const {
  int count;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    count = deviceCount_;
  }
  if (count == 0) {
    HORA_THROW(HORA_ERR_BACKEND, call, ": CUDA error cudaErrorNoDevice (no CUDA-capable device is detected)");
  }
}

Stream *FakeDevice::stream(gpu::StreamHandle handle, const char *call) {
  if (handle == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  auto *s = static_cast<Stream *>(handle);
  if (streams_.count(s) == 0) {
    throw FakeMisuse(detail::concat("FakeDevice rank ", rank_, ": ", call, " on stream ", handle,
                                    ", not a live stream of this device"));
  }
  return s;
}

Event *FakeDevice::event(gpu::EventHandle handle, const char *call) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto *e = static_cast<Event *>(handle);
  if (events_.count(e) == 0) {
    throw FakeMisuse(detail::concat("FakeDevice rank ", rank_, ": ", call, " on event ", handle,
                                    ", not a live event of this device (never created, or destroyed)"));
  }
  return e;
}

Comm *FakeDevice::comm(gpu::CommHandle handle, const char *call) noexcept {
  if (handle == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  auto *c = static_cast<Comm *>(handle);
  if (comms_.count(c) == 0) {
    die(detail::concat("rank ", rank_, ": ", call, " on communicator ", handle,
                       ", not a live communicator of this device (never made, destroyed or aborted)"));
  }
  return c;
}

void FakeDevice::enqueue(Stream *s, std::unique_ptr<Op> op, bool launch) {
  if (s == nullptr) {  // the legacy default stream: nothing else queued on it here
    op->run();
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (s->launching > 0 && !launch) {
    die(detail::concat("rank ", rank_, ": work queued on a stream whose NCCL launch returned "
                       "ncclInProgress and has not settled: on a GPU it would run before the NCCL "
                       "kernel (poll ncclCommGetAsyncError until ncclSuccess first)"));
  }
  s->queue.push_back(std::move(op));
  ++s->queued;
  cv_.notify_all();
}

void FakeDevice::worker(Stream *s) {
  pthread_setname_np(pthread_self(), detail::concat("fake r", rank_, " strm").substr(0, 15).c_str());
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return !s->queue.empty() || s->stopping; });
    if (s->queue.empty()) return;
    waitOrDie(lock, cv_, [&] { return !held_; }, rank_, "a stream held by hold(true)");
    std::unique_ptr<Op> op = std::move(s->queue.front());
    s->queue.pop_front();
    lock.unlock();
    op->run();
    op.reset();
    lock.lock();
    ++s->done;
    cv_.notify_all();
  }
}

void FakeDevice::stopStream(Stream *s) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s->stopping = true;
    cv_.notify_all();
  }
  s->worker.join();
}

// ---- CUDA.

int FakeDevice::deviceCount() noexcept {
  log("deviceCount");
  std::lock_guard<std::mutex> lock(mutex_);
  return deviceCount_;
}

std::string FakeDevice::whyNoDevice() noexcept {
  log("whyNoDevice");
  std::lock_guard<std::mutex> lock(mutex_);
  return deviceCount_ > 0 ? std::string() : whyNoDevice_;
}

std::shared_ptr<void> FakeDevice::keepContext() noexcept {
  log("keepContext");
  const int saved = currentDevice();
  const uint64_t serial = serial_;
  return std::shared_ptr<void>(reinterpret_cast<void *>(uintptr_t{1}), [saved, serial](void *) {
    if (saved < 0) {
      tCurrentDevice.erase(serial);
    } else {
      tCurrentDevice[serial] = saved;
    }
  });
}

void FakeDevice::setDevice(int device) {
  log(detail::concat("setDevice ", device));
  maybeThrow("setDevice");
  requireDevice("cudaSetDevice");
  int count;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    count = deviceCount_;
  }
  if (device < 0 || device >= count) {
    HORA_THROW(HORA_ERR_BACKEND, "cudaSetDevice: CUDA error cudaErrorInvalidDevice (invalid device ordinal)");
  }
  tCurrentDevice[serial_] = device;
}

int FakeDevice::multiprocessors(int device) {
  log(detail::concat("multiprocessors ", device));
  maybeThrow("multiprocessors");
  requireDevice("cudaDeviceGetAttribute");
  std::lock_guard<std::mutex> lock(mutex_);
  if (device < 0 || device >= deviceCount_) {
    HORA_THROW(HORA_ERR_BACKEND, "cudaDeviceGetAttribute: CUDA error cudaErrorInvalidDevice (invalid device ordinal)");
  }
  return multiprocessors_;
}

std::string FakeDevice::kernelsRunOn(int device) noexcept {
  log(detail::concat("kernelsRunOn ", device));
  std::lock_guard<std::mutex> lock(mutex_);
  return kernelsReason_;
}

gpu::StreamHandle FakeDevice::createStream() {
  log("createStream");
  maybeThrow("createStream");
  requireDevice("cudaStreamCreateWithFlags");
  auto s = std::make_unique<Stream>();
  Stream *raw = s.get();
  const int current = currentDevice();
  raw->device = current < 0 ? 0 : current;
  // The worker takes the lock before it reads the stream.
  std::lock_guard<std::mutex> lock(mutex_);
  raw->worker = std::thread([this, raw] { worker(raw); });
  streams_.emplace(raw, std::move(s));
  return raw;
}

void FakeDevice::destroyStream(gpu::StreamHandle handle) noexcept {
  log("destroyStream");
  if (handle == nullptr) return;
  std::unique_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = streams_.find(static_cast<Stream *>(handle));
    if (it == streams_.end()) {
      die(detail::concat("rank ", rank_, ": destroyStream of ", handle, ", not a live stream"));
    }
    s = std::move(it->second);
    streams_.erase(it);
  }
  stopStream(s.get());
}

gpu::EventHandle FakeDevice::createEvent() {
  log("createEvent");
  maybeThrow("createEvent");
  requireDevice("cudaEventCreateWithFlags");
  auto e = std::make_shared<Event>();
  std::lock_guard<std::mutex> lock(mutex_);
  events_.emplace(e.get(), e);
  return e.get();
}

void FakeDevice::destroyEvent(gpu::EventHandle handle) noexcept {
  log("destroyEvent");
  if (handle == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (events_.erase(static_cast<Event *>(handle)) == 0) {
    die(detail::concat("rank ", rank_, ": destroyEvent of ", handle, ", not a live event"));
  }
}

void FakeDevice::recordEvent(gpu::EventHandle handle, gpu::StreamHandle streamHandle) {
  log("recordEvent");
  maybeThrow("recordEvent");
  requireDevice("cudaEventRecord");
  event(handle, "recordEvent");
  Stream *s = stream(streamHandle, "recordEvent");
  std::shared_ptr<Event> e;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    e = events_.at(static_cast<Event *>(handle));
    gen = ++e->recordGen;
  }
  auto op = std::make_unique<Op>();
  op->run = [this, e, gen] {
    std::lock_guard<std::mutex> lock(mutex_);
    e->doneGen = std::max(e->doneGen, gen);
    cv_.notify_all();
  };
  enqueue(s, std::move(op));
}

bool FakeDevice::eventDone(gpu::EventHandle handle) {
  log("eventDone");
  maybeThrow("eventDone");
  Event *e = event(handle, "eventDone");
  std::lock_guard<std::mutex> lock(mutex_);
  return e->doneGen >= e->recordGen;
}

void FakeDevice::synchronizeEvent(gpu::EventHandle handle) {
  log("synchronizeEvent");
  maybeThrow("synchronizeEvent");
  event(handle, "synchronizeEvent");
  std::unique_lock<std::mutex> lock(mutex_);
  std::shared_ptr<Event> e = events_.at(static_cast<Event *>(handle));
  const uint64_t gen = e->recordGen;  // the record at the time of the call, as CUDA's
  waitOrDie(lock, cv_, [&] { return e->doneGen >= gen; }, rank_, "synchronizeEvent");
}

void FakeDevice::waitEvent(gpu::StreamHandle streamHandle, gpu::EventHandle handle) {
  log("waitEvent");
  maybeThrow("waitEvent");
  requireDevice("cudaStreamWaitEvent");
  event(handle, "waitEvent");
  Stream *s = stream(streamHandle, "waitEvent");
  std::shared_ptr<Event> e;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    e = events_.at(static_cast<Event *>(handle));
    gen = e->recordGen;  // the record at the time of the call, as CUDA's
  }
  if (gen == 0) return;  // never recorded: nothing to wait for
  auto op = std::make_unique<Op>();
  op->run = [this, e, gen] {
    std::unique_lock<std::mutex> lock(mutex_);
    waitOrDie(lock, cv_, [&] { return e->doneGen >= gen; }, rank_, "a stream waiting for an event");
  };
  enqueue(s, std::move(op));
}

void FakeDevice::hostCallback(gpu::StreamHandle streamHandle, void (*fn)(void *), void *arg) {
  log("hostCallback");
  maybeThrow("hostCallback");
  requireDevice("cudaLaunchHostFunc");
  Stream *s = stream(streamHandle, "hostCallback");
  auto op = std::make_unique<Op>();
  op->run = [fn, arg] { fn(arg); };
  enqueue(s, std::move(op));
}

void *FakeDevice::allocate(size_t bytes, gpu::StreamHandle streamHandle) {
  log(detail::concat("allocate ", bytes));
  maybeThrow("allocate");
  requireDevice("cudaMallocAsync");
  stream(streamHandle, "allocate");
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  void *p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) HORA_THROW(HORA_ERR_BACKEND, "cudaMallocAsync: CUDA error cudaErrorMemoryAllocation (out of memory)");
  std::memset(p, 0xA5, rounded);
  std::lock_guard<std::mutex> lock(mutex_);
  memory_.emplace(p, bytes);
  ++allocations_;
  liveBytes_ += bytes;
  return p;
}

void FakeDevice::release(void *data, gpu::StreamHandle streamHandle) noexcept {
  if (data == nullptr) {
    log("release 0");
    return;
  }
  Stream *s;
  size_t bytes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = memory_.find(data);
    if (it == memory_.end()) {
      die(detail::concat("rank ", rank_, ": release of ", data, ", not live memory of this device"));
    }
    s = static_cast<Stream *>(streamHandle);
    if (s != nullptr && streams_.count(s) == 0) {
      die(detail::concat("rank ", rank_, ": release on stream ", streamHandle, ", not a live stream"));
    }
    bytes = it->second;
    memory_.erase(it);
    ++releases_;
    liveBytes_ -= bytes;
  }
  log(detail::concat("release ", bytes));
  auto op = std::make_unique<Op>();
  op->run = [data] { std::free(data); };
  enqueue(s, std::move(op));
}

void FakeDevice::copy(void *dst, const void *src, size_t bytes, gpu::StreamHandle streamHandle) {
  log(detail::concat("copy ", bytes));
  maybeThrow("copy");
  requireDevice("cudaMemcpyAsync");
  Stream *s = stream(streamHandle, "copy");
  auto op = std::make_unique<Op>();
  op->run = [dst, src, bytes] {
    if (bytes > 0) std::memmove(dst, src, bytes);
  };
  enqueue(s, std::move(op));
}

void FakeDevice::zero(void *data, size_t bytes, gpu::StreamHandle streamHandle) {
  log(detail::concat("zero ", bytes));
  maybeThrow("zero");
  requireDevice("cudaMemsetAsync");
  Stream *s = stream(streamHandle, "zero");
  auto op = std::make_unique<Op>();
  op->run = [data, bytes] {
    if (bytes > 0) std::memset(data, 0, bytes);
  };
  enqueue(s, std::move(op));
}

void FakeDevice::batchedCopy(const std::vector<nccl_kernels::CopyItem> &items, const int *cancel,
                             gpu::StreamHandle streamHandle) {
  int64_t total = 0;
  for (const auto &item : items) total += item.bytes;
  log(detail::concat("batchedCopy items=", items.size(), " bytes=", total));
  maybeThrow("batchedCopy");
  requireDevice("batchedCopy");
  Stream *s = stream(streamHandle, "batchedCopy");
  auto op = std::make_unique<Op>();
  op->run = [this, items, cancel] {
    // The kernel reads the flag as it starts (a plain load of mapped memory there).
    if (cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_ACQUIRE) != 0) {
      log("stream: batchedCopy cancelled");
      return;
    }
    for (const auto &item : items) {
      if (item.bytes > 0) std::memcpy(item.dst, item.src, static_cast<size_t>(item.bytes));
    }
  };
  enqueue(s, std::move(op));
}

void FakeDevice::scale(void *data, int64_t count, DType dtype, double factor, const int *cancel,
                       gpu::StreamHandle streamHandle) {
  log(detail::concat("scale count=", count, " dtype=", dtypeName(dtype), " factor=", factor));
  maybeThrow("scale");
  requireDevice("scale");
  Stream *s = stream(streamHandle, "scale");
  if (count == 0 || factor == 1.0) return;  // no launch, as the kernel's wrapper
  if (!isFloating(dtype)) {
    HORA_THROW(HORA_ERR_BACKEND, "scale of ", dtypeName(dtype),
               ": CUDA error cudaErrorInvalidValue (invalid argument)");
  }
  auto op = std::make_unique<Op>();
  op->run = [this, data, count, dtype, factor, cancel] {
    if (cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_ACQUIRE) != 0) {
      log("stream: scale cancelled");
      return;
    }
    char *buf = static_cast<char *>(data);
    const auto n = static_cast<size_t>(count);
    if (dtype == DType::kFloat64) {
      for (size_t i = 0; i < n; ++i) storeF(buf, i, dtype, loadF(buf, i, dtype) * factor);
    } else {  // float32 arithmetic, rounded once into the dtype
      const float f = static_cast<float>(factor);
      for (size_t i = 0; i < n; ++i) {
        storeF(buf, i, dtype, static_cast<double>(static_cast<float>(loadF(buf, i, dtype)) * f));
      }
    }
  };
  enqueue(s, std::move(op));
}

gpu::DeviceApi::CancelFlag FakeDevice::createCancelFlag() {
  log("createCancelFlag");
  maybeThrow("createCancelFlag");
  requireDevice("cudaHostAlloc");
  int *p = new int(0);
  std::lock_guard<std::mutex> lock(mutex_);
  cancelFlags_.insert(p);
  return CancelFlag{p, p};
}

void FakeDevice::destroyCancelFlag(CancelFlag flag) noexcept {
  log("destroyCancelFlag");
  if (flag.host == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (cancelFlags_.erase(flag.host) == 0) {
    die(detail::concat("rank ", rank_, ": destroyCancelFlag of ", flag.host, ", not a live cancel flag"));
  }
  deadCancelFlags_.push_back(flag.host);
}

// ---- NCCL.

std::string FakeDevice::ncclVersion() noexcept {
  log("ncclVersion");
  return "2.28.fake";
}

std::string FakeDevice::ncclErrorString(int result) noexcept {
  log(detail::concat("ncclErrorString ", result));
  switch (result) {
    case 0: return "ncclSuccess (no error)";
    case 1: return "ncclUnhandledCudaError (unhandled cuda error)";
    case 2: return "ncclSystemError (unhandled system error)";
    case 3: return "ncclInternalError (internal error)";
    case 4: return "ncclInvalidArgument (invalid argument)";
    case 5: return "ncclInvalidUsage (invalid usage)";
    case 6: return "ncclRemoteError (remote process exited or there was a network error)";
    case 7: return "ncclInProgress (NCCL operation in progress)";
    default: return detail::concat("unknown result code ", result);
  }
}

std::string FakeDevice::uniqueId() {
  log("uniqueId");
  maybeThrow("uniqueId");
  return cluster_.newUniqueId();
}

int FakeDevice::commInit(gpu::CommHandle *comm, const std::string &uniqueId, int size, int rank,
                         int maxCTAs) noexcept {
  log(detail::concat("commInit size=", size, " rank=", rank, " maxCTAs=", maxCTAs));
  const int current = currentDevice();
  InitRecord record{maxCTAs, allowedCpus(), current, std::this_thread::get_id()};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inits_.push_back(std::move(record));
  }
  if (comm == nullptr) return kNcclInvalidArgument;
  *comm = nullptr;
  int result;
  if (injectedFailure("commInit", &result)) {
    // NCCL made a communicator and it failed: the caller must abort it.
    auto solo = std::make_shared<CommGroup>(uniqueId, 1);
    solo->ranks[0].joined = true;
    solo->joined = 1;
    solo->ranks[0].error = result;
    solo->ranks[0].lastError = "commInit failed (injected by FakeDevice::failNext)";
    auto *c = new Comm{solo, 0, current < 0 ? 0 : current, {}, kNumBuiltinOps};
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.insert(c);
    *comm = c;
    return result;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (deviceCount_ == 0) return kNcclUnhandledCudaError;
  }
  if (size < 1 || rank < 0 || rank >= size) return kNcclInvalidArgument;
  std::shared_ptr<CommGroup> g = cluster_.join(uniqueId, size, rank, &result);
  if (g == nullptr) return result;
  auto *c = new Comm{g, rank, current < 0 ? 0 : current, {}, kNumBuiltinOps};
  std::lock_guard<std::mutex> lock(mutex_);
  if (pendingAsync_ != 0) {
    std::lock_guard<std::mutex> gl(g->mutex);
    g->ranks[static_cast<size_t>(rank)].error = pendingAsync_;
    g->ranks[static_cast<size_t>(rank)].lastError = "injected by FakeDevice::failAsync";
    pendingAsync_ = 0;
  }
  comms_.insert(c);
  *comm = c;
  return gpu::kNcclInProgress;
}

int FakeDevice::commSplit(gpu::CommHandle parent, int color, int key, gpu::CommHandle *comm,
                          int maxCTAs) noexcept {
  log(detail::concat("commSplit color=", color, " key=", key, " maxCTAs=", maxCTAs));
  if (comm == nullptr) return kNcclInvalidArgument;
  *comm = nullptr;
  int result;
  if (injectedFailure("commSplit", &result)) return result;
  Comm *p = this->comm(parent, "commSplit");
  if (p == nullptr) return kNcclInvalidArgument;
  CommGroup &g = *p->group;
  constexpr int kNotPosted = -2;
  uint64_t seq = 0;
  std::vector<std::pair<int, int>> posts;
  {
    std::unique_lock<std::mutex> lock(g.mutex);
    seq = g.ranks[static_cast<size_t>(p->rank)].nextSplit++;
    std::vector<std::pair<int, int>> &mine = g.splits[seq];
    if (mine.empty()) mine.assign(static_cast<size_t>(g.size), {kNotPosted, 0});
    mine[static_cast<size_t>(p->rank)] = {color < 0 ? gpu::kSplitNoColor : color, key};
    g.cv.notify_all();
    const bool all = g.cv.wait_for(lock, std::chrono::seconds(20), [&] {
      const std::vector<std::pair<int, int>> &v = g.splits[seq];
      return std::none_of(v.begin(), v.end(), [](const std::pair<int, int> &e) { return e.first == kNotPosted; });
    });
    if (!all) return kNcclInvalidUsage;  // a rank of the parent never took part
    posts = g.splits[seq];
  }
  if (color < 0) return gpu::kNcclSuccess;
  std::vector<int> members;  // ranked by key, then by rank in the parent
  for (int r = 0; r < g.size; ++r) {
    if (posts[static_cast<size_t>(r)].first == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return posts[static_cast<size_t>(a)].second < posts[static_cast<size_t>(b)].second;
  });
  const int size = static_cast<int>(members.size());
  const int rank = static_cast<int>(std::find(members.begin(), members.end(), p->rank) - members.begin());
  std::shared_ptr<CommGroup> child =
      cluster_.join(detail::concat(g.id, "/split", seq, "/color", color), size, rank, &result);
  if (child == nullptr) return result;
  auto *c = new Comm{child, rank, p->device, {}, kNumBuiltinOps};
  std::lock_guard<std::mutex> lock(mutex_);
  comms_.insert(c);
  *comm = c;
  return gpu::kNcclInProgress;
}

int FakeDevice::commAsyncError(gpu::CommHandle handle, int *state) noexcept {
  log("commAsyncError");
  int result;
  if (injectedFailure("commAsyncError", &result)) return result;
  Comm *c = comm(handle, "commAsyncError");
  if (c == nullptr || state == nullptr) return kNcclInvalidArgument;
  CommGroup &g = *c->group;
  std::vector<PendingCall> launched;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    RankState &me = g.ranks[static_cast<size_t>(c->rank)];
    if (me.error != 0) {
      *state = me.error;
      return gpu::kNcclSuccess;
    }
    if (!me.launching.empty() && --me.launchPolls <= 0) launched.swap(me.launching);
    if (g.joined < g.size || (me.finalizing && me.pending > 0) || !me.launching.empty()) {
      *state = gpu::kNcclInProgress;
      return gpu::kNcclSuccess;
    }
  }
  if (!launched.empty()) {  // the launch settles now: its work reaches the streams, then others'
    std::vector<Stream *> streams;
    for (const PendingCall &p : launched) streams.push_back(p.stream);
    flushGroup(std::move(launched));
    std::lock_guard<std::mutex> lock(mutex_);
    for (Stream *st : streams) --st->launching;
  }
  *state = gpu::kNcclSuccess;
  return gpu::kNcclSuccess;
}

std::string FakeDevice::commLastError(gpu::CommHandle handle) noexcept {
  log("commLastError");
  Comm *c = comm(handle, "commLastError");
  if (c == nullptr) return "";
  std::lock_guard<std::mutex> lock(c->group->mutex);
  return c->group->ranks[static_cast<size_t>(c->rank)].lastError;
}

int FakeDevice::commFinalize(gpu::CommHandle handle) noexcept {
  log("commFinalize");
  int result;
  if (injectedFailure("commFinalize", &result)) return result;
  Comm *c = comm(handle, "commFinalize");
  if (c == nullptr) return kNcclInvalidArgument;
  std::lock_guard<std::mutex> lock(c->group->mutex);
  c->group->ranks[static_cast<size_t>(c->rank)].finalizing = true;
  return gpu::kNcclInProgress;
}

void FakeDevice::endComm(Comm *c, bool destroyed) {
  CommGroup &g = *c->group;
  std::vector<PendingCall> dropped;  // a launch that never settled: nothing of it runs
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    dropped.swap(g.ranks[static_cast<size_t>(c->rank)].launching);
  }
  if (!dropped.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);  // (never taken while holding a group's)
    for (const PendingCall &p : dropped) --p.stream->launching;
  }
  {
    std::unique_lock<std::mutex> lock(g.mutex);
    RankState &me = g.ranks[static_cast<size_t>(c->rank)];
    (destroyed ? me.destroyed : me.aborted) = true;
    g.cv.notify_all();
    waitOrDie(lock, g.cv, [&] { return me.active == 0; }, rank_,
              "commAbort/commDestroy waiting for this rank's op to end");
  }
  delete c;
}

int FakeDevice::commDestroy(gpu::CommHandle handle) noexcept {
  log("commDestroy");
  int result;
  if (injectedFailure("commDestroy", &result)) return result;
  Comm *c = comm(handle, "commDestroy");
  if (c == nullptr) return kNcclInvalidArgument;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.erase(c);
  }
  endComm(c, true);
  return gpu::kNcclSuccess;
}

int FakeDevice::commAbort(gpu::CommHandle handle) noexcept {
  log("commAbort");
  int result;
  if (injectedFailure("commAbort", &result)) return result;
  Comm *c = comm(handle, "commAbort");
  if (c == nullptr) return gpu::kNcclSuccess;  // NCCL: aborting NULL is a no-op
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.erase(c);
    for (auto it = registrations_.begin(); it != registrations_.end();) {
      if (it->second.comm == c) {
        delete static_cast<char *>(it->first);
        it = registrations_.erase(it);
      } else {
        ++it;
      }
    }
  }
  endComm(c, false);
  return gpu::kNcclSuccess;
}

// ncclMemAlloc'ed memory is host memory here too, kept apart from allocate()'s. A registration
// lives until commDeregister; a communicator's abort drops its registrations (NCCL frees its
// resources), its destroy does not: liveRegistrations() then shows one never deregistered.
int FakeDevice::memAlloc(void **data, size_t bytes) noexcept {
  log(detail::concat("memAlloc ", bytes));
  int result;
  if (injectedFailure("memAlloc", &result)) return result;
  if (data == nullptr) return kNcclInvalidArgument;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  void *p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) return kNcclUnhandledCudaError;
  std::memset(p, 0xA5, rounded);
  std::lock_guard<std::mutex> lock(mutex_);
  ncclMemory_.emplace(p, bytes);
  *data = p;
  return gpu::kNcclSuccess;
}

int FakeDevice::memFree(void *data) noexcept {
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = ncclMemory_.find(data);
    if (it == ncclMemory_.end()) die(detail::concat("rank ", rank_, ": memFree of ", data, ", not memAlloc'ed"));
    for (const auto &r : registrations_) {
      if (r.second.data == data) die(detail::concat("rank ", rank_, ": memFree of registered memory"));
    }
    bytes = it->second;
    ncclMemory_.erase(it);
  }
  log(detail::concat("memFree ", bytes));
  std::free(data);
  return gpu::kNcclSuccess;
}

int FakeDevice::commRegister(gpu::CommHandle handle, void *data, size_t bytes, void **reg) noexcept {
  log(detail::concat("commRegister ", bytes));
  int result;
  if (injectedFailure("commRegister", &result)) return result;
  Comm *c = comm(handle, "commRegister");
  if (c == nullptr || reg == nullptr || data == nullptr) return kNcclInvalidArgument;
  if (!launchPending(c).empty()) return kNcclInvalidUsage;
  std::lock_guard<std::mutex> lock(mutex_);
  void *token = new char;
  registrations_[token] = Registration{c, data, bytes};
  *reg = token;
  return gpu::kNcclSuccess;
}

int FakeDevice::commDeregister(gpu::CommHandle handle, void *reg) noexcept {
  log("commDeregister");
  int result;
  if (injectedFailure("commDeregister", &result)) return result;
  Comm *c = comm(handle, "commDeregister");
  if (c == nullptr) return kNcclInvalidArgument;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = registrations_.find(reg);
  if (it == registrations_.end() || it->second.comm != c) return kNcclInvalidArgument;
  delete static_cast<char *>(reg);
  registrations_.erase(it);
  return gpu::kNcclSuccess;
}

int FakeDevice::liveNcclMemory() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(ncclMemory_.size());
}

int FakeDevice::liveRegistrations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(registrations_.size());
}

int FakeDevice::createPreMulSum(gpu::RedOp *op, DType dtype, double factor, gpu::CommHandle handle) noexcept {
  log(detail::concat("createPreMulSum dtype=", dtypeName(dtype), " factor=", factor));
  int result;
  if (injectedFailure("createPreMulSum", &result)) return result;
  Comm *c = comm(handle, "createPreMulSum");
  if (c == nullptr || op == nullptr) return kNcclInvalidArgument;
  if (!launchPending(c).empty()) return kNcclInvalidUsage;
  std::lock_guard<std::mutex> lock(mutex_);
  const int id = c->nextRedOp++;
  c->redOps[id] = {dtype, factor};
  *op = id;
  return gpu::kNcclSuccess;
}

int FakeDevice::destroyRedOp(gpu::RedOp op, gpu::CommHandle handle) noexcept {
  log(detail::concat("destroyRedOp ", op));
  int result;
  if (injectedFailure("destroyRedOp", &result)) return result;
  Comm *c = comm(handle, "destroyRedOp");
  if (c == nullptr) return kNcclInvalidArgument;
  if (!launchPending(c).empty()) return kNcclInvalidUsage;
  std::lock_guard<std::mutex> lock(mutex_);
  return c->redOps.erase(op) == 1 ? gpu::kNcclSuccess : kNcclInvalidArgument;
}

int FakeDevice::groupStart() noexcept {
  log("groupStart");
  int result;
  if (injectedFailure("groupStart", &result)) return result;
  ++tGroups[serial_].depth;
  return gpu::kNcclSuccess;
}

int FakeDevice::groupEnd() noexcept {
  log("groupEnd");
  auto open = tGroups.find(serial_);
  if (open == tGroups.end() || open->second.depth == 0) return kNcclInvalidUsage;
  GroupState &group = open->second;
  int result;
  const bool failed = injectedFailure("groupEnd", &result);
  if (--group.depth > 0) return failed ? result : gpu::kNcclSuccess;
  std::vector<PendingCall> calls;
  calls.swap(group.calls);
  tGroups.erase(serial_);
  if (failed) return result;  // nothing of the group is queued
  return launch(std::move(calls));
}

// Validates a call on `handle` and queues it, or keeps it for groupEnd inside a group.
int FakeDevice::queueNccl(gpu::CommHandle handle, gpu::StreamHandle streamHandle, Call call) noexcept {
  const char *name = kindName(call.kind);
  Comm *c = comm(handle, name);
  if (c == nullptr) return kNcclInvalidArgument;
  CommGroup &g = *c->group;
  RankState &me = g.ranks[static_cast<size_t>(c->rank)];
  auto refuse = [&](int result, const std::string &why) {
    std::lock_guard<std::mutex> lock(g.mutex);
    me.lastError = why;
    return result;
  };
  if (streamHandle == nullptr) return refuse(kNcclInvalidArgument, detail::concat(name, " on the null stream"));
  auto *s = static_cast<Stream *>(streamHandle);
  bool knownOp = call.redOp >= 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (streams_.count(s) == 0) {
      die(detail::concat("rank ", rank_, ": ", name, " on stream ", streamHandle, ", not a live stream"));
    }
    if (call.redOp >= kNumBuiltinOps) {
      auto it = c->redOps.find(call.redOp);
      knownOp = it != c->redOps.end() && it->second.first == call.dtype;
      if (knownOp) call.factor = it->second.second;
    }
  }
  if (!knownOp) {
    return refuse(kNcclInvalidArgument, detail::concat(name, ": no reduction operator ", call.redOp,
                                                       " for ", dtypeName(call.dtype)));
  }
  if (call.root < 0 || call.root >= g.size) {
    return refuse(kNcclInvalidArgument, detail::concat(name, ": rank ", call.root, " of ", g.size));
  }
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    if (me.error != 0) return me.error;
    if (!me.launching.empty()) {
      me.lastError = detail::concat(name, " while this rank's previous launch on the communicator is in "
                                    "progress (ncclInProgress: poll ncclCommGetAsyncError until ncclSuccess)");
      return kNcclInvalidUsage;
    }
    if (g.joined < g.size) {
      me.lastError = detail::concat(name, " before the communicator is ready (", g.joined, " of ",
                                    g.size, " ranks joined)");
      return kNcclInvalidUsage;
    }
  }
  PendingCall pending{c->group, c->rank, s, call};
  GroupState &group = tGroups[serial_];
  if (group.depth > 0) {
    group.calls.push_back(std::move(pending));
    return gpu::kNcclSuccess;
  }
  tGroups.erase(serial_);
  std::vector<PendingCall> one;
  one.push_back(std::move(pending));
  return launch(std::move(one));
}

int FakeDevice::launch(std::vector<PendingCall> calls) {
  // Non-blocking at N > 1: one communicator's calls (hora's groups never span two).
  bool defer = launchInProgress_.load() && !calls.empty();
  for (const PendingCall &p : calls) {
    defer = defer && p.group == calls.front().group && p.rank == calls.front().rank && p.group->size > 1;
  }
  if (!defer) {
    flushGroup(std::move(calls));
    return gpu::kNcclSuccess;
  }
  CommGroup &g = *calls.front().group;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const PendingCall &p : calls) ++p.stream->launching;
  }
  std::lock_guard<std::mutex> lock(g.mutex);
  RankState &me = g.ranks[static_cast<size_t>(calls.front().rank)];
  me.launching = std::move(calls);
  me.launchPolls = 2;
  return gpu::kNcclInProgress;
}

std::string FakeDevice::launchPending(Comm *c) {
  std::lock_guard<std::mutex> lock(c->group->mutex);
  RankState &me = c->group->ranks[static_cast<size_t>(c->rank)];
  if (me.launching.empty()) return "";
  me.lastError = "a call while this rank's previous launch on the communicator is in progress "
                 "(ncclInProgress: poll ncclCommGetAsyncError until ncclSuccess)";
  return me.lastError;
}

// One op per (stream, communicator) of a group, in the order of their first call.
void FakeDevice::flushGroup(std::vector<PendingCall> calls) {
  std::vector<std::pair<Stream *, std::shared_ptr<NcclItem>>> items;
  for (PendingCall &p : calls) {
    std::shared_ptr<NcclItem> item;
    for (auto &existing : items) {
      if (existing.first == p.stream && existing.second->group == p.group && existing.second->rank == p.rank) {
        item = existing.second;
      }
    }
    if (item == nullptr) {
      item = std::make_shared<NcclItem>();
      item->group = p.group;
      item->rank = p.rank;
      items.emplace_back(p.stream, item);
    }
    const bool p2p = p.call.kind == Kind::kSend || p.call.kind == Kind::kRecv;
    (p2p ? item->p2p : item->colls).push_back(p.call);
    item->name += item->name.empty() ? kindName(p.call.kind) : detail::concat("+", kindName(p.call.kind));
  }
  for (auto &[s, item] : items) {
    {
      std::lock_guard<std::mutex> lock(item->group->mutex);
      RankState &me = item->group->ranks[static_cast<size_t>(item->rank)];
      if (!item->colls.empty()) item->seq = me.nextSeq++;
      ++me.pending;
    }
    auto op = std::make_unique<Op>();
    op->run = [this, item = item] {
      // exclusive(true): one collective at a time on this "GPU", held while it waits for its
      // peers, as a GPU whose SMs (or hardware queue) one NCCL kernel fills.
      std::unique_lock<std::mutex> gpu(exclusiveMutex_, std::defer_lock);
      if (exclusive_.load()) gpu.lock();
      runNccl(*item);
    };
    enqueue(s, std::move(op), true);
  }
}

// An NCCL op as a worker reaches it; see the comment at the top of this file.
void FakeDevice::runNccl(const NcclItem &it) {
  CommGroup &g = *it.group;
  const int r = it.rank;
  const int n = g.size;
  std::unique_lock<std::mutex> lock(g.mutex);
  RankState &me = g.ranks[static_cast<size_t>(r)];
  ++me.active;
  auto failed = [&] { return me.aborted || me.destroyed || me.error != 0; };
  auto why = [&] {
    if (me.aborted) return std::string("aborted");
    if (me.destroyed) return std::string("destroyed");
    return detail::concat("error ", me.error, ": ", me.lastError);
  };
  auto finish = [&] {
    --me.active;
    --me.pending;
    g.cv.notify_all();
  };
  if (failed()) {
    log(detail::concat("stream: ", it.name, " skipped (", why(), ")"));
    finish();
    return;
  }
  const uint64_t stallGen = stallGen_.load();
  if (stallArmed_.exchange(false)) {
    log(detail::concat("stream: ", it.name, " stalled"));
    waitOrDie(lock, g.cv, [&] { return failed() || stallGen_.load() != stallGen; }, rank_,
              "an op stalled by stall(true) not aborted");
    if (failed()) {
      log(detail::concat("stream: ", it.name, " ended without writing (", why(), ")"));
      finish();
      return;
    }
  }
  // Posted below before the lock is let go: a test that sees the count can rely on it.
  ++ncclInProgress_;
  auto finishPosted = [&] {
    --ncclInProgress_;
    finish();
  };
  auto remoteError = [&](int peer, const char *what) {
    if (!failed()) {
      me.error = kNcclRemoteError;
      me.lastError = detail::concat("rank ", peer, " ", what);
    }
  };

  // Sends first, so that receives of a group never wait on each other.
  std::vector<std::shared_ptr<SendPost>> sends;
  for (const Call &c : it.p2p) {
    if (c.kind != Kind::kSend) continue;
    auto post = std::make_shared<SendPost>(SendPost{c.in, c.count, c.root});
    g.channels[{r, c.root}].push_back(post);
    sends.push_back(post);
  }
  if (!sends.empty()) g.cv.notify_all();
  auto withdrawSends = [&] {
    for (auto &p : sends) {
      if (!p->consumed) p->withdrawn = true;
    }
    g.cv.notify_all();
  };

  Outputs outputs;
  Slot *slot = nullptr;
  if (!it.colls.empty()) {
    slot = &g.slots[it.seq];
    if (slot->posted.empty()) slot->posted.assign(static_cast<size_t>(n), nullptr);
    slot->posted[static_cast<size_t>(r)] = &it.colls;
    if (++slot->arrived == n) slot->complete = true;
    g.cv.notify_all();
    int lost = -1;
    auto peerGone = [&] {
      for (int p = 0; p < n; ++p) {
        if (p != r && slot->posted[static_cast<size_t>(p)] == nullptr && g.gone(p)) {
          lost = p;
          return true;
        }
      }
      return false;
    };
    waitOrDie(lock, g.cv, [&] { return slot->complete || failed() || peerGone(); }, rank_,
              "a collective waiting for its peers");
    if (!slot->complete) {
      slot->posted[static_cast<size_t>(r)] = nullptr;
      --slot->arrived;
      if (lost >= 0) remoteError(lost, "left the communicator (aborted or destroyed) before this collective");
      withdrawSends();
      log(detail::concat("stream: ", it.name, " ended without writing (", why(), ")"));
      finishPosted();
      return;
    }
    // Every rank is here and none leaves before all have read: the inputs stay put.
    const std::string differs = disagreement(slot->posted);
    if (!differs.empty()) {
      if (me.error == 0) {
        me.error = kNcclInvalidUsage;
        me.lastError = "ranks disagree on a collective: " + differs;
      }
    } else if (!failed()) {
      computeCollectives(slot->posted, r, outputs);
    }
    ++slot->readDone;
    g.cv.notify_all();
  }

  // Receives in call order, each matched with the oldest send to this rank from its peer.
  for (const Call &c : it.p2p) {
    if (c.kind != Kind::kRecv || failed()) continue;
    auto &channel = g.channels[{c.root, r}];
    waitOrDie(lock, g.cv, [&] { return !channel.empty() || failed() || g.gone(c.root); }, rank_,
              "a recv waiting for its send");
    if (failed()) break;
    if (channel.empty()) {
      remoteError(c.root, "left the communicator (aborted or destroyed) before its send");
      break;
    }
    std::shared_ptr<SendPost> post = channel.front();
    channel.pop_front();
    if (post->withdrawn) {
      remoteError(c.root, "failed before its send completed");
      break;
    }
    if (post->bytes != c.count) {
      post->mismatch = true;
      me.error = kNcclInvalidUsage;
      me.lastError = detail::concat("recv of ", c.count, " bytes from rank ", c.root,
                                    " matched a send of ", post->bytes, " bytes");
      g.cv.notify_all();
      break;
    }
    const char *src = static_cast<const char *>(post->data);
    outputs.emplace_back(c.out, std::vector<char>(src, src + post->bytes));
    post->consumed = true;
    g.cv.notify_all();
  }

  // Until the receivers have read this rank's sends.
  waitOrDie(lock, g.cv, [&] {
    if (failed()) return true;
    for (auto &p : sends) {
      if (p->mismatch || (!p->consumed && g.gone(p->to))) return true;
    }
    for (auto &p : sends) {
      if (!p->consumed) return false;
    }
    return true;
  }, rank_, "a send waiting for its recv");
  for (auto &p : sends) {
    if (p->mismatch && !failed()) {
      me.error = kNcclInvalidUsage;
      me.lastError = detail::concat("send of ", p->bytes, " bytes to rank ", p->to,
                                    " matched a recv of a different size");
    }
    if (!p->consumed && g.gone(p->to)) remoteError(p->to, "left the communicator before its recv");
  }
  if (failed()) withdrawSends();

  if (slot != nullptr) {
    waitOrDie(lock, g.cv, [&] { return slot->readDone == n; }, rank_,
              "a collective waiting for its peers to read");
    if (++slot->departed == n) g.slots.erase(it.seq);
  }
  if (failed()) {
    log(detail::concat("stream: ", it.name, " ended without writing (", why(), ")"));
  } else {
    for (auto &[out, bytes] : outputs) {
      if (!bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());
    }
  }
  finishPosted();
}

namespace {

Call makeCall(Kind kind, const void *in, void *out, size_t count, DType dtype, gpu::RedOp op, int root) {
  return Call{kind, in, out, count, dtype, op < kNumBuiltinOps ? op : kPreMulSum, 1.0, root, op};
}

}  // namespace

int FakeDevice::allReduce(const void *in, void *out, size_t count, DType dtype, gpu::RedOp op,
                          gpu::CommHandle comm, gpu::StreamHandle stream) noexcept {
  log(detail::concat("allReduce count=", count, " op=", op, " dtype=", dtypeName(dtype)));
  int result;
  if (injectedFailure("allReduce", &result)) return result;
  return queueNccl(comm, stream, makeCall(Kind::kAllReduce, in, out, count, dtype, op, 0));
}

int FakeDevice::broadcast(const void *in, void *out, size_t bytes, int root, gpu::CommHandle comm,
                          gpu::StreamHandle stream) noexcept {
  log(detail::concat("broadcast bytes=", bytes, " root=", root));
  int result;
  if (injectedFailure("broadcast", &result)) return result;
  return queueNccl(comm, stream, makeCall(Kind::kBroadcast, in, out, bytes, DType::kUInt8, 0, root));
}

int FakeDevice::allGather(const void *in, void *out, size_t bytesPerRank, gpu::CommHandle comm,
                          gpu::StreamHandle stream) noexcept {
  log(detail::concat("allGather bytes=", bytesPerRank));
  int result;
  if (injectedFailure("allGather", &result)) return result;
  return queueNccl(comm, stream, makeCall(Kind::kAllGather, in, out, bytesPerRank, DType::kUInt8, 0, 0));
}

int FakeDevice::reduceScatter(const void *in, void *out, size_t countPerRank, DType dtype, gpu::RedOp op,
                              gpu::CommHandle comm, gpu::StreamHandle stream) noexcept {
  log(detail::concat("reduceScatter count=", countPerRank, " op=", op, " dtype=", dtypeName(dtype)));
  int result;
  if (injectedFailure("reduceScatter", &result)) return result;
  return queueNccl(comm, stream, makeCall(Kind::kReduceScatter, in, out, countPerRank, dtype, op, 0));
}

int FakeDevice::reduce(const void *in, void *out, size_t count, DType dtype, gpu::RedOp op, int root,
                       gpu::CommHandle comm, gpu::StreamHandle stream) noexcept {
  log(detail::concat("reduce count=", count, " op=", op, " dtype=", dtypeName(dtype), " root=", root));
  int result;
  if (injectedFailure("reduce", &result)) return result;
  return queueNccl(comm, stream, makeCall(Kind::kReduce, in, out, count, dtype, op, root));
}

int FakeDevice::send(const void *in, size_t bytes, int peer, gpu::CommHandle comm,
                     gpu::StreamHandle stream) noexcept {
  log(detail::concat("send bytes=", bytes, " peer=", peer));
  int result;
  if (injectedFailure("send", &result)) return result;
  return queueNccl(comm, stream, makeCall(Kind::kSend, in, nullptr, bytes, DType::kUInt8, 0, peer));
}

int FakeDevice::recv(void *out, size_t bytes, int peer, gpu::CommHandle comm,
                     gpu::StreamHandle stream) noexcept {
  log(detail::concat("recv bytes=", bytes, " peer=", peer));
  int result;
  if (injectedFailure("recv", &result)) return result;
  return queueNccl(comm, stream, makeCall(Kind::kRecv, nullptr, out, bytes, DType::kUInt8, 0, peer));
}

}  // namespace hora::test
