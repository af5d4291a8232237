// SPDX-License-Identifier: Apache-2.0
// Runtime: forms the world, keeps the process sets, and routes requests to their set's engine.
#include "core/engine.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <tuple>
#include <utility>

#include "core/affinity.h"
#include "core/forming.h"
#include "base/knobs.h"
#include "base/logging.h"

namespace hora {

namespace {

// SIGUSR1: every coordinator reports its stalled names at its next cycle, and every flight
// recorder writes its file. Installed only where the program left SIGUSR1 at its default (which
// would kill the process), once per process.
void onStallSignal(int) {
  stallReportRequests().fetch_add(1, std::memory_order_relaxed);
  const int saved = errno;
  if (const int fd = FlightRecorder::signalWriteFd(); fd >= 0) {
    const char byte = 1;
    if (write(fd, &byte, 1) < 0) {
      // the pipe is full: a dump is pending anyway
    }
  }
  errno = saved;
}

// Installs `handler` for `signo` only where the program left it at its default action.
void installIfDefault(int signo, void (*handler)(int)) {
  struct sigaction current {};
  if (sigaction(signo, nullptr, &current) != 0 || current.sa_handler != SIG_DFL ||
      (current.sa_flags & SA_SIGINFO) != 0) {
    return;
  }
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(signo, &action, nullptr);
}

// SIGUSR1 (above), and SIGTERM, SIGINT, SIGHUP: left at their default they end the process
// silently, which is how mpirun ends a job when one rank dies (SIGTERM to the others, SIGKILL
// about a second later). Each survivor then says so on stderr, writes its flight recorder file,
// and ends of the same signal (FlightRecorder::onFatalSignal). Once per process.
void installSignals() {
  static std::once_flag once;
  std::call_once(once, [] {
    FlightRecorder::makeSignalPipe();
    installIfDefault(SIGUSR1, onStallSignal);
    for (int signo : {SIGTERM, SIGINT, SIGHUP}) installIfDefault(signo, FlightRecorder::onFatalSignal);
  });
}

// The job id every rank of this job agrees on, for the flight recorder's file names: the
// launcher's, where one is set (the same on every rank of a launch, different between
// launches); else `run`. Letters, digits, '.', '_' and '-' only: it goes into a path.
std::pair<std::string, std::string> jobId(const std::string &run) {
  auto safe = [](std::string text) {
    for (char &c : text) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
      if (!ok) c = '_';
    }
    return text.substr(0, 64);
  };
  auto env = [](const char *name) -> std::string {
    const char *v = environmentValue(name);
    return v != nullptr ? v : "";
  };
  if (std::string v = env("TORCHELASTIC_RUN_ID"); !v.empty() && v != "none") {
    return {"torchelastic-" + safe(v), "TORCHELASTIC_RUN_ID"};
  }
  if (std::string v = env("OMPI_MCA_ess_base_jobid"); !v.empty()) {
    return {"ompi-" + safe(v), "OMPI_MCA_ess_base_jobid"};
  }
  if (std::string v = env("SLURM_JOB_ID"); !v.empty()) {
    // A step of an allocation (srun) is a launch of its own; plain SLURM_JOB_ID is shared by
    // every launch in the allocation, so the run is added.
    if (std::string step = env("SLURM_STEP_ID"); !step.empty()) {
      return {"slurm-" + safe(v) + "." + safe(step), "SLURM_JOB_ID.SLURM_STEP_ID"};
    }
    return {"slurm-" + safe(v) + "-" + run, "SLURM_JOB_ID and the run"};
  }
  return {run, "run (drawn by rank 0, shared at start)"};
}

// Rank 0's random run id, 48 bits: every other rank contributes all ones to the start barrier's
// AND, so the AND is rank 0's word.
uint64_t drawRun() {
  std::random_device device;
  const uint64_t mixed = (uint64_t{device()} << 32) ^ device() ^
                         static_cast<uint64_t>(getpid()) ^
                         static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return mixed & ((uint64_t{1} << 48) - 1);
}

}  // namespace

