// SPDX-License-Identifier: Apache-2.0
// SetEngine thread: wait for work, negotiate a cycle, execute it, complete requests.
#include "core/set_engine.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>

#include <algorithm>

#include "base/logging.h"
#include "core/affinity.h"
#include "core/forming.h"
#include "core/fusion_planner.h"
#include "core/op_table.h"

namespace hora {
namespace {

// Negotiation's channel: the backend's own plane where it has one (UCX), else the group's control
// plane; either way the per-cycle AND goes through the backend's andWords when its capabilities
// offer a channel for it (backends/shm on one host). Every rank makes the same choice: it depends
// only on the backend every rank made and on the vector's length.
class NegotiationPlane final : public ControlPlane {
 public:
  NegotiationPlane(ControlPlane &group, Backend &backend)
      : plane_(backend.negotiationPlane() != nullptr ? *backend.negotiationPlane() : group),
        backend_(backend) {}
  int rank() const override { return plane_.rank(); }
  int size() const override { return plane_.size(); }
  void allreduceAnd(std::vector<uint64_t> &words) override {
    if (words.size() <= backend_.caps().negotiationWords) {
      backend_.andWords(words);
    } else {
      plane_.allreduceAnd(words);
    }
  }
  std::vector<std::string> gatherToRoot(const std::string &blob) override {
    return plane_.gatherToRoot(blob);
  }
  void broadcastFromRoot(std::string &blob) override { plane_.broadcastFromRoot(blob); }

