// SPDX-License-Identifier: Apache-2.0
// NCCL behind DeviceExecutor, on gpu::DeviceApi only: a non-blocking communicator with
// deadlines, hora's own stream, completion by event (the engine never waits for the device),
// stream-ordered device memory, and every collective of the C API.
#include "backends/nccl/nccl_executor.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "backends/nccl/completions.h"
#include "backends/nccl/nccl_plan.h"
#include "base/error.h"
#include "base/logging.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;
using namespace nccl_plan;
using gpu::kNcclInProgress;
using gpu::kNcclSuccess;

// NCCL's threads (proxy, bootstrap, the non-blocking init's) are created by the thread that makes
// the communicator or first uses it, and inherit its CPU affinity: an engine thread bound to one
// CPU (HORA_THREAD_AFFINITY) would put them all on that CPU. While this guard lives the calling
// thread has the process's affinity (its main thread's).
class WideAffinity {
 public:
  explicit WideAffinity(bool wanted = true) {
    if (!wanted) return;
    cpu_set_t process;
    CPU_ZERO(&process);
    if (sched_getaffinity(0, sizeof saved_, &saved_) != 0) return;
    if (sched_getaffinity(getpid(), sizeof process, &process) != 0) return;
    if (CPU_EQUAL(&process, &saved_)) return;
    widened_ = sched_setaffinity(0, sizeof process, &process) == 0;
  }
  ~WideAffinity() {
    if (widened_) sched_setaffinity(0, sizeof saved_, &saved_);
  }
  WideAffinity(const WideAffinity &) = delete;
  WideAffinity &operator=(const WideAffinity &) = delete;

 private:
  cpu_set_t saved_{};
  bool widened_ = false;
};

// How many of hora's communicators this process has on each GPU. The first communicator on a GPU
// runs with NCCL's own CTA count; when a later one shares it, its kernels are capped
// (kSharedCtaShare of the SMs) so that they leave room beside the first's (the GPU's turn,
// core/device_turn.h, is what keeps them from waiting for each other). NCCL requires every rank
// of a communicator to run the same channels, so the cap is agreed: if any rank's GPU is shared,
// every rank caps, at the smallest GPU's share (createNcclExecutor).
constexpr int kSharedCtaShare = 8;
constexpr int kMaxAgreedCtas = 1024;  // the cap's thermometer code: 16 words of the setup's AND
std::mutex gShareMutex;
std::map<int, int> gCommsPerDevice;

// This process's claim on one GPU, for its communicator's life.
class DeviceShare {
 public:
  explicit DeviceShare(int device) : device_(device) {
    std::lock_guard<std::mutex> lock(gShareMutex);
    before_ = gCommsPerDevice[device]++;
  }
  ~DeviceShare() {
    std::lock_guard<std::mutex> lock(gShareMutex);
    if (--gCommsPerDevice[device_] <= 0) gCommsPerDevice.erase(device_);
  }
  DeviceShare(const DeviceShare &) = delete;
  DeviceShare &operator=(const DeviceShare &) = delete;
  int before() const { return before_; }  // communicators this process had on it already

 private:
  int device_;
  int before_ = 0;
};

// ncclCommAbort on a thread of its own, waited for at most kAbortWaitS: an abort can block (a
// proxy thread stuck in a socket call to a dead host, a kernel that never yields), and it runs
// on an engine thread that must go on failing the set's requests and answering its peers. An
// abort that outlives the wait is left to finish on its own, with a warning.
constexpr int kAbortWaitS = 10;

