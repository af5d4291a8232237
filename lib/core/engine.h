// SPDX-License-Identifier: Apache-2.0
// The engine: one named background thread that owns the world, negotiates and runs collectives.
#pragma once

#include <atomic>
#include <future>
#include <memory>
#include <thread>

#include "base/knobs.h"
#include "bootstrap/bootstrap.h"
#include "core/backend.h"
#include "core/controller.h"
#include "core/executor.h"
#include "core/tensor_queue.h"

namespace hora {

class Engine {
 public:
  // Starts the engine thread, which forms the world (bootstrap) and creates the backend, and
  // returns once that is done. Throws Error with the thread's real init status on failure.
  static std::shared_ptr<Engine> start(const Knobs &knobs);
  ~Engine();
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;

  // Any thread. Throws Error(HORA_ERR_DUPLICATE_NAME), or the status the engine stopped with.
  void submit(RequestPtr request);
  // Any thread: a caller is about to block on results; stop holding tensors back for fusion.
  void flush() { queue_.requestFlush(); }
  // Any thread: collective stop (every rank's engine stops in the same cycle; pending requests
  // complete with HORA_ERR_SHUT_DOWN), then joins the thread. Idempotent.
  void shutdown();
  bool running() const { return running_; }

  // Fixed once start() returns.
  const Topology &topology() const { return topology_; }
  const Knobs &knobs() const { return knobs_; }
  const char *launcher() const { return launcher_; }
  const char *backendName() const { return backendName_; }
  // Size of process set `id` and this rank's rank in it; -1 if there is no such set.
  int processSetSize(int32_t id) const { return id == 0 ? topology_.size : -1; }
  int processSetRank(int32_t id) const { return id == 0 ? topology_.rank : -1; }

 private:
  explicit Engine(const Knobs &knobs);
  void threadMain(std::promise<Status> *started);
  void loop();
  void execute(const std::vector<Response> &responses);
  void finish(const std::string &name, const Status &status);
  void stop(const Status &why);

  const Knobs knobs_;
  TensorQueue queue_;
  std::thread thread_;
  std::atomic<bool> running_{false};
  Topology topology_;
  const char *launcher_ = "";
  const char *backendName_ = "";

  // Owned by the engine thread: created, used and destroyed there.
  std::unique_ptr<Bootstrap> bootstrap_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<Executor> executor_;
  PendingMap pending_;
};

}  // namespace hora
