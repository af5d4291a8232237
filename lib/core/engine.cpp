// SPDX-License-Identifier: Apache-2.0
// Engine thread: wait for work, negotiate a cycle, execute it, complete requests.
#include "core/engine.h"

#include <pthread.h>

#include <algorithm>

#include "backends/registry.h"
#include "base/logging.h"
#include "core/fusion_planner.h"

namespace hora {

std::shared_ptr<Engine> Engine::start(const Knobs &knobs) {
  std::shared_ptr<Engine> engine(new Engine(knobs));
  std::promise<Status> started;
  std::future<Status> result = started.get_future();
  engine->thread_ = std::thread(&Engine::threadMain, engine.get(), &started);
  Status status = result.get();
  if (!status.ok()) {
    engine->thread_.join();
    throw Error(status.code, status.message, __FILE__, __LINE__);
  }
  return engine;
}

Engine::Engine(const Knobs &knobs) : knobs_(knobs) {}

Engine::~Engine() { shutdown(); }

void Engine::submit(RequestPtr request) { queue_.push(std::move(request)); }

void Engine::shutdown() {
  queue_.requestShutdown();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void Engine::threadMain(std::promise<Status> *started) {
  pthread_setname_np(pthread_self(), "hora-engine");
  try {
    bootstrap_ = createBootstrap(knobs_);
    topology_ = bootstrap_->topology();
    launcher_ = bootstrap_->launcher();
    setLogRank(topology_.rank);
    backend_ = createCpuBackend(knobs_, *bootstrap_);
    backendName_ = backend_->name();
    controller_ = std::make_unique<Controller>(bootstrap_->worldControl(),
                                               static_cast<int>(knobs_.cacheCapacity));
    executor_ = std::make_unique<Executor>(*backend_, topology_.size);
  } catch (const Error &e) {
    started->set_value(e.toStatus());
    return;
  } catch (const std::exception &e) {
    started->set_value(Status{HORA_ERR_INTERNAL, std::string("hora_init: ") + e.what()});
    return;
  }
  HORA_LOG(kInfo) << "launcher " << launcher_ << ", rank " << topology_.rank << " of "
                  << topology_.size << ", local rank " << topology_.localRank << " of "
                  << topology_.localSize << ", cpu backend " << backendName_;
  running_ = true;
  started->set_value(Status::success());  // `started` is gone after this line

  try {
    loop();
  } catch (const Error &e) {
    HORA_LOG(kError) << "engine stopped: " << e.what();
    if (blastRadius(e.status()) == BlastRadius::kRuntime) bootstrap_->poison();
    stop(e.toStatus());
  } catch (const std::exception &e) {
    HORA_LOG(kError) << "engine stopped: " << e.what();
    bootstrap_->poison();
    stop(Status{HORA_ERR_INTERNAL, e.what()});
  }
  // Teardown in the thread that used them (MPI is used from this thread only).
  executor_.reset();
  controller_.reset();
  backend_.reset();
  bootstrap_.reset();
}

void Engine::loop() {
  using Clock = std::chrono::steady_clock;
  const auto batchWindow = std::chrono::nanoseconds(static_cast<int64_t>(knobs_.cycleTimeMs * 1e6));
  // While this rank has requests that other ranks have not submitted yet, cycles make no
  // progress; back off (up to 1 ms) so waiting costs no CPU, and wake at once on new work.
  std::chrono::microseconds idleBackoff{0};
  for (;;) {
    const bool busy = !pending_.empty();
    std::vector<RequestPtr> fresh = queue_.waitAndPop(busy, Clock::now() + idleBackoff, batchWindow);
    for (RequestPtr &r : fresh) pending_.emplace(r->name(), std::move(r));
    const bool wantShutdown = queue_.shutdownRequested();
    if (pending_.empty() && !wantShutdown) continue;

    Controller::Outcome outcome = controller_->negotiate(pending_, wantShutdown);
    if (outcome.shutdown) {
      stop(Status{HORA_ERR_SHUT_DOWN,
                  "the runtime shut down (hora_shutdown on this or another rank) before the op "
                  "finished"});
      return;
    }
    execute(outcome.responses);
    if (!outcome.responses.empty() || !fresh.empty()) {
      idleBackoff = std::chrono::microseconds{0};
    } else {
      idleBackoff = std::min(std::chrono::microseconds{1000},
                             std::max(std::chrono::microseconds{50}, idleBackoff * 2));
    }
  }
}

void Engine::execute(const std::vector<Response> &responses) {
  for (const FusionGroup &group : planFusion(responses, knobs_.fusionThreshold)) {
    const Response &first = responses[group.members.front()];
    std::vector<Request *> requests;
    requests.reserve(group.members.size());
    for (size_t m : group.members) {
      auto it = pending_.find(responses[m].agreed.name);
      HORA_ENFORCE(it != pending_.end(), "no pending request for '", responses[m].agreed.name, "'");
      requests.push_back(it->second.get());
    }
    Status status;
    if (!first.ok()) {
      status = Status{first.status, first.error};
    } else {
      try {
        switch (first.agreed.op) {
          case OpType::kAllreduce: executor_->allreduce(requests, first); break;
          case OpType::kBroadcast: executor_->broadcast(*requests[0], first); break;
          case OpType::kAllgather: executor_->allgather(*requests[0], first); break;
          default:
            HORA_THROW(HORA_ERR_UNSUPPORTED, opTypeName(first.agreed.op), " '",
                       first.agreed.name, "' is not supported by the ", backendName_,
                       " backend");
        }
      } catch (const Error &e) {
        if (blastRadius(e.status()) != BlastRadius::kThisOp) throw;
        status = e.toStatus();
      }
    }
    for (size_t m : group.members) finish(responses[m].agreed.name, status);
  }
}

void Engine::finish(const std::string &name, const Status &status) {
  auto it = pending_.find(name);
  if (it == pending_.end()) return;
  RequestPtr request = std::move(it->second);
  pending_.erase(it);
  queue_.release(request->processSet(), name);
  request->complete(status);
}

void Engine::stop(const Status &why) {
  running_ = false;
  std::vector<RequestPtr> all = queue_.close(why);
  for (auto &kv : pending_) all.push_back(std::move(kv.second));
  pending_.clear();
  for (RequestPtr &r : all) {
    Status s = why;
    s.message = std::string(opTypeName(r->msg().op)) + " '" + r->name() + "': " + why.message;
    r->complete(std::move(s));
  }
}

}  // namespace hora