 private:
  ControlPlane &plane_;
  Backend &backend_;
};

}  // namespace

std::shared_ptr<SetEngine> SetEngine::start(int32_t id, const Knobs &knobs,
                                            std::function<Parts()> setup, SetOpHandler *handler) {
  std::shared_ptr<SetEngine> engine(new SetEngine(id, knobs, handler));
  std::promise<Status> started;
  std::future<Status> result = started.get_future();
  engine->thread_ = std::thread([e = engine.get(), &setup, &started] { e->threadMain(setup, &started); });
  Status status = result.get();
  if (!status.ok()) {
    engine->thread_.join();
    throw Error(status.code, status.message, __FILE__, __LINE__);
  }
  return engine;
}

SetEngine::SetEngine(int32_t id, const Knobs &knobs, SetOpHandler *handler)
    : id_(id), knobs_(knobs), handler_(handler) {}

SetEngine::~SetEngine() {
  requestShutdown();
  join();
}

void SetEngine::join() {
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

bool SetEngine::joinWithin(std::chrono::milliseconds limit) {
  if (!thread_.joinable()) return true;
  if (exitedFuture_.wait_for(limit) != std::future_status::ready) {
    thread_.detach();
    return false;
  }
  thread_.join();
  return true;
}

void SetEngine::threadMain(const std::function<Parts()> &setup, std::promise<Status> *started) {
  const std::string threadName = id_ == 0 ? "hora-engine" : "hora-set-" + std::to_string(id_);
  pthread_setname_np(pthread_self(), threadName.substr(0, 15).c_str());
  // The engine sleeps in short slices while it waits for peers (MPI polling, back-off): with the
  // default 50 us timer slack every such sleep overshoots by tens of microseconds, which is the
  // whole latency of a small collective.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  // A write to a peer that died raises SIGPIPE in the writing thread, which kills the process
  // unless the program ignores it (Python does, C programs do not). Blocked here, in the thread
  // that makes the sockets and whose helper threads (Gloo's, the TCP store's) inherit the mask,
  // the write fails with EPIPE instead and the loss becomes HORA_ERR_PEER_LOST.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  try {
    parts_ = setup();
    rank_ = parts_.group->rank();
    size_ = parts_.group->size();
    backendName_ = parts_.backend->name();
    negotiation_ = std::make_unique<NegotiationPlane>(parts_.group->control(), *parts_.backend);
    controller_ = std::make_unique<Controller>(
        *negotiation_, static_cast<int>(knobs_.cacheCapacity),
        StallPolicy{knobs_.stallWarningS, knobs_.stallShutdownS, id_});
    executor_ = std::make_unique<Executor>(*parts_.backend, size_, rank_);
    if (parts_.turn != nullptr) turn_ = parts_.turn;
    executor_->setTimeline(parts_.timeline, id_);
    watch_ = std::make_unique<StallWatch>(
        id_, rank_, size_, parts_.group->presence(), knobs_.stallWarningS, knobs_.timeoutS,
        [this](int rank, const std::string &what) { peerFailed(rank, what); });
    // Told in this order: the watch says an op runs before it is recorded anywhere.
    observers_.add(watchObserver(*watch_));
    if (parts_.timeline != nullptr) {
      observers_.add(timelineObserver(*parts_.timeline, id_, *parts_.backend));
    }
    if (parts_.flight != nullptr) observers_.add(flightObserver(*parts_.flight, id_));
    if (std::string why; parts_.cpu >= 0 && !bindThisThread(parts_.cpu, &why)) {
      HORA_LOG(kWarning) << "HORA_THREAD_AFFINITY: cannot bind " << threadName << " to CPU "
                         << parts_.cpu << ": " << why;
    }
    queue_.setBell(parts_.backend->peerBell());  // before `started`: nobody pushes yet
    callerCycles_ = knobs_.callerCycles != "off" && parts_.backend->peerBell() != nullptr;
    // No sockets in a cycle (MPI's control plane and data plane): a write to a lost peer cannot
    // raise SIGPIPE in a thread that runs a cycle (see drive()).
    // A backend with its own negotiation plane (UCX) leaves the group's channels out of cycles.
    socketFree_ = !parts_.backend->caps().usesSockets &&
                  (!parts_.group->usesSockets() || parts_.backend->negotiationPlane() != nullptr);
  } catch (const Error &e) {
    started->set_value(e.toStatus());
    exited_.set_value();
    return;
  } catch (const std::exception &e) {
    started->set_value(Status{HORA_ERR_INTERNAL, std::string("hora_init: ") + e.what()});
    exited_.set_value();
    return;
  }
  running_ = true;
  {
    std::lock_guard<std::mutex> planes(planesMutex_);
    planesLive_ = true;
  }
  started->set_value(Status::success());  // `started` and `setup` are gone after this line

  try {
    loop();
  } catch (const std::exception &e) {  // outside a cycle (a cycle's failures stop it in there)
    std::lock_guard<std::mutex> lock(cycleMutex_);
    if (running_) fail(Error(HORA_ERR_INTERNAL, e.what(), __FILE__, __LINE__));
  }
  // Teardown in the thread that made them; no caller runs a cycle of a stopped set.
  std::lock_guard<std::mutex> lock(cycleMutex_);
  {
    std::lock_guard<std::mutex> planes(planesMutex_);
    planesLive_ = false;
  }
  queue_.setBell(nullptr);
  turn_->leave(id_);
  waker_->detach();
  watch_.reset();  // its thread uses the group's presence channel
  device_.reset();
  executor_.reset();
  controller_.reset();
  parts_.backend.reset();
  parts_.group.reset();
  exited_.set_value();
}

void SetEngine::loop() {
  using Clock = std::chrono::steady_clock;
  const auto batchWindow = std::chrono::nanoseconds(static_cast<int64_t>(knobs_.cycleTimeMs * 1e6));
  // While this rank has requests that other ranks have not submitted yet, cycles make no
  // progress; back off (up to 1 ms) so waiting costs no CPU, and wake at once on new work. With
  // a bell a peer's next cycle wakes this engine too, so it sleeps the whole back-off at once;
  // without one it starts at 10 us, as a peer may be about to submit.
  const bool bell = parts_.backend->peerBell() != nullptr;
  const std::chrono::microseconds kMaxBackoff{1000};
  std::chrono::microseconds idleBackoff{0};
  // Device work in flight: its completion kicks the queue; the wait is bounded all the same, so
  // that the executor's deadlines and peer checks run while nothing else happens.
  const std::chrono::microseconds kDeviceCheck{10000};
  for (;;) {
    const bool device = deviceBusy_.load();
    queue_.waitForWork(busy_.load() || device,
                       Clock::now() + (device && !busy_.load() ? kDeviceCheck : idleBackoff), batchWindow);
    std::lock_guard<std::mutex> lock(cycleMutex_);
    if (!running_) return;  // a caller's cycle stopped the set
    const Cycle done = runCycle(/*launches=*/true);
    if (done == Cycle::kStopped) return;
    if (done == Cycle::kAgreed) {
      idleBackoff = std::chrono::microseconds{0};
    } else {
      idleBackoff = bell ? kMaxBackoff
                         : std::min(kMaxBackoff, std::max(std::chrono::microseconds{10}, idleBackoff * 2));
    }
  }
}

void SetEngine::drive(const Request &request) {
  // A socket write to a lost peer raises SIGPIPE in the writing thread, which the set's own
  // thread blocks; a caller's may not, so a caller runs cycles with sockets in them only where
  // the program ignores SIGPIPE (Python does).
  auto sigpipeHarmless = [this] {
    struct sigaction current {};
    return socketFree_ || (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_IGN);
  };
  if (callerCycles_) {
    std::unique_lock<std::mutex> lock(cycleMutex_, std::try_to_lock);
    if (lock.owns_lock() && running_ && sigpipeHarmless()) {
      // A set with CUDA tensors on this rank launches its device work here too, in the round
      // that agrees it, without handing it to the set's thread; the executor sets its device, so
      // the caller's CUDA context is put back afterwards. (A set without them yet launches
      // nothing on this thread: it does not offer for the GPU's turn.)
      const bool device = cudaDevice_.load() >= 0 && parts_.fabric != nullptr;
      std::shared_ptr<void> callerContext = device ? parts_.fabric->keepDeviceContext() : nullptr;
      Cycle done = Cycle::kAgreed;
      while (done == Cycle::kAgreed && !request.done()) done = runCycle(/*launches=*/device);
      // What is left (requests other ranks have not submitted yet, device ops in flight) is the
      // set's thread's, which may be asleep waiting for work; and a stopped set's thread is to end.
      if (done == Cycle::kStopped || busy_.load() || deviceBusy_.load()) queue_.kick();
      return;
    }
  }
  flush();
}

bool SetEngine::abort(const Status &why, std::chrono::milliseconds limit) {
  if (aborted_.raise(why)) {
    HORA_LOG(kWarning) << "process set " << id_ << " aborted on this rank: " << why.message;
    interruptPlanes(why);
  }
  queue_.kick();  // an idle set's thread stops at once
  // Only the future: thread_ itself belongs to whoever joins it. (No caller of abort is the
  // set's own thread: it runs no user code.)
  return exitedFuture_.wait_for(limit) == std::future_status::ready;
}

void SetEngine::interruptPlanes(const Status &why) {
  std::lock_guard<std::mutex> planes(planesMutex_);
  if (planesLive_) {
    parts_.group->interrupt(why);
    parts_.backend->interrupt(why);
  }
}

void SetEngine::peerFailed(int rank, const std::string &what) {
  // As an abort, but without waiting (this is the watch's thread, which the teardown joins).
  const Status why{HORA_ERR_PEER_LOST, detail::concat("rank ", rank, " of process set ", id_,
                                                      " failed first: ", what)};
  if (running_ && aborted_.raise(why)) {
    HORA_LOG(kError) << "process set " << id_ << " stopped: " << why.message;
    interruptPlanes(why);
    queue_.kick();
  }
}

SetEngine::Cycle SetEngine::runCycle(bool launches) {
  if (aborted_.raised()) {
    const Status why = aborted_.why();
    if (running_) fail(Error(why.code, why.message, __FILE__, __LINE__));
    return Cycle::kStopped;
  }
  try {
    return cycle(launches);
  } catch (const Error &e) {
    fail(e);
  } catch (const std::exception &e) {
    fail(Error(HORA_ERR_INTERNAL, e.what(), __FILE__, __LINE__));
  }
  return Cycle::kStopped;
}

void SetEngine::fail(const Error &e) {
  // An abort's interrupt ends the cycle with its own error, or one a shut socket gave: either
  // way the set stops for the abort's reason.
  const bool aborted = aborted_.raised();
  Status why = aborted ? aborted_.why() : e.toStatus();
  // A wait ran out: say who it waited for, where the group's presence channel tells. A peer
  // lost: it may itself have given up after another failure (a neighbour that closed its
  // connections); name the first rank that failed, and why, where a peer said so.
  if (!aborted && why.code == HORA_ERR_TIMEOUT && watch_ != nullptr) {
    if (const std::string who = watch_->missing(); !who.empty()) {
      why.message += "; not taking part: " + who;
    } else if (const std::string lost = watch_->presenceLost(); !lost.empty()) {
      why.message += "; which ranks are missing is unknown: the presence channel failed: " + lost;
    }
  } else if (!aborted && why.code == HORA_ERR_PEER_LOST && watch_ != nullptr) {
    if (const std::string first = watch_->firstFailure(); !first.empty()) {
      why.message += "; " + first;
    }
  }
  if (!aborted) {
    HORA_LOG(kError) << "process set " << id_ << " stopped: " << why.message;
  }
  if (blastRadius(why.code) == BlastRadius::kRuntime) parts_.group->poison(why.code, why.message);
  // The peers waiting on this rank hear of it now, where the planes can tell them (the shared
  // segment marks this rank failed, sockets close), not when this process exits; the others
  // through the failure this rank declares on the presence channel (stop()).
  if (!aborted) interruptPlanes(why);
  stop(why);
}

SetEngine::Cycle SetEngine::cycle(bool launches) {
  bool agreed = false;
  if (!deviceOps_.empty()) {
    const size_t before = deviceOps_.size();
    completeDeviceOps();
    agreed = deviceOps_.size() != before;
  }
  queue_.popAll(fresh_);
  if (!fresh_.empty()) observers_.dequeued(fresh_);
  for (RequestPtr &r : fresh_) {
    const std::string_view name = r->name();  // the request's own: the key lives as long
    pending_.emplace(name, std::move(r));
  }
  agreed = agreed || !fresh_.empty();
  fresh_.clear();
  const bool wantShutdown = queue_.shutdownRequested();
  if (pending_.empty() && !wantShutdown && awaiting_.empty()) {
    busy_ = false;
    return agreed ? Cycle::kAgreed : Cycle::kNothing;
  }

  observers_.negotiating(++negotiations_);
  // Device work runs only while this set holds the GPU's turn on every member (DeviceTurn), on
  // the set's own thread or a caller's whose CUDA context drive() keeps (`launches`).
  // Offered only with device work already agreed: every member has it, so every member is in this
  // round at once and the turn is held briefly (docs/gpu.md).
  // A set alone on its process's GPU offers whenever it has work pending: the round that agrees
  // device work then launches it (DeviceTurn::offerAlone).
  bool offered = false;
  if (launches) {
    offered = !awaiting_.empty() ? turn_->offer(id_)
                                 : !pending_.empty() && cudaDevice_.load() >= 0 && turn_->offerAlone(id_);
  }
  Controller::Outcome outcome = controller_->negotiate(pending_, wantShutdown, offered);
  if (outcome.shutdown) {
    if (offered) turn_->settle(id_, 0);
    stop(Status{HORA_ERR_SHUT_DOWN,
                id_ == 0 ? "the runtime shut down (hora_shutdown on this or another rank) "
                           "before the op finished"
                         : "the process set was destroyed or the runtime shut down before the "
                           "op finished"});
    return Cycle::kStopped;
  }
  // CPU work runs now; device work waits for a cycle in which every member holds the turn
  // (this one, usually), in the order agreed. Its requests leave pending_ meanwhile, so that
  // negotiation does not see them again.
  order_.clear();
  const size_t waitingBefore = awaiting_.size();
  for (const auto &r : outcome.responses) {
    if (r->agreed.device.isCpu() || !r->ok()) {
      order_.push_back(r.get());
      continue;
    }
    Awaiting waiting{r, nullptr};
    if (auto it = pending_.find(r->agreed.name); it != pending_.end()) {
      waiting.request = std::move(it->second);
      pending_.erase(it);
    }
    awaiting_.push_back(std::move(waiting));
  }
  execute(order_);
  bool launched = false;
  if (outcome.deviceAgreed && !awaiting_.empty()) {
    launchAwaiting();
    launched = true;
  } else if (awaiting_.size() > waitingBefore) {
    deferredLaunches_ += awaiting_.size() - waitingBefore;
  }
  if (offered) turn_->settle(id_, launched && device_ ? device_->queued() : 0);
  if (awaiting_.empty()) {
    turn_->stopWaiting(id_);
  } else {
    std::shared_ptr<Waker> waker = waker_;
    turn_->wait(id_, [waker] { waker->kick(); });
  }
  if (!deviceOps_.empty()) completeDeviceOps();  // small ops may be done already
  observers_.idle();
  busy_ = !pending_.empty() || !awaiting_.empty();
  return agreed || !outcome.responses.empty() ? Cycle::kAgreed : Cycle::kNothing;
}

void SetEngine::execute(const std::vector<const Response *> &responses) {
  std::vector<RequestPtr> standIns;  // this rank has joined: it takes part without data
  // The device ops of these responses go to NCCL as one group (DeviceExecutor::beginCycle),
  // opened at the first of them; their requests learn their ends once the group is launched.
  deviceCycle_ = false;
  const size_t deviceOpsBefore = deviceOps_.size();
  std::vector<std::shared_ptr<DeviceEnd>> ends;
  for (const FusionGroup &group : planFusion(responses, knobs_.fusionThreshold)) {
    standIns.clear();
    const Response &first = *responses[group.members.front()];
    ObservedOp observed;  // its requests and each one's place in the set's sequence of operations
    observed.op = first.agreed.op;
    observed.name = first.agreed.name;
    std::vector<Request *> &requests = observed.requests;
    std::vector<int64_t> &seqs = observed.seqs;
    std::vector<const Response *> members;
    std::vector<PendingMap::iterator> owned;  // this rank's own requests among them, to finish
    requests.reserve(group.members.size());
    for (size_t m : group.members) {
      const int64_t seq = ++opSeq_;
      const Response &response = *responses[m];
      auto it = pending_.find(response.agreed.name);
      if (it == pending_.end() && response.status == HORA_ERR_TIMEOUT) {
        // HORA_STALL_SHUTDOWN_S failed a name this rank never submitted: nothing to run here,
        // but the moment to keep this rank's past too
        observers_.absent(response, seq);
        observers_.stallShutdown(response.error);
        continue;
      }
      if (it == pending_.end() && !response.ok()) {
        // This rank has joined and the op failed on every rank that sent it (a mismatch, a
        // refusal, Horovod's join mode): there is nothing to stand in for.
        HORA_ENFORCE(std::count(response.joined.begin(), response.joined.end(), rank_) == 1,
                     "no pending request for '", response.agreed.name, "'");
        continue;
      }
      members.push_back(&response);
      seqs.push_back(seq);
      if (it != pending_.end()) {
        requests.push_back(it->second.get());
        owned.push_back(it);
      } else {
        HORA_ENFORCE(std::count(response.joined.begin(), response.joined.end(), rank_) == 1,
                     "no pending request for '", response.agreed.name, "'");
        standIns.push_back(Request::standIn(response, id_));
        requests.push_back(standIns.back().get());
      }
    }
    if (requests.empty()) continue;
    observers_.started(observed, members);
    Status status;
    if (!first.ok()) {
      status = Status{first.status, first.error};
    } else if (!first.agreed.device.isCpu()) {
      try {
        executeOnDevice(requests, members);
        // Staged: launched with the rest of the cycle's device ops below, completed by
        // completeDeviceOps() once the device has run it.
        ends.push_back(device_->lastEnd());
        DeviceOp op;
        op.ticket = device_->queued();
        for (PendingMap::iterator it : owned) {
          op.owned.push_back(std::move(it->second));
          pending_.erase(it);
        }
        op.standIns = std::move(standIns);
        op.observed = std::move(observed);
        deviceOps_.push_back(std::move(op));
        deviceBusy_ = true;
        continue;
      } catch (const Error &e) {
        if (blastRadius(e.status()) != BlastRadius::kThisOp) throw;
        status = e.toStatus();
      }
    } else {
      try {
        const OpSpec &spec = opSpec(first.agreed.op);
        if (spec.onBackend && !parts_.backend->caps().runs(first.agreed.op)) {
          HORA_THROW(HORA_ERR_UNSUPPORTED, spec.name, " '", first.agreed.name, "': backend ",
                     backendName_, " of process set ", id_, " does not run it");
        }
        spec.runCpu(OpRun{requests, members, executor_.get(), device_.get(), handler_,
                          contributors(first)});
      } catch (const Error &e) {
        if (blastRadius(e.status()) != BlastRadius::kThisOp) throw;
        status = e.toStatus();
      }
    }
    observers_.finished(observed, status);
    // HORA_STALL_SHUTDOWN_S failed it on every rank: the moment to look at every rank's past
    if (status.code == HORA_ERR_TIMEOUT) observers_.stallShutdown(status.message);
    finish(owned, status);
    if (status.ok()) observers_.completed(observed);
  }
  if (deviceCycle_) {
    deviceCycle_ = false;
    device_->endCycle();
    // Launched: a stream-ordered wait may go on now.
    for (size_t i = 0; i < ends.size(); ++i) {
      for (const RequestPtr &r : deviceOps_[deviceOpsBefore + i].owned) r->launched(ends[i]);
    }
  }
}

void SetEngine::executeOnDevice(const std::vector<Request *> &requests,
                                const std::vector<const Response *> &members) {
  const Response &first = *members.front();
  if (!device_) {
    // This rank's GPU: its tensors' (submit() keeps them on one). A rank that joined before its
    // first CUDA op has none and takes its local rank's, recorded first: a later submission on
    // another GPU is then refused by submit(), as for any rank, instead of running on this one.
    int device = cudaDevice_.load();
    if (device < 0) {
      const int chosen = parts_.fabric->defaultDevice(parts_.localRank);
      device = -1;
      device = cudaDevice_.compare_exchange_strong(device, chosen) ? chosen : device;
    }
    turn_->uses(id_);
    DeviceHooks hooks;
    hooks.wake = [this] { queue_.kick(); };
    hooks.lostPeer = [this] { return watch_ != nullptr ? watch_->lostPeer() : std::string(); };
    // The end of this set's device work gives the GPU's turn back, even while this engine waits
    // in a negotiation (the turn outlives the executor: the process's, or the test's).
    hooks.finished = [turn = turn_, id = id_](uint64_t ticket) { turn->finished(id, ticket); };
    hooks.seed = std::move(parts_.deviceSeed);
    FormingScope forming("process set " + std::to_string(id_));
    formingPhase(*parts_.group, "starting NCCL on cuda:" + std::to_string(device), [&] {
      device_ = parts_.fabric->deviceExecutor(parts_.group->control(), device, std::move(hooks));
    });
  }
  const OpSpec &spec = opSpec(first.agreed.op);
  if (spec.runDevice == nullptr) {
    HORA_THROW(HORA_ERR_INTERNAL, spec.name, " '", first.agreed.name, "' on a device");
  }
  if (!deviceCycle_) {
    device_->beginCycle();
    deviceCycle_ = true;
  }
  spec.runDevice(OpRun{requests, members, nullptr, device_.get(), handler_,
                       contributors(first)});
}

void SetEngine::submit(RequestPtr request) {
  const Device device = request->msg().device;
  if (!device.isCpu()) {
    int first = -1;
    if (cudaDevice_.compare_exchange_strong(first, device.id)) {
      turn_->uses(id_);
    } else if (first != device.id) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, opTypeName(request->msg().op), " '", request->name(),
                 "': on cuda:", device.id, ", but this rank's CUDA tensors in process set ", id_,
                 " are on cuda:", first, "; one GPU per rank and process set");
    }
  }
  observers_.submitted(*request);
  const uint64_t flightId = request->flightId;  // a refused push drops the request
  try {
    queue_.push(std::move(request));
  } catch (const Error &e) {
    observers_.refused(flightId, e.status());
    throw;
  }
}