std::shared_ptr<Engine> Engine::start(const Knobs &knobs, std::shared_ptr<Fabric> fabric) {
  HORA_ENFORCE(fabric != nullptr, "Engine::start without a fabric");
  installSignals();
  std::shared_ptr<Engine> engine(new Engine(knobs, std::move(fabric)));
  Engine *e = engine.get();
  auto setup = [e]() {
    FormingScope forming("the world");
    e->bootstrap_ = e->fabric_->formWorld();
    e->topology_ = e->bootstrap_->topology();
    e->launcher_ = e->bootstrap_->launcher();
    e->rendezvousPoint_ = e->bootstrap_->rendezvousPoint();
    setLogRank(e->topology_.rank);
    SetEngine::Parts parts;
    parts.group = e->bootstrap_->worldGroup();
    parts.backend = e->fabric_->cpuBackend(*e->bootstrap_, *parts.group);
    parts.fabric = e->fabric_.get();
    e->engineCpu_ = engineCpuForThisProcess(e->knobs_.threadAffinity, e->topology_.localRank,
                                            e->topology_.localSize);
    parts.cpu = e->engineCpu_;
    parts.localRank = e->topology_.localRank;
    // The timeline's clock origin: every rank leaves this barrier at about the same moment, which
    // is what lets tools/hora-timeline-merge line up ranks on different hosts.
    std::vector<uint64_t> everyone{1, e->topology_.rank == 0 ? drawRun() : ~uint64_t{0}};
    formingPhase(*parts.group, "the start barrier (agreeing on the run's id)",
                 [&] { parts.group->control().allreduceAnd(everyone); });
    char run[17];
    std::snprintf(run, sizeof run, "%012llx", static_cast<unsigned long long>(everyone[1]));
    TimelineOrigin origin;
    origin.rank = e->topology_.rank;
    origin.size = e->topology_.size;
    origin.syncUs = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::steady_clock::now().time_since_epoch()).count();
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    origin.host = host;
    FlightOrigin flight{origin.rank, origin.size, origin.host};
    flight.run = run;
    std::tie(flight.job, flight.jobSource) = jobId(flight.run);
    e->flight_ = std::make_unique<FlightRecorder>(
        static_cast<size_t>(e->knobs_.flightRecorderOps), e->knobs_.flightRecorder,
        std::move(flight), static_cast<size_t>(e->knobs_.flightRecorderKeep));
    parts.flight = e->flight_.get();
    e->timeline_ = std::make_unique<Timeline>(std::move(origin));
    parts.timeline = e->timeline_.get();
    e->worldGroup_ = parts.group.get();
    e->backendName_ = parts.backend->name();
    return parts;
  };
  std::shared_ptr<SetEngine> world = SetEngine::start(0, knobs, setup, e);
  SetInfo info;
  for (int r = 0; r < engine->topology_.size; ++r) info.ranks.push_back(r);
  info.rank = engine->topology_.rank;
  info.engine = std::move(world);
  engine->world_ = info.engine;
  {
    std::lock_guard<std::mutex> lock(engine->setsMutex_);
    engine->sets_[0] = std::move(info);
  }
  HORA_LOG(kInfo) << "launcher " << engine->launcher_ << ", rank " << engine->topology_.rank
                  << " of " << engine->topology_.size << ", local rank "
                  << engine->topology_.localRank << " of " << engine->topology_.localSize
                  << (engine->rendezvousPoint_.empty() ? "" : ", ") << engine->rendezvousPoint_
                  << ", cpu backend " << engine->backendName_ << ", engine threads on "
                  << (engine->engineCpu_ >= 0 ? "CPU " + std::to_string(engine->engineCpu_)
                                              : std::string("any CPU"));
  if (!knobs.timeline.empty()) {
    try {
      engine->timeline_->start(knobs.timeline);
    } catch (const Error &e) {
      HORA_LOG(kWarning) << "HORA_TIMELINE: " << e.message();  // the job runs without one
    }
  }
  return engine;
}