void abortBounded(gpu::DeviceApi &api, gpu::CommHandle comm, int device) {
  struct Done {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();
  std::thread([&api, comm, device, done] {
    try {
      api.setDevice(device);
    } catch (const Error &) {  // the abort is still worth trying
    }
    api.commAbort(comm);
    std::lock_guard<std::mutex> lock(done->mutex);
    done->done = true;
    done->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(done->mutex);
  if (!done->cv.wait_for(lock, std::chrono::seconds(kAbortWaitS), [&] { return done->done; })) {
    HORA_LOG(kWarning) << "ncclCommAbort on cuda:" << device << " has not returned after " << kAbortWaitS
                       << " s; going on without it";
  }
}

// A communicator whose every call has a deadline: non-blocking mode, polled; on an error or the
// deadline it is aborted, which is what keeps a dead peer from hanging the engine forever.
class Comm {
 public:
  Comm(gpu::DeviceApi &api, int device, int rank, int size, double timeoutS, const int *cancelHost)
      : api_(api), device_(device), rank_(rank), size_(size), timeoutS_(timeoutS),
        cancel_(const_cast<int *>(cancelHost)) {}

  // Joins the communicator of `uniqueId` (collective) within `limitS`; maxCTAs 0: NCCL's choice.
  void init(const std::string &uniqueId, int maxCTAs, double limitS) {
    WideAffinity wide;
    const int r = api_.commInit(&comm_, uniqueId, size_, rank_, maxCTAs);
    if (r != kNcclSuccess && r != kNcclInProgress) {
      const std::string last = lastError();
      if (comm_ != nullptr) api_.commAbort(comm_);
      comm_ = nullptr;
      broken_ = true;
      HORA_THROW(HORA_ERR_BACKEND, "creating the NCCL communicator: NCCL error ",
                 api_.ncclErrorString(r), last, where());
    }
    settle("creating the NCCL communicator", limitS, "HORA_NCCL_INIT_TIMEOUT_S", Settle::kNap);
  }

  // Collective over this communicator, every rank at the same point: the communicator of the
  // ranks that pass `member`, ranked by `key`, sharing this one's resources, or nullptr (a
  // non-member, or a split NCCL refused: this communicator is then as it was). A failure while
  // it settles is this communicator's: it is aborted and this throws.
  gpu::CommHandle split(bool member, int key, int maxCTAs, double limitS) {
    WideAffinity wide;
    gpu::CommHandle child = nullptr;
    const int r = api_.commSplit(comm_, member ? 0 : gpu::kSplitNoColor, key, &child, maxCTAs);
    if (r != kNcclSuccess && r != kNcclInProgress) {
      HORA_LOG(kWarning) << "ncclCommSplit on cuda:" << device_ << ": NCCL error " << api_.ncclErrorString(r)
                         << lastError() << "; the process set makes a communicator of its own";
      if (child != nullptr) abortBounded(api_, child, device_);
      return nullptr;
    }
    settle("ncclCommSplit", limitS, "HORA_NCCL_INIT_TIMEOUT_S", Settle::kNap);
    return child;
  }

  // Takes `child` (from split(), on this rank's device) as this communicator, once it settled.
  void adopt(gpu::CommHandle child, double limitS) {
    comm_ = child;
    settle("creating the NCCL communicator by ncclCommSplit", limitS, "HORA_NCCL_INIT_TIMEOUT_S", Settle::kNap);
  }
  // Hands the communicator over to `other` (no call on it).
  void moveTo(Comm &other) {
    other.comm_ = comm_;
    comm_ = nullptr;
  }

  // Orderly when it can be: finalize (flushes outstanding work, collective with the peers, who
  // destroy theirs at the same response), then destroy; bounded (10 s at most), so that a peer
  // that is gone delays it only that long. Never throws.
  ~Comm() {
    if (comm_ == nullptr) return;
    const int r = broken_ ? -1 : api_.commFinalize(comm_);
    if (r == kNcclSuccess || r == kNcclInProgress) {
      const auto end = Clock::now() + std::min<std::chrono::nanoseconds>(deadline(), std::chrono::seconds(10));
      int state = kNcclInProgress;
      while (api_.commAsyncError(comm_, &state) == kNcclSuccess && state == kNcclInProgress &&
             Clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (state == kNcclSuccess) {
        api_.commDestroy(comm_);
        return;
      }
    }
    abortBounded(api_, comm_, device_);
  }
  Comm(const Comm &) = delete;
  Comm &operator=(const Comm &) = delete;

  gpu::CommHandle get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  double timeoutS() const { return timeoutS_; }
  std::chrono::nanoseconds deadline() const {
    return std::chrono::nanoseconds(static_cast<int64_t>(timeoutS_ * 1e9));
  }
  bool broken() const { return broken_; }

  void usable() const {
    if (broken_) {
      HORA_THROW(HORA_ERR_BACKEND, "the NCCL communicator on cuda:", device_,
                 " was aborted after an earlier failure: ", brokenWhy_);
    }
  }

  // A call on the communicator: in non-blocking mode it may return ncclInProgress (with two or
  // more ranks NCCL hands each launch to a thread of its own), and then the communicator must
  // settle before anything else is queued on the stream: the launch may not have reached it yet.
  void call(int r, const char *what) {
    if (r == kNcclInProgress) {
      settle(what, timeoutS_, "HORA_TIMEOUT_S", Settle::kSpin);
    } else if (r != kNcclSuccess) {
      fail(HORA_ERR_BACKEND, detail::concat(what, ": NCCL error ", api_.ncclErrorString(r), lastError()));
    }
  }

  // The communicator's asynchronous state: kNcclSuccess, kNcclInProgress or an error.
  int state() {
    int state = kNcclSuccess;
    const int r = api_.commAsyncError(comm_, &state);
    return r != kNcclSuccess ? r : state;
  }

  // How settle() waits: creation takes up to seconds, so it naps (1, 2, 4 ... 1000 us); a launch
  // takes microseconds, and a nap of even 1 us costs the scheduler's tens, so it spins, yielding.
  enum class Settle { kNap, kSpin };

  // Polls until the communicator is no longer in progress; an error or the deadline aborts it.
  // (Creation and launches only: queued work completes by event, not here.)
  void settle(const char *what, double limitS, const char *knob, Settle how) {
    const Clock::time_point end = Clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(limitS * 1e9));
    auto nap = std::chrono::microseconds(1);
    for (int polls = 0;; ++polls) {
      const int s = state();
      if (s == kNcclSuccess) return;
      if (s != kNcclInProgress) {
        fail(HORA_ERR_BACKEND, detail::concat(what, ": NCCL error ", api_.ncclErrorString(s), lastError()));
      }
      if ((polls & 63) == 0 && Clock::now() > end) {
        fail(HORA_ERR_TIMEOUT, detail::concat(what, ": not done after ", limitS, " s (", knob,
                                              "); a peer may be gone or stuck"));
      }
      if (how == Settle::kSpin) {
        sched_yield();
        continue;
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }

  // Aborts the communicator and throws.
  [[noreturn]] void fail(hora_status_t status, const std::string &why) {
    abort(why);
    HORA_THROW(status, why, where());
  }
  // The cancel flag first: kernels queued behind the aborted NCCL kernel (unpacking, scaling)
  // then write nothing into tensors whose requests fail. Then the abort, so that no call on it
  // waits any longer, here or on the peers, and no kernel of it keeps running.
  void abort(const std::string &why) {
    if (broken_) return;
    broken_ = true;
    brokenWhy_ = why;
    if (cancel_ != nullptr) *static_cast<volatile int *>(cancel_) = 1;
    if (comm_ != nullptr) abortBounded(api_, comm_, device_);
    comm_ = nullptr;
  }

  std::string where() const {
    return detail::concat(" (rank ", rank_, " of ", size_, ", cuda:", device_, ")");
  }

 private:
  std::string lastError() const {
    const std::string last = comm_ != nullptr ? api_.commLastError(comm_) : std::string();
    return last.empty() ? std::string() : detail::concat(" (", last, ")");
  }

  gpu::DeviceApi &api_;
  gpu::CommHandle comm_ = nullptr;
  int device_;
  int rank_;
  int size_;
  double timeoutS_;
  int *cancel_;
  bool broken_ = false;
  std::string brokenWhy_;
};

// A process set's communicator split from the world's (NcclExecutor::split), until the set's
// executor takes it; one never taken is finalized where it is dropped (Comm's destructor).
class NcclSeed final : public DeviceSeed {
 public:
  NcclSeed(gpu::DeviceApi &api, int device, int rank, double timeoutS, int maxCTAs)
      : comm(api, device, rank, 0, timeoutS, nullptr), maxCTAs(maxCTAs) {}
  int device() const override { return comm.device(); }
  Comm comm;
  const int maxCTAs;  // the world's agreed cap, which the split passed on
};

// A premultiplied-sum operator for one call, destroyed once the call is queued.
class PreMulSum {
 public:
  PreMulSum(gpu::DeviceApi &api, Comm &comm, DType dtype, double factor) : api_(api), comm_(comm) {
    comm_.call(api_.createPreMulSum(&op_, dtype, factor, comm_.get()), "ncclRedOpCreatePreMulSum");
    created_ = true;
  }
  ~PreMulSum() {
    if (created_ && comm_.get() != nullptr) api_.destroyRedOp(op_, comm_.get());
  }
  gpu::RedOp get() const { return op_; }

 private:
  gpu::DeviceApi &api_;
  Comm &comm_;
  gpu::RedOp op_ = 0;
  bool created_ = false;
};

// ncclGroupStart .. ncclGroupEnd that is always closed: a failure inside is reported (and the
// communicator aborted) only once the group is closed, because an abort inside an open group
// never completes its cleanup.
class GroupCalls {
 public:
  GroupCalls(gpu::DeviceApi &api, Comm &comm) : api_(api), comm_(comm) {
    open_ = api_.groupStart() == kNcclSuccess;
  }
  ~GroupCalls() {
    if (open_) api_.groupEnd();
  }
  GroupCalls(const GroupCalls &) = delete;
  GroupCalls &operator=(const GroupCalls &) = delete;
  void add(int r, const char *what) {
    if (failed_ == kNcclSuccess && r != kNcclSuccess && r != kNcclInProgress) {
      failed_ = r;
      what_ = what;
    }
  }
  void close() {
    HORA_ENFORCE(open_, "ncclGroupStart failed");
    open_ = false;
    const int end = api_.groupEnd();
    if (failed_ != kNcclSuccess) comm_.call(failed_, what_);
    comm_.call(end, "ncclGroupEnd");
  }

 private:
  gpu::DeviceApi &api_;
  Comm &comm_;
  bool open_ = false;
  int failed_ = kNcclSuccess;
  const char *what_ = "";
};

// Shared with the deleters of outputs handed to callers, which may outlive the executor.
struct Shared {
  std::mutex mutex;
  bool executorGone = false;
  std::vector<void *> returned;  // outputs their owners dropped, for the engine to free
};

// What a stream-ordered wait makes the caller's stream wait for: an op's end event, held (out of
// the pool) while the request holds this.
class EventEnd final : public DeviceEnd {
 public:
  EventEnd(gpu::DeviceApi &api, gpu::EventRef event) : api_(api), event_(std::move(event)) {}
  void streamWait(void *stream) override { api_.waitEvent(stream, event_.get()); }

 private:
  gpu::DeviceApi &api_;
  gpu::EventRef event_;
};

// How long the completion thread asks an op's event before it sleeps on it: a small collective
// ends within this and is seen at once; a longer one costs the OS's wake-up on top of its time.
constexpr std::chrono::microseconds kCompletionSpin{50};

class NcclExecutor final : public DeviceExecutor {
 public:
  struct Setup {
    gpu::StreamHandle stream = nullptr;
    gpu::DeviceApi::CancelFlag cancel;
    std::shared_ptr<DeviceShare> share;  // this communicator's claim on the GPU
    int maxCTAs = 0;                     // agreed by every rank: 0 is NCCL's choice
    std::shared_ptr<NcclSeed> seed;      // every rank has one: taken instead of a new communicator
  };

  NcclExecutor(gpu::DeviceApi &api, ControlPlane &control, int device, const NcclOptions &options,
               DeviceHooks hooks, Setup setup)
      : api_(api),
        device_(device),
        stream_(setup.stream),
        cancel_(setup.cancel),
        hooks_(std::move(hooks)),
        shared_(std::make_shared<Shared>()),
        share_(std::move(setup.share)),
        fusionLimit_(static_cast<size_t>(std::max<int64_t>(options.fusionBytes, 0))),
        directBytes_(options.directBytes),
        maxCTAs_(setup.maxCTAs),
        initTimeoutS_(options.initTimeoutS),
        completions_(api, device, gpu::Completions::Hooks{hooks_.wake, hooks_.finished}, kCompletionSpin),
        fusionMemory_(api),
        comm_(api, device, control.rank(), control.size(), options.timeoutS, setup.cancel.host) {
    if (setup.seed != nullptr) {  // split from the world's when the set was made: no id, no init
      setup.seed->comm.moveTo(comm_);
      HORA_LOG(kInfo) << "NCCL " << api_.ncclVersion() << " communicator: rank " << comm_.rank() << " of "
                      << comm_.size() << " on cuda:" << device << ", split from the world's (sharing its resources)";
      return;
    }
    std::string id;
    if (control.rank() == 0) {  // the id, or why there is none (nobody waits for an id that never comes)
      try {
        id = api_.uniqueId();
      } catch (const Error &e) {
        id = "!ncclGetUniqueId on rank 0: " + e.message();
      }
    }
    control.broadcastFromRoot(id);
    if (!id.empty() && id[0] == '!') HORA_THROW(HORA_ERR_BACKEND, "no NCCL communicator: ", id.substr(1));
    const int maxCTAs = setup.maxCTAs;
    comm_.init(id, maxCTAs, options.initTimeoutS);
    HORA_LOG(kInfo) << "NCCL " << api_.ncclVersion() << " communicator: rank " << comm_.rank()
                    << " of " << comm_.size() << " on cuda:" << device
                    << (maxCTAs == 0 ? std::string()
                        : share_->before() > 0
                            ? detail::concat(" (at most ", maxCTAs, " CTAs, on every rank: ", share_->before() + 1,
                                             " of this process's communicators share this GPU)")
                            : detail::concat(" (at most ", maxCTAs, " CTAs, on every rank: another rank's GPU "
                                             "is shared by several communicators)"));
  }

  ~NcclExecutor() override {
    try {
      api_.setDevice(device_);
    } catch (const Error &) {  // teardown goes on: every call below is noexcept
    }
    // Work still to finish wakes no engine; outputs still held free themselves.
    completions_.unhook();
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      shared_->executorGone = true;
      for (void *p : shared_->returned) api_.release(p, stream_);
      shared_->returned.clear();
    }
    if (fusion_ != nullptr) api_.release(fusion_, stream_);
    // The registered buffer is deregistered while the communicator lives (the engine drained or
    // aborted its work before this: an aborted communicator took its registrations with it);
    // fusionMemory_ frees it after the communicator is gone.
    if (fusionRegistration_ != nullptr && comm_.get() != nullptr && !comm_.broken()) {
      api_.commDeregister(comm_.get(), fusionRegistration_);
    }
    inFlight_.clear();  // their events go back to the pool once the completion thread saw them
    if (reclaimEvent_ != nullptr) api_.destroyEvent(reclaimEvent_);
    // comm_ is destroyed after this body (finalized, or aborted), then the completion thread
    // once its events completed; then the owner destroys the stream and the flag.
  }

  int device() const override { return device_; }
  uint64_t queued() const override { return queued_; }
  std::shared_ptr<DeviceEnd> lastEnd() const override { return lastEnd_; }

  void beginCycle() override { inCycle_ = true; }
  void endCycle() override {
    inCycle_ = false;
    guarded([&] { launch(); });
  }

  void allreduce(const std::vector<Request *> &requests, const Response &response,
                 int contributors) override {
    guarded([&] { runAllreduce(requests, response, contributors); });
  }
  void broadcast(Request &request, const Response &response) override {
    guarded([&] { runBroadcast(request, response); });
  }
  void allgather(const std::vector<Request *> &requests,
                 const std::vector<const Response *> &responses) override {
    guarded([&] { runAllgather(requests, responses); });
  }
  void alltoall(Request &request, const Response &response) override {
    guarded([&] { runAlltoall(request, response); });
  }
  void reducescatter(const std::vector<Request *> &requests,
                     const std::vector<const Response *> &responses, int contributors) override {
    guarded([&] { runReducescatter(requests, responses, contributors); });
  }

  uint64_t poll() override {
    comm_.usable();
    try {
      return check();
    } catch (const Error &e) {
      comm_.abort(e.message());
      throw;
    }
  }

  void drain(double seconds) override {
    if (!staged_.empty()) guarded([&] { launch(); });
    const auto end = Clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9));
    while (poll() < queued_) {
      if (Clock::now() > end) {
        comm_.fail(HORA_ERR_TIMEOUT, detail::concat("waiting for the device's queued work: not done after ",
                                                    seconds, " s"));
      }
      const uint64_t target = inFlight_.empty() ? queued_ : inFlight_.front().ticket;
      completions_.waitFor(target, std::chrono::milliseconds(10));
    }
  }

  void abort(const std::string &why) override { comm_.abort(why); }

  std::shared_ptr<DeviceSeed> split(bool member, int key) override {
    std::shared_ptr<DeviceSeed> seed;
    guarded([&] {
      api_.setDevice(device_);
      const gpu::CommHandle child = comm_.split(member, key, maxCTAs_, initTimeoutS_);
      if (child == nullptr) return;
      auto made = std::make_shared<NcclSeed>(api_, device_, key, comm_.timeoutS(), maxCTAs_);
      try {
        made->comm.adopt(child, initTimeoutS_);  // a failure aborts the child, not this one
      } catch (const Error &e) {
        HORA_LOG(kWarning) << "cuda:" << device_ << ": " << e.message()
                           << "; the process set makes a communicator of its own";
        return;
      }
      seed = std::move(made);
    });
    return seed;
  }

 private:
  struct InFlight {
    uint64_t ticket;
    gpu::EventRef event;
    Clock::time_point queuedAt;
    std::string what;  // "allreduce 'grad'"
  };

  // An op whose copies in (packing, prescaling, zeroed stand-ins) are queued and whose NCCL calls
  // wait for the cycle's one group: every op of a cycle (between beginCycle and endCycle; an op
  // outside one is a cycle of its own) goes to NCCL in one ncclGroupStart..End, one launch, and
  // each op's copies out and scaling follow the group, then its end event. Its ticket and event
  // are taken when it is staged, so that the engine can note both at once; the event is recorded
  // (and the completion thread told of it) only once the group is launched.
  struct StagedCall {
    std::function<int()> run;  // the NCCL call; its result goes to GroupCalls::add
    const char *what;
  };
  struct StagedOp {
    std::vector<StagedCall> calls;
    std::function<void()> after;          // copies out, postscale: queued after the group
    std::shared_ptr<PreMulSum> premul;    // its reduction operator, destroyed after the group
    std::string what;
    uint64_t ticket = 0;
    gpu::EventRef event;
  };

  template <typename F>
  void guarded(F &&op) {
    comm_.usable();
    try {
      op();
    } catch (const Error &e) {
      // An op refused on its agreed parameters fails the same way on every rank, before any
      // work is queued: the communicator stays.
      if (blastRadius(e.status()) != BlastRadius::kThisOp) comm_.abort(e.message());
      throw;
    } catch (const std::exception &e) {
      comm_.abort(e.what());
      throw;
    }
  }

  // What poll() does: completed ops off the front, then the communicator's health.
  uint64_t check() {
    const uint64_t hostDone = completions_.done();
    if (const std::string why = completions_.failure(); !why.empty() && !inFlight_.empty()) {
      comm_.fail(HORA_ERR_BACKEND, detail::concat(inFlight_.front().what, ": waiting for the device: ", why));
    }
    // The communicator's asynchronous error first: a kernel that an error ended lets its stream
    // go on, so its op's event completes, and retiring it before asking would report an op that
    // failed (its output partial) as done.
    if (!inFlight_.empty()) {
      const int s = comm_.state();
      if (s != kNcclSuccess && s != kNcclInProgress) {
        comm_.fail(HORA_ERR_BACKEND, detail::concat(inFlight_.front().what, ": NCCL error ",
                                                    api_.ncclErrorString(s)));
      }
    }
    while (!inFlight_.empty()) {
      InFlight &f = inFlight_.front();
      if (f.ticket > hostDone && !api_.eventDone(f.event.get())) break;
      finished_ = f.ticket;
      lastFinish_ = Clock::now();
      inFlight_.pop_front();
    }
    if (inFlight_.empty()) return finished_;
    const Clock::time_point now = Clock::now();
    // The oldest op's clock starts when it could start: queued, and its predecessor done.
    const InFlight &oldest = inFlight_.front();
    const Clock::time_point since = std::max(oldest.queuedAt, lastFinish_);
    if (now - since > comm_.deadline()) {
      comm_.fail(HORA_ERR_TIMEOUT, detail::concat(oldest.what, ": not done on cuda:", device_, " after ",
                                                  comm_.timeoutS(), " s (HORA_TIMEOUT_S)"));
    }
    if (hooks_.lostPeer && now - lastPeerCheck_ > std::chrono::milliseconds(50)) {
      lastPeerCheck_ = now;
      if (const std::string who = hooks_.lostPeer(); !who.empty()) {
        comm_.fail(HORA_ERR_PEER_LOST, detail::concat(oldest.what, ": peer lost: ", who));
      }
    }
    return finished_;
  }

  // Every op starts here: on this device, outputs callers dropped freed, after the callers' work.
  void begin(const std::vector<Request *> &requests) {
    api_.setDevice(device_);
    reclaim();
    for (Request *r : requests) {
      if (r->readyEvent) api_.waitEvent(stream_, r->readyEvent.get());
    }
  }

  // Stages the op (its ticket and end event taken now); outside a cycle, launches it at once.
  void commit(StagedOp op) {
    op.ticket = ++queued_;
    op.event = completions_.take();
    lastEnd_ = std::make_shared<EventEnd>(api_, op.event);
    staged_.push_back(std::move(op));
    if (!inCycle_) launch();
  }

  // The staged ops' NCCL calls in one group, then each op's copies out and its end: an event
  // from the pool, which the completion thread watches (it wakes the engine) and poll() asks.
  // Scratch is released in stream order after all of it.
  void launch() {
    if (staged_.empty()) return;
    std::vector<StagedOp> ops;
    ops.swap(staged_);
    fusionUsed_ = 0;
    {
      WideAffinity wide(firstOp_);  // NCCL connects lazily at a communicator's first op (threads too)
      GroupCalls group(api_, comm_);
      for (StagedOp &op : ops) {
        for (const StagedCall &c : op.calls) group.add(c.run(), c.what);
      }
      group.close();
    }
    for (StagedOp &op : ops) {
      if (op.after) op.after();
      api_.recordEvent(op.event.get(), stream_);
      completions_.watch(op.ticket, op.event);
      inFlight_.push_back(InFlight{op.ticket, std::move(op.event), Clock::now(), std::move(op.what)});
    }
    for (void *p : scratch_) api_.release(p, stream_);
    scratch_.clear();
    firstOp_ = false;
  }

  // Outputs whose owners dropped them, freed after the work queued on the device's legacy default
  // stream (where a caller that used them queued it, unless it used a stream of its own: then it
  // must synchronise before dropping them, as with torch's record_stream).
  void reclaim() {
    std::vector<void *> returned;
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      returned.swap(shared_->returned);
    }
    if (returned.empty()) return;
    if (reclaimEvent_ == nullptr) reclaimEvent_ = api_.createEvent();
    api_.recordEvent(reclaimEvent_, nullptr);
    api_.waitEvent(stream_, reclaimEvent_);
    for (void *p : returned) api_.release(p, stream_);
  }

  void runAllreduce(const std::vector<Request *> &requests, const Response &response,
                    int contributors) {
    begin(requests);
    const RequestMsg &agreed = response.agreed;
    const DType dtype = agreed.dtype;
    const size_t esize = dtypeSize(dtype);
    const AllreducePlan plan = planAllreduce(dtype, agreed.reduceOp, agreed.prescale,
                                             agreed.postscale, contributors, comm_.size());
    std::vector<TensorArg> tensors;
    for (Request *r : requests) {
      for (const TensorArg &t : deviceTensors(*r)) tensors.push_back(t);
    }
    StagedOp staged;
    if (plan.premulSum) staged.premul = std::make_shared<PreMulSum>(api_, comm_, dtype, plan.premulFactor);
    const gpu::RedOp op = staged.premul ? staged.premul->get() : static_cast<gpu::RedOp>(plan.op);

    // Zero-copy fusion: tensors of at least HORA_CUDA_DIRECT_BYTES are reduced where they lie,
    // each its own call in the same NCCL group as the packed smaller ones (one launch); only the
    // small ones are copied. The split depends on agreed sizes only, so every rank makes the same
    // calls in the same order. A kernel prescale (integers; NCCL's PreMulSum covers floats)
    // packs every tensor: it must not touch a caller's input.
    std::vector<size_t> direct, packed;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const int64_t bytes = tensors[i].numel * static_cast<int64_t>(esize);
      const bool alone = directBytes_ > 0 && bytes >= directBytes_ && plan.kernelPrescale == 1.0;
      (alone ? direct : packed).push_back(i);
    }
    if (packed.size() == 1 && plan.kernelPrescale == 1.0) {  // nothing to fuse it with
      direct.push_back(packed.front());
      packed.clear();
      std::sort(direct.begin(), direct.end());
    }
    if (tensors.size() == 1 && plan.kernelPrescale != 1.0) {  // scaled into the output, reduced there
      const TensorArg &t = tensors[0];
      copy(t.out, t.in, static_cast<size_t>(t.numel) * esize);
      scale(t.out, t.numel, dtype, plan.kernelPrescale);
      tensors[0].in = t.out;
      direct = {0};
      packed.clear();
    }
    char *buf = nullptr;
    Layout layout;
    std::vector<nccl_kernels::CopyItem> unpack;
    if (!packed.empty()) {
      std::vector<int64_t> bytes;
      for (size_t i : packed) bytes.push_back(tensors[i].numel * static_cast<int64_t>(esize));
      layout = packLayout(bytes, esize);
      buf = static_cast<char *>(fusion(static_cast<size_t>(layout.bytes)));
      std::vector<nccl_kernels::CopyItem> pack;
      for (size_t k = 0; k < packed.size(); ++k) {
        const TensorArg &t = tensors[packed[k]];
        pack.push_back({t.in, buf + layout.offsets[k], bytes[k]});
        unpack.push_back({buf + layout.offsets[k], t.out, bytes[k]});
      }
      api_.batchedCopy(pack, nullptr, stream_);  // writes only hora's buffer: no flag to read
      scale(buf, layout.elements, dtype, plan.kernelPrescale);
    }
    if (!packed.empty()) {
      const size_t elements = static_cast<size_t>(layout.elements);
      staged.calls.push_back({[this, buf, elements, dtype, op] {
                                return api_.allReduce(buf, buf, elements, dtype, op, comm_.get(), stream_);
                              },
                              "ncclAllReduce (fused)"});
    }
    std::vector<TensorArg> alone;
    for (size_t i : direct) alone.push_back(tensors[i]);
    for (const TensorArg &t : alone) {
      staged.calls.push_back({[this, t, dtype, op] {
                                return api_.allReduce(t.in, t.out, static_cast<size_t>(t.numel), dtype, op,
                                                      comm_.get(), stream_);
                              },
                              "ncclAllReduce"});
    }
    const double postscale = plan.kernelPostscale;
    const int64_t packedElements = layout.elements;
    staged.after = [this, alone = std::move(alone), unpack = std::move(unpack), buf, packedElements, dtype,
                    postscale] {
      for (const TensorArg &t : alone) scale(t.out, t.numel, dtype, postscale);
      if (buf != nullptr) {
        scale(buf, packedElements, dtype, postscale);
        api_.batchedCopy(unpack, cancel_.device, stream_);
      }
    };
    staged.what = detail::concat("allreduce '", agreed.name, "'", requests.size() > 1 ? " (fused)" : "");
    commit(std::move(staged));
  }

  void runBroadcast(Request &request, const Response &response) {
    begin({&request});
    const size_t esize = dtypeSize(response.agreed.dtype);
    const std::vector<TensorArg> tensors = deviceTensors(request);
    StagedOp staged;
    const int root = response.agreed.root;
    for (const TensorArg &t : tensors) {
      void *data = t.out;
      const size_t bytes = static_cast<size_t>(t.numel) * esize;
      staged.calls.push_back({[this, data, bytes, root] {
                                return api_.broadcast(data, data, bytes, root, comm_.get(), stream_);
                              },
                              "ncclBroadcast"});
    }
    staged.what = detail::concat("broadcast '", response.agreed.name, "'");
    commit(std::move(staged));
  }

  // Every request of the group in one NCCL group: one launch for all of them.
  void runAllgather(const std::vector<Request *> &requests,
                    const std::vector<const Response *> &responses) {
    begin(requests);
    const size_t n = static_cast<size_t>(comm_.size());
    struct Call {
      const char *in;
      char *out;
      GatherPlan plan;
      std::vector<int64_t> blocks;
    };
    std::vector<Call> calls;
    for (size_t i = 0; i < requests.size(); ++i) {
      Request &request = *requests[i];
      const Response &response = *responses[i];
      const Shape &mine = request.msg().shapes.at(0);
      const int64_t rowBytes = rowElements(mine) * static_cast<int64_t>(dtypeSize(request.msg().dtype));
      Call c;
      c.blocks.resize(n);
      Shape outShape = mine;
      outShape[0] = 0;
      for (size_t r = 0; r < n; ++r) {
        c.blocks[r] = response.firstDims.at(r) * rowBytes;
        outShape[0] += response.firstDims[r];
      }
      c.plan = planAllgather(c.blocks);
      c.out = static_cast<char *>(deviceOutput(request, outShape, static_cast<size_t>(c.plan.totalBytes)));
      c.in = static_cast<const char *>(deviceTensors(request).at(0).in);
      calls.push_back(std::move(c));
    }
    StagedOp staged;
    for (const Call &c : calls) {
      const char *in = c.in;
      if (c.plan.uniform) {
        if (c.blocks[0] > 0) {
          char *out = c.out;
          const size_t bytes = static_cast<size_t>(c.blocks[0]);
          staged.calls.push_back({[this, in, out, bytes] { return api_.allGather(in, out, bytes, comm_.get(), stream_); },
                                  "ncclAllGather"});
        }
        continue;
      }
      for (size_t r = 0; r < n; ++r) {
        if (c.blocks[r] == 0) continue;
        char *out = c.out + c.plan.offsets[r];
        const size_t bytes = static_cast<size_t>(c.blocks[r]);
        const int root = static_cast<int>(r);
        staged.calls.push_back({[this, in, out, bytes, root] {
                                  return api_.broadcast(in, out, bytes, root, comm_.get(), stream_);
                                },
                                "ncclBroadcast (allgather with uneven blocks)"});
      }
    }
    staged.what = detail::concat("allgather '", responses.front()->agreed.name, "'",
                                 requests.size() > 1 ? detail::concat(" and ", requests.size() - 1, " more") : "");
    commit(std::move(staged));
  }

  void runAlltoall(Request &request, const Response &response) {
    begin({&request});
    const size_t n = static_cast<size_t>(comm_.size()), me = static_cast<size_t>(comm_.rank());
    const Shape &mine = request.msg().shapes.at(0);
    const int64_t rowBytes = rowElements(mine) * static_cast<int64_t>(dtypeSize(request.msg().dtype));
    std::vector<int64_t> sendBytes(n), recvBytes(n);
    request.receivedSplits.assign(n, 0);
    Shape outShape = mine;
    outShape[0] = 0;
    int64_t total = 0;
    for (size_t r = 0; r < n; ++r) {
      sendBytes[r] = response.firstDims.at(me * n + r) * rowBytes;
      request.receivedSplits[r] = response.firstDims.at(r * n + me);
      recvBytes[r] = request.receivedSplits[r] * rowBytes;
      outShape[0] += request.receivedSplits[r];
      total += recvBytes[r];
    }
    const AlltoallPlan plan = planAlltoall(comm_.rank(), sendBytes, recvBytes);
    char *out = static_cast<char *>(deviceOutput(request, outShape, static_cast<size_t>(total)));
    const char *in = static_cast<const char *>(deviceTensors(request).at(0).in);
    copy(out + plan.selfRecvOffset, in + plan.selfSendOffset, static_cast<size_t>(plan.selfBytes));
    StagedOp staged;
    for (const Transfer &t : plan.transfers) {
      const int peer = t.peer;
      if (t.sendBytes > 0) {
        const char *from = in + t.sendOffset;
        const size_t bytes = static_cast<size_t>(t.sendBytes);
        staged.calls.push_back({[this, from, bytes, peer] { return api_.send(from, bytes, peer, comm_.get(), stream_); },
                                "ncclSend (alltoall)"});
      }
      if (t.recvBytes > 0) {
        char *to = out + t.recvOffset;
        const size_t bytes = static_cast<size_t>(t.recvBytes);
        staged.calls.push_back({[this, to, bytes, peer] { return api_.recv(to, bytes, peer, comm_.get(), stream_); },
                                "ncclRecv (alltoall)"});
      }
    }
    staged.what = detail::concat("alltoall '", response.agreed.name, "'");
    commit(std::move(staged));
  }

  // Every request of the group in one NCCL group; prescaled inputs go through scratch, so the
  // caller's input stays as it was.
  void runReducescatter(const std::vector<Request *> &requests,
                        const std::vector<const Response *> &responses, int contributors) {
    begin(requests);
    const size_t n = static_cast<size_t>(comm_.size()), me = static_cast<size_t>(comm_.rank());
    const RequestMsg &agreed = responses.front()->agreed;  // one dtype and op for the group
    const DType dtype = agreed.dtype;
    const size_t esize = dtypeSize(dtype);
    const AllreducePlan plan = planAllreduce(dtype, agreed.reduceOp, agreed.prescale,
                                             agreed.postscale, contributors, comm_.size());
    struct Call {
      const char *in;
      char *out;
      std::vector<int64_t> counts;
      ScatterPlan split;
    };
    std::vector<Call> calls;
    for (size_t i = 0; i < requests.size(); ++i) {
      Request &request = *requests[i];
      const Shape &shape = responses[i]->agreed.shapes.at(0);
      const int64_t rows = shape.at(0), rowElems = rowElements(shape);
      const int64_t setSize = static_cast<int64_t>(n);
      Call c;
      c.counts.resize(n);
      std::vector<int64_t> blockRows(n);
      for (size_t r = 0; r < n; ++r) {  // rows / size each, one more for the first rows % size
        blockRows[r] = rows / setSize + (static_cast<int64_t>(r) < rows % setSize ? 1 : 0);
        c.counts[r] = blockRows[r] * rowElems;
      }
      Shape outShape = shape;
      outShape[0] = blockRows[me];
      c.out = static_cast<char *>(deviceOutput(request, outShape, static_cast<size_t>(c.counts[me]) * esize));
      c.in = static_cast<const char *>(deviceTensors(request).at(0).in);
      if (plan.kernelPrescale != 1.0) {
        const int64_t total = rows * rowElems;
        char *buf = static_cast<char *>(scratch(static_cast<size_t>(total) * esize));
        copy(buf, c.in, static_cast<size_t>(total) * esize);
        scale(buf, total, dtype, plan.kernelPrescale);
        c.in = buf;
      }
      c.split = planReducescatter(c.counts);
      calls.push_back(std::move(c));
    }
    StagedOp staged;
    if (plan.premulSum) staged.premul = std::make_shared<PreMulSum>(api_, comm_, dtype, plan.premulFactor);
    const gpu::RedOp op = staged.premul ? staged.premul->get() : static_cast<gpu::RedOp>(plan.op);
    std::vector<std::pair<char *, int64_t>> outputs;  // each call's output and its elements, to postscale
    for (const Call &c : calls) {
      const char *in = c.in;
      char *out = c.out;
      outputs.emplace_back(out, c.counts[me]);
      if (c.split.uniform) {
        if (c.counts[0] > 0) {
          const size_t count = static_cast<size_t>(c.counts[0]);
          staged.calls.push_back({[this, in, out, count, dtype, op] {
                                    return api_.reduceScatter(in, out, count, dtype, op, comm_.get(), stream_);
                                  },
                                  "ncclReduceScatter"});
        }
        continue;
      }
      for (size_t r = 0; r < n; ++r) {
        if (c.counts[r] == 0) continue;
        const char *from = in + c.split.offsets[r] * static_cast<int64_t>(esize);
        const size_t count = static_cast<size_t>(c.counts[r]);
        const int root = static_cast<int>(r);
        staged.calls.push_back({[this, from, out, count, dtype, op, root] {
                                  return api_.reduce(from, out, count, dtype, op, root, comm_.get(), stream_);
                                },
                                "ncclReduce (reducescatter with uneven blocks)"});
      }
    }
    const double postscale = plan.kernelPostscale;
    staged.after = [this, outputs = std::move(outputs), dtype, postscale] {
      for (const auto &o : outputs) scale(o.first, o.second, dtype, postscale);
    };
    staged.what = detail::concat("reducescatter '", agreed.name, "'",
                                 requests.size() > 1 ? detail::concat(" and ", requests.size() - 1, " more") : "");
    commit(std::move(staged));
  }

  static int64_t rowElements(const Shape &shape) {
    int64_t e = 1;
    for (size_t d = 1; d < shape.size(); ++d) e *= shape[d];
    return e;
  }

  // The request's tensors, or for a rank that joined (its stand-in holds host memory) zeroed
  // device scratch of the same sizes.
  std::vector<TensorArg> deviceTensors(Request &request) {
    if (!request.isStandIn()) return request.tensors();
    std::vector<TensorArg> out;
    const size_t esize = dtypeSize(request.msg().dtype);
    for (const TensorArg &t : request.tensors()) {
      const size_t bytes = static_cast<size_t>(t.numel) * esize;
      void *p = scratch(bytes + 1);
      api_.zero(p, bytes + 1, stream_);
      out.push_back(TensorArg{p, p, t.numel});
    }
    return out;
  }

  // Device memory for this op only: stream-ordered, released in end().
  void *scratch(size_t bytes) {
    void *p = api_.allocate(bytes, stream_);
    scratch_.push_back(p);
    return p;
  }

  // Device memory for an output hora allocates (allgather, alltoall, reducescatter), owned by the
  // request once it completes. Dropped by its owner on any thread, it goes back to the engine,
  // which frees it in stream order (no CUDA call on the owner's thread, none that synchronises).
  void *deviceOutput(Request &request, const Shape &shape, size_t bytes) {
    void *data = api_.allocate(bytes + 1, stream_);
    gpu::DeviceApi *api = &api_;
    std::shared_ptr<Shared> shared = shared_;
    std::shared_ptr<void> owner(data, [api, shared](void *p) {
      std::lock_guard<std::mutex> lock(shared->mutex);
      if (shared->executorGone) {
        api->release(p, nullptr);  // after the executor: a synchronous free
      } else {
        shared->returned.push_back(p);
      }
    });
    request.adoptOutput(owner, data, shape);
    return data;
  }

  // Room for `bytes` of packed tensors, in stream order after the work queued so far: the
  // registered buffer, or stream-ordered memory that grows in 16 MiB steps (and only grows; the
  // old buffer is released in stream order); scratch where the cycle's fused ops overflow it.
  void *fusion(size_t bytes) {
    if (!fusionTried_) {
      fusionTried_ = true;
      allocateFusionBuffer();
    }
    // Several fused ops in one cycle (one NCCL group) each take their own part of the buffer.
    const size_t at = fusionUsed_;
    const size_t taken = (bytes + kFusionAlign - 1) / kFusionAlign * kFusionAlign;
    if (fusionMemory_.data != nullptr) {
      if (at + bytes > fusionMemory_.bytes) return scratch(bytes);
      fusionUsed_ += taken;
      return static_cast<char *>(fusionMemory_.data) + at;
    }
    // No NCCL memory: stream-ordered, grown in 16 MiB steps (by the cycle's first fused op only:
    // a buffer an op of this cycle packed into stays), never shrunk.
    if (at > 0) {
      if (at + bytes > fusionBytes_) return scratch(bytes);
      fusionUsed_ += taken;
      return static_cast<char *>(fusion_) + at;
    }
    fusionUsed_ = taken;
    if (fusion_ == nullptr || fusionBytes_ < bytes) {
      constexpr size_t kStep = size_t{16} << 20;
      const size_t size = (bytes + kStep - 1) / kStep * kStep;
      void *bigger = api_.allocate(size, stream_);
      if (fusion_ != nullptr) api_.release(fusion_, stream_);
      fusion_ = bigger;
      fusionBytes_ = size;
    }
    return fusion_;
  }

  // Once, at the first fused op: HORA_FUSION_THRESHOLD bytes from ncclMemAlloc, registered with
  // the communicator. Either step may fail (no cuMem support, an NCCL without registration): the
  // buffer is then stream-ordered memory, or unregistered.
  void allocateFusionBuffer() {
    if (fusionLimit_ == 0) return;
    void *data = nullptr;
    const int r = api_.memAlloc(&data, fusionLimit_);
    if (r != kNcclSuccess || data == nullptr) {
      HORA_LOG(kInfo) << "cuda:" << device_ << ": ncclMemAlloc of the fusion buffer failed (NCCL error "
                      << api_.ncclErrorString(r) << "); using stream-ordered memory";
      return;
    }
    fusionMemory_.data = data;
    fusionMemory_.bytes = fusionLimit_;
    void *handle = nullptr;
    const int reg = api_.commRegister(comm_.get(), data, fusionLimit_, &handle);
    if (reg == kNcclInProgress) comm_.call(reg, "ncclCommRegister of the fusion buffer");
    if (reg == kNcclSuccess || reg == kNcclInProgress) {
      fusionRegistration_ = handle;
    } else {
      HORA_LOG(kInfo) << "cuda:" << device_ << ": ncclCommRegister of the fusion buffer failed (NCCL error "
                      << api_.ncclErrorString(reg) << "); it stays unregistered";
    }
  }

  void copy(void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    api_.copy(dst, src, bytes, stream_);
  }

  void scale(void *buf, int64_t count, DType dtype, double factor) {
    if (factor == 1.0 || count == 0) return;
    api_.scale(buf, count, dtype, factor, cancel_.device, stream_);
  }

  gpu::DeviceApi &api_;
  const int device_;
  gpu::StreamHandle stream_;
  gpu::DeviceApi::CancelFlag cancel_;
  DeviceHooks hooks_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<DeviceShare> share_;
  std::deque<InFlight> inFlight_;
  std::shared_ptr<DeviceEnd> lastEnd_;  // the last op's, for stream-ordered waits
  gpu::EventHandle reclaimEvent_ = nullptr;
  std::vector<void *> scratch_;  // the staged ops', released once they are launched
  std::vector<StagedOp> staged_;  // waiting for the cycle's group
  bool inCycle_ = false;          // between beginCycle and endCycle
  size_t fusionUsed_ = 0;         // of the fusion buffer, by the staged ops
  static constexpr size_t kFusionAlign = 256;
  // The fusion buffer: ncclMemAlloc'ed once, HORA_FUSION_THRESHOLD bytes, registered with the
  // communicator (packed bytes beyond it, a grouped allreduce's, go through scratch); where NCCL
  // cannot allocate it, stream-ordered memory that grows as needed (fusion_).
  const size_t fusionLimit_;
  const int64_t directBytes_;
  const int maxCTAs_;         // agreed at setup; a split passes it on
  const double initTimeoutS_;
  bool fusionTried_ = false;
  void *fusionRegistration_ = nullptr;
  void *fusion_ = nullptr;
  size_t fusionBytes_ = 0;
  uint64_t queued_ = 0;
  uint64_t finished_ = 0;
  bool firstOp_ = true;  // NCCL connects lazily at a communicator's first op (threads too)
  Clock::time_point lastFinish_ = Clock::now();
  Clock::time_point lastPeerCheck_{};
  // Destroyed after comm_: its thread ends once the events it watches completed, which they do
  // once the communicator is finalised or aborted.
  gpu::Completions completions_;
  // ncclMemAlloc'ed memory, freed after comm_ (no kernel of it can run then).
  struct NcclMemory {
    explicit NcclMemory(gpu::DeviceApi &api) : api(api) {}
    ~NcclMemory() {
      if (data != nullptr) api.memFree(data);
    }
    gpu::DeviceApi &api;
    void *data = nullptr;
    size_t bytes = 0;
  } fusionMemory_;
  // Last: destroyed first, so that its kernels are finalised or aborted before the stream and
  // flag they use go (the owner below destroys those).
  Comm comm_;
};