void SetEngine::finish(const std::vector<PendingMap::iterator> &owned, const Status &status) {
  finished_.clear();
  finishedNames_.clear();
  for (PendingMap::iterator it : owned) {
    finished_.push_back(std::move(it->second));
    pending_.erase(it);
  }
  complete(finished_, status);
}

void SetEngine::complete(std::vector<RequestPtr> &requests, const Status &status) {
  finishedNames_.clear();
  for (const RequestPtr &r : requests) finishedNames_.push_back(r->name());
  queue_.release(finishedNames_);  // one lock for the group, before any caller wakes
  // Settled first, then woken: a caller woken by the first finds the rest settled and does not
  // sleep again while the engine is still completing them.
  for (RequestPtr &r : requests) {
    if (!r->settle(status)) r.reset();
  }
  for (const RequestPtr &r : requests) {
    if (r) r->wake();
  }
  requests.clear();
}

void SetEngine::launchAwaiting() {
  for (Awaiting &a : awaiting_) {
    if (a.request) {
      const std::string_view name = a.request->name();
      pending_.emplace(name, std::move(a.request));
    }
  }
  std::vector<const Response *> order;
  order.reserve(awaiting_.size());
  for (const Awaiting &a : awaiting_) order.push_back(a.response.get());
  execute(order);  // the responses live in awaiting_ until it returns
  awaiting_.clear();
}