Engine::Engine(const Knobs &knobs, std::shared_ptr<Fabric> fabric)
    : knobs_(knobs), fabric_(std::move(fabric)) {}

Engine::~Engine() {
  shutdown();
  if (timeline_) timeline_->stop();
  // After a failure the other ranks read this rank's last word (why it stopped) from the world's
  // side channel, which may live here (rank 0 serves the env:// store).
  if (world_ && world_->failed() && bootstrap_) bootstrap_->lingerAfterFailure();
}

Timeline &Engine::timeline() {
  HORA_ENFORCE(timeline_ != nullptr, "no timeline before the world is formed");
  return *timeline_;
}

bool Engine::running() const { return world_ && world_->running(); }

void Engine::submit(RequestPtr request) {
  if (request->processSet() == 0) {
    world_->submit(std::move(request));
    return;
  }
  std::shared_ptr<SetEngine> target;
  {
    std::lock_guard<std::mutex> lock(setsMutex_);
    auto it = sets_.find(request->processSet());
    if (it == sets_.end()) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, opTypeName(request->msg().op), " '", request->name(),
                 "': unknown process set ", request->processSet());
    }
    if (!it->second.engine) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, opTypeName(request->msg().op), " '", request->name(),
                 "': rank ", topology_.rank, " is not a member of process set ",
                 request->processSet());
    }
    target = it->second.engine;
  }
  target->submit(std::move(request));
}

void Engine::drive(const Request &request) {
  const int32_t id = request.processSet();
  if (id == 0) {
    world_->drive(request);
    return;
  }
  std::shared_ptr<SetEngine> target;
  {
    std::lock_guard<std::mutex> lock(setsMutex_);
    auto it = sets_.find(id);
    if (it != sets_.end()) target = it->second.engine;
  }
  if (target) target->drive(request);
}

void Engine::shutdown() { stopAll(nullptr); }

bool Engine::shutdownWithin(std::chrono::milliseconds limit) { return stopAll(&limit); }

bool Engine::stopAll(const std::chrono::milliseconds *limit) {
  std::vector<std::shared_ptr<SetEngine>> sets;
  std::shared_ptr<SetEngine> worldSet;
  {
    std::lock_guard<std::mutex> lock(setsMutex_);
    for (auto &kv : sets_) {
      if (!kv.second.engine) continue;
      if (kv.first == 0) worldSet = kv.second.engine;
      else sets.push_back(kv.second.engine);
    }
  }
  auto wait = [limit](SetEngine &s) {
    if (limit == nullptr) {
      s.join();
      return true;
    }
    return s.joinWithin(*limit);
  };
  // Sets first, all at once (each stop is collective among its own members only), then the
  // world, whose thread may be creating or destroying a set meanwhile. The stopped engines stay:
  // a late submit gets the status they stopped with.
  bool all = true;
  for (auto &s : sets) s->requestShutdown();
  for (auto &s : sets) all = wait(*s) && all;
  if (worldSet) {
    worldSet->requestShutdown();
    all = wait(*worldSet) && all;
  }
  if (timeline_) timeline_->stop();  // the file is complete once hora_shutdown returns
  return all;
}

void Engine::abortSet(int32_t id, const Status &why) {
  std::shared_ptr<SetEngine> target;
  {
    std::lock_guard<std::mutex> lock(setsMutex_);
    auto it = sets_.find(id);
    if (it == sets_.end()) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_process_set_abort: unknown process set ", id);
    }
    if (!it->second.engine) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_process_set_abort: rank ", topology_.rank,
                 " is not a member of process set ", id);
    }
    target = it->second.engine;
  }
  const auto limit = std::chrono::milliseconds(static_cast<int64_t>(knobs_.timeoutS * 1000.0));
  if (!target->abort(why, limit)) {
    HORA_THROW(HORA_ERR_TIMEOUT, "hora_process_set_abort: process set ", id,
               " did not stop within ", knobs_.timeoutS,
               " s (HORA_TIMEOUT_S): an operation moving data could not be interrupted");
  }
}

