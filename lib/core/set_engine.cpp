// SPDX-License-Identifier: Apache-2.0
// SetEngine thread: wait for work, negotiate a cycle, execute it, complete requests.
#include "core/set_engine.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>

#include <algorithm>

#include "base/logging.h"
#include "core/affinity.h"
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
    DeviceLane::Parts device;
    device.fabric = parts_.fabric;
    device.group = parts_.group.get();
    device.localRank = parts_.localRank;
    device.size = size_;
    device.drainS = knobs_.timeoutS;
    device.turn = parts_.turn;
    device.seed = std::move(parts_.deviceSeed);  // DeviceHooks::seed at the executor's making
    device.handler = handler_;
    device.observer = &observers_;
    device.lostPeer = [this] { return watch_ != nullptr ? watch_->lostPeer() : std::string(); };
    device.complete = [this](std::vector<RequestPtr> &requests, const Status &status) {
      complete(requests, status);
    };
    lane_.setUp(std::move(device));
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
  lane_.close();  // the GPU's turn given back, the device executor gone
  watch_.reset();  // its thread uses the group's presence channel
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
    const bool device = lane_.inFlight();
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
      const bool device = lane_.usesGpu() && parts_.fabric != nullptr;
      std::shared_ptr<void> callerContext = device ? parts_.fabric->keepDeviceContext() : nullptr;
      Cycle done = Cycle::kAgreed;
      while (done == Cycle::kAgreed && !request.done()) done = runCycle(/*launches=*/device);
      // What is left (requests other ranks have not submitted yet, device ops in flight) is the
      // set's thread's, which may be asleep waiting for work; and a stopped set's thread is to end.
      if (done == Cycle::kStopped || busy_.load() || lane_.inFlight()) queue_.kick();
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
  bool agreed = lane_.completeFinished();
  queue_.popAll(fresh_);
  if (!fresh_.empty()) observers_.dequeued(fresh_);
  for (RequestPtr &r : fresh_) {
    const std::string_view name = r->name();  // the request's own: the key lives as long
    pending_.emplace(name, std::move(r));
  }
  agreed = agreed || !fresh_.empty();
  fresh_.clear();
  const bool wantShutdown = queue_.shutdownRequested();
  if (pending_.empty() && !wantShutdown && !lane_.awaiting()) {
    busy_ = false;
    return agreed ? Cycle::kAgreed : Cycle::kNothing;
  }

  observers_.negotiating(++negotiations_);
  // Device work runs only while this set holds the GPU's turn on every member (the lane's offer
  // rules), on the set's own thread or a caller's whose CUDA context drive() keeps (`launches`).
  const bool offered = launches && lane_.offer(!pending_.empty());
  Controller::Outcome outcome = controller_->negotiate(pending_, wantShutdown, offered);
  if (outcome.shutdown) {
    if (offered) lane_.withdrawOffer();
    stop(Status{HORA_ERR_SHUT_DOWN,
                id_ == 0 ? "the runtime shut down (hora_shutdown on this or another rank) "
                           "before the op finished"
                         : "the process set was destroyed or the runtime shut down before the "
                           "op finished"});
    return Cycle::kStopped;
  }
  // CPU work runs now; device work waits in the lane for a cycle in which every member holds the
  // turn (this one, usually), in the order agreed. Its requests leave pending_ meanwhile, so that
  // negotiation does not see them again.
  order_.clear();
  for (const auto &r : outcome.responses) {
    if (r->agreed.device.isCpu() || !r->ok()) {
      order_.push_back(r.get());
    } else {
      lane_.await(r, pending_);
    }
  }
  execute(order_);
  const bool launched = outcome.deviceAgreed && lane_.awaiting();
  if (launched) {
    lane_.launchAwaiting(pending_, [this](const std::vector<const Response *> &order) { execute(order); });
  }
  lane_.endRound(offered, launched);
  lane_.completeFinished();  // small ops may be done already
  observers_.idle();
  busy_ = !pending_.empty() || lane_.awaiting();
  return agreed || !outcome.responses.empty() ? Cycle::kAgreed : Cycle::kNothing;
}

namespace {

// Runs `work`: an error that fails only this op (its blast radius) becomes the op's status; any
// other is thrown on, and stops the set.
template <typename Work>
Status failsThisOp(Work &&work) {
  try {
    work();
  } catch (const Error &e) {
    if (blastRadius(e.status()) != BlastRadius::kThisOp) throw;
    return e.toStatus();
  }
  return Status::success();
}

}  // namespace

void SetEngine::execute(const std::vector<const Response *> &responses) {
  lane_.beginExecute();  // these responses' device ops go to NCCL as one group, at endExecute()
  for (const FusionGroup &group : planFusion(responses, knobs_.fusionThreshold)) {
    const Response &first = *responses[group.members.front()];
    GroupRun run = resolve(group, responses);
    if (run.op.requests.empty()) continue;
    observers_.started(run.op, run.members);
    Status status;
    if (!first.ok()) {
      status = Status{first.status, first.error};  // failed as agreed: nothing runs
    } else if (!first.agreed.device.isCpu()) {
      status = failsThisOp([&] { lane_.launch(run.op, run.members, run.owned, pending_, run.standIns); });
      if (status.ok()) continue;  // queued: the lane completes it once the device has run it
    } else {
      status = failsThisOp([&] { runOnCpu(first, run); });
    }
    conclude(run, status);
  }
  lane_.endExecute();
}

SetEngine::GroupRun SetEngine::resolve(const FusionGroup &group,
                                       const std::vector<const Response *> &responses) {
  const Response &first = *responses[group.members.front()];
  GroupRun run;
  run.op.op = first.agreed.op;
  run.op.name = first.agreed.name;
  run.op.requests.reserve(group.members.size());
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
    run.members.push_back(&response);
    run.op.seqs.push_back(seq);
    if (it != pending_.end()) {
      run.op.requests.push_back(it->second.get());
      run.owned.push_back(it);
    } else {
      HORA_ENFORCE(std::count(response.joined.begin(), response.joined.end(), rank_) == 1,
                   "no pending request for '", response.agreed.name, "'");
      run.standIns.push_back(Request::standIn(response, id_));
      run.op.requests.push_back(run.standIns.back().get());
    }
  }
  return run;
}

void SetEngine::runOnCpu(const Response &first, const GroupRun &run) {
  const OpSpec &spec = opSpec(first.agreed.op);
  if (spec.backendCall && !parts_.backend->caps().runs(*spec.backendCall)) {
    HORA_THROW(HORA_ERR_UNSUPPORTED, spec.name, " '", first.agreed.name, "': backend ",
               backendName_, " of process set ", id_, " does not run it");
  }
  spec.runCpu(OpRun{run.op.requests, run.members, executor_.get(), lane_.executor(), handler_,
                    contributors(first)});
}

void SetEngine::conclude(GroupRun &run, const Status &status) {
  observers_.finished(run.op, status);
  // HORA_STALL_SHUTDOWN_S failed it on every rank: the moment to look at every rank's past
  if (status.code == HORA_ERR_TIMEOUT) observers_.stallShutdown(status.message);
  finish(run.owned, status);
  if (status.ok()) observers_.completed(run.op);
}

void SetEngine::submit(RequestPtr request) {
  if (!request->msg().device.isCpu()) lane_.admit(*request);
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

void SetEngine::stop(const Status &why) {
  running_ = false;
  if (why.code != HORA_ERR_SHUT_DOWN) {
    failed_ = true;
    observers_.failed(why);
  }
  lane_.stop(why);
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