void SetEngine::completeDeviceOps() {
  const uint64_t done = device_->poll();
  std::vector<DeviceOp> finished;
  while (!deviceOps_.empty() && deviceOps_.front().ticket <= done) {
    finished.push_back(std::move(deviceOps_.front()));
    deviceOps_.pop_front();
  }
  deviceBusy_ = !deviceOps_.empty();
  for (DeviceOp &op : finished) finishDeviceOp(op, Status::success());
}

void SetEngine::finishDeviceOp(DeviceOp &op, const Status &status) {
  observers_.finished(op.observed, status);
  Status mine = status;
  const std::string prefix = std::string(opSpec(op.observed.op).name) + " '" + op.observed.name + "': ";
  if (!status.ok() && status.message.compare(0, prefix.size(), prefix) != 0) {
    mine.message = prefix + status.message;
  }
  complete(op.owned, mine);
  if (status.ok()) observers_.completed(op.observed);
}

void SetEngine::settleDeviceOps(const Status &why) {
  if (deviceOps_.empty()) return;
  if (why.code == HORA_ERR_SHUT_DOWN) {
    try {
      device_->drain(knobs_.timeoutS);
    } catch (const Error &e) {
      HORA_LOG(kWarning) << "process set " << id_ << ": device work at shutdown: " << e.message();
    }
  }
  uint64_t done = 0;
  try {
    done = device_->poll();
  } catch (const Error &) {  // aborted already: nothing more finishes
  }
  if (done < device_->queued()) device_->abort(why.message);
  for (DeviceOp &op : deviceOps_) finishDeviceOp(op, op.ticket <= done ? Status::success() : why);
  deviceOps_.clear();
  deviceBusy_ = false;
}