int Engine::processSetSize(int32_t id) const {
  if (id == 0) return topology_.size;
  std::lock_guard<std::mutex> lock(setsMutex_);
  auto it = sets_.find(id);
  return it == sets_.end() ? -1 : static_cast<int>(it->second.ranks.size());
}

int Engine::processSetRank(int32_t id) const {
  if (id == 0) return topology_.rank;
  std::lock_guard<std::mutex> lock(setsMutex_);
  auto it = sets_.find(id);
  return it == sets_.end() ? -1 : it->second.rank;
}

void Engine::worldStopped() {
  // Ask only: each set's stop is collective among its members, whose world engines stopped in
  // the same cycle and ask theirs too. hora_shutdown (or the destructor) joins the threads.
  std::lock_guard<std::mutex> lock(setsMutex_);
  for (auto &kv : sets_) {
    if (kv.first != 0 && kv.second.engine) kv.second.engine->requestShutdown();
  }
}

void Engine::runSetOp(Request *request, const Response &response, DeviceExecutor *worldDevice) {
  const std::vector<int64_t> &args = response.agreed.splits;
  if (response.agreed.op == OpType::kProcessSetCreate) {
    const std::vector<int> ranks(args.begin(), args.end());
    {
      std::lock_guard<std::mutex> lock(setsMutex_);
      for (const auto &kv : sets_) {
        if (kv.second.ranks == ranks) {
          if (request) request->result = kv.first;
          return;
        }
      }
    }
    const int32_t id = nextId_++;
    // Collective over the world: every rank runs this response at the same point.
    std::unique_ptr<Group> group;
    {
      FormingScope forming("process set " + std::to_string(id));
      group = bootstrap_->createGroup(*worldGroup_, ranks);
    }
    // Where the world has an NCCL communicator, the set's is split from it now (collective over
    // the world, as this response is), sharing its resources, instead of made from scratch at
    // the set's first CUDA op.
    std::shared_ptr<DeviceSeed> seed;
    if (worldDevice != nullptr) {
      FormingScope forming("process set " + std::to_string(id));
      seed = worldDevice->split(group != nullptr, group ? group->rank() : 0);
    }
    SetInfo info;
    info.ranks = ranks;
    if (group) {
      Group *g = group.release();
      auto setup = [this, g, id, seed]() mutable {
        FormingScope forming("process set " + std::to_string(id));
        SetEngine::Parts parts;
        parts.group.reset(g);
        parts.backend = fabric_->cpuBackend(*bootstrap_, *parts.group);
        parts.fabric = fabric_.get();
        parts.cpu = engineCpu_;  // every engine of a rank on its one CPU
        parts.localRank = topology_.localRank;
        parts.timeline = timeline_.get();
        parts.flight = flight_.get();
        parts.deviceSeed = std::move(seed);
        return parts;
      };
      info.engine = SetEngine::start(id, knobs_, setup, nullptr);
      info.rank = info.engine->rank();
    }
    {
      std::lock_guard<std::mutex> lock(setsMutex_);
      sets_[id] = std::move(info);
    }
    if (request) request->result = id;
    return;
  }
  HORA_ENFORCE(response.agreed.op == OpType::kProcessSetDestroy && args.size() == 1,
               "unexpected set op");
  const int32_t id = static_cast<int32_t>(args[0]);
  std::shared_ptr<SetEngine> doomed;
  {
    std::lock_guard<std::mutex> lock(setsMutex_);
    auto it = sets_.find(id);
    if (it == sets_.end() || id == 0) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "process_set_destroy: unknown process set ", id);
    }
    doomed = std::move(it->second.engine);
    sets_.erase(it);
  }
  if (doomed) {
    // Every member runs this response, so every member's set engine stops in the same cycle.
    doomed->requestShutdown();
    doomed->join();
  }
}

}  // namespace hora