// Owns what the executor's setup made, so that a failure part-way frees it; the executor's
// destructor runs before this one's.
class OwnedExecutor final : public DeviceExecutor {
 public:
  OwnedExecutor(gpu::DeviceApi &api, int device, NcclExecutor::Setup setup)
      : api_(api), device_(device), setup_(setup) {}
  void agreed(const NcclExecutor::Setup &setup) {
    setup_.maxCTAs = setup.maxCTAs;
    setup_.seed = setup.seed;
  }
  ~OwnedExecutor() override {
    inner_.reset();
    try {
      api_.setDevice(device_);
    } catch (const Error &) {
    }
    if (setup_.stream != nullptr) api_.destroyStream(setup_.stream);
    if (setup_.cancel.host != nullptr) api_.destroyCancelFlag(setup_.cancel);
  }
  void start(ControlPlane &control, const NcclOptions &options, DeviceHooks hooks) {
    inner_ = std::make_unique<NcclExecutor>(api_, control, device_, options, std::move(hooks), setup_);
  }
  int device() const override { return device_; }
  void allreduce(const std::vector<Request *> &requests, const Response &response, int contributors) override {
    inner_->allreduce(requests, response, contributors);
  }
  void broadcast(Request &request, const Response &response) override { inner_->broadcast(request, response); }
  void allgather(const std::vector<Request *> &requests, const std::vector<const Response *> &responses) override {
    inner_->allgather(requests, responses);
  }
  void alltoall(Request &request, const Response &response) override { inner_->alltoall(request, response); }
  void reducescatter(const std::vector<Request *> &requests, const std::vector<const Response *> &responses,
                     int contributors) override {
    inner_->reducescatter(requests, responses, contributors);
  }
  void beginCycle() override { inner_->beginCycle(); }
  void endCycle() override { inner_->endCycle(); }
  uint64_t queued() const override { return inner_->queued(); }
  std::shared_ptr<DeviceEnd> lastEnd() const override { return inner_->lastEnd(); }
  uint64_t poll() override { return inner_->poll(); }
  void drain(double seconds) override { inner_->drain(seconds); }
  void abort(const std::string &why) override { inner_->abort(why); }
  std::shared_ptr<DeviceSeed> split(bool member, int key) override { return inner_->split(member, key); }