void SetEngine::leaveTurn(const Status &why) {
  turn_->leave(id_);
  // Agreed but never launched: every member fails them alike.
  for (Awaiting &a : awaiting_) {
    if (!a.request) continue;
    Status s = why;
    s.message = std::string(opTypeName(a.request->msg().op)) + " '" + a.request->name() + "': " + why.message;
    observers_.dropped(*a.request, s.code);
    a.request->complete(std::move(s));
  }
  awaiting_.clear();
}

void SetEngine::stop(const Status &why) {
  running_ = false;
  if (why.code != HORA_ERR_SHUT_DOWN) failed_ = true;
  if (why.code != HORA_ERR_SHUT_DOWN) observers_.failed(why);
  if (!deviceOps_.empty()) settleDeviceOps(why);
  leaveTurn(why);
  if (id_ == 0 && handler_ != nullptr) handler_->worldStopped();
  std::vector<RequestPtr> all = queue_.close(why);
  for (auto &kv : pending_) all.push_back(std::move(kv.second));
  pending_.clear();
  for (RequestPtr &r : all) {
    Status s = why;
    s.message = std::string(opTypeName(r->msg().op)) + " '" + r->name() + "': " + why.message;
    observers_.dropped(*r, s.code);
    r->complete(std::move(s));
  }
  observers_.stopped(why);
}

}  // namespace hora