 private:
  gpu::DeviceApi &api_;
  const int device_;
  NcclExecutor::Setup setup_;
  std::unique_ptr<NcclExecutor> inner_;
};

}  // namespace

int defaultCudaDevice(gpu::DeviceApi &api, int localRank) {
  const int gpus = api.deviceCount();
  if (gpus == 0) HORA_THROW(HORA_ERR_BACKEND, "no CUDA device: ", api.whyNoDevice());
  return localRank % gpus;
}

std::string whyNoCudaDevice(gpu::DeviceApi &api, int device) {
  const int gpus = api.deviceCount();
  if (device >= 0 && device < gpus) return "";
  const std::string why = api.whyNoDevice();
  return why.empty() ? detail::concat("this process sees ", gpus, " CUDA devices") : why;
}

std::unique_ptr<DeviceExecutor> createNcclExecutor(gpu::DeviceApi &api, ControlPlane &control,
                                                   int device, double timeoutS, DeviceHooks hooks) {
  NcclOptions options;
  options.timeoutS = options.initTimeoutS = timeoutS;
  return createNcclExecutor(api, control, device, options, std::move(hooks));
}

std::unique_ptr<DeviceExecutor> createNcclExecutor(gpu::DeviceApi &api, ControlPlane &control,
                                                   int device, const NcclOptions &options,
                                                   DeviceHooks hooks) {
  // 1. This rank's CUDA, every failure caught: the ranks agree on it before anyone waits for an
  // id, and on the CTA cap in the same AND.
  NcclExecutor::Setup setup;
  setup.share = std::make_shared<DeviceShare>(device);
  // A communicator split from the world's when the set was made, taken only if every rank has
  // one on the GPU it uses (agreed below); otherwise every rank drops it and makes a new one.
  std::shared_ptr<NcclSeed> seed = std::dynamic_pointer_cast<NcclSeed>(hooks.seed);
  hooks.seed.reset();
  std::string failure;
  int ctaShare = kMaxAgreedCtas;  // this GPU's, if a cap is agreed
  try {
    api.setDevice(device);
    if (std::string why = api.kernelsRunOn(device); !why.empty()) HORA_THROW(HORA_ERR_BACKEND, why);
    setup.stream = api.createStream();
    setup.cancel = api.createCancelFlag();
    ctaShare = std::clamp(api.multiprocessors(device) / kSharedCtaShare, 1, kMaxAgreedCtas);
  } catch (const Error &e) {
    failure = e.message();
  } catch (const std::exception &e) {
    failure = e.what();
  }
  auto owned = std::make_unique<OwnedExecutor>(api, device, setup);
  const int size = control.size(), rank = control.rank();
  // Words: one bit per rank (its setup worked); one bit "no rank shares its GPU"; the smallest
  // share as a thermometer (bit i set for i < share: the AND keeps the smallest); one bit "every
  // rank has a split communicator on its GPU".
  const size_t rankWords = static_cast<size_t>((size + 63) / 64), capWord = rankWords;
  const size_t seedWord = capWord + 1 + kMaxAgreedCtas / 64;
  std::vector<uint64_t> ok(seedWord + 1, ~uint64_t{0});
  if (seed == nullptr || seed->device() != device || seed->comm.get() == nullptr) ok[seedWord] = 0;
  if (!failure.empty()) ok[static_cast<size_t>(rank / 64)] &= ~(uint64_t{1} << (rank % 64));
  if (setup.share->before() > 0) ok[capWord] = 0;
  for (int i = ctaShare; i < kMaxAgreedCtas; ++i) {
    ok[capWord + 1 + static_cast<size_t>(i / 64)] &= ~(uint64_t{1} << (i % 64));
  }
  control.allreduceAnd(ok);
  if (ok[capWord] == 0) {
    for (int i = 0; i < kMaxAgreedCtas && (ok[capWord + 1 + static_cast<size_t>(i / 64)] >> (i % 64) & 1u); ++i) {
      setup.maxCTAs = i + 1;
    }
  }
  if (ok[seedWord] != 0) {
    setup.seed = std::move(seed);
    setup.maxCTAs = setup.seed->maxCTAs;  // what the split passed on, alike on every rank
  }
  seed.reset();  // not taken: finalized here, by every member alike
  owned->agreed(setup);
  std::string failed;
  for (int r = 0; r < size; ++r) {
    if ((ok[static_cast<size_t>(r / 64)] >> (r % 64) & 1u) == 0) {
      failed += detail::concat(failed.empty() ? "" : ", ", r);
    }
  }
  if (!failed.empty()) {
    HORA_THROW(HORA_ERR_BACKEND, "no NCCL communicator: CUDA setup failed on rank ", failed, " of ", size,
               failure.empty() ? std::string(" (its own log says why)")
                               : detail::concat("; rank ", rank, " on cuda:", device, ": ", failure));
  }
  // 2, 3. The unique id and the communicator.
  owned->start(control, options, std::move(hooks));
  return owned;
}

}  // namespace hora
