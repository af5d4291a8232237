// SPDX-License-Identifier: Apache-2.0
// The runtime: the world, and one SetEngine per process set (set 0 is every rank).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/auto_names.h"
#include "core/set_engine.h"
#include "core/flight_recorder.h"
#include "core/timeline.h"

namespace hora {

class Engine final : private SetOpHandler {
 public:
  // Forms the world on the world set's thread (fabric's bootstrap and backend) and returns once
  // that is done. Throws Error with that thread's real init status on failure.
  static std::shared_ptr<Engine> start(const Knobs &knobs, std::shared_ptr<Fabric> fabric);
  ~Engine() override;
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;

  // Any thread. Routes to the request's process set. Throws Error: INVALID_ARGUMENT for a set
  // that does not exist or does not contain this rank, DUPLICATE_NAME, or the status the set's
  // engine stopped with.
  void submit(RequestPtr request);
  // Any thread: a caller is about to block on `request` (SetEngine::drive on its set, which
  // runs the set's cycles on the caller's thread or flushes).
  void drive(const Request &request);
  // Any thread: collective stop of every set, then of the world. Idempotent.
  void shutdown();
  // The same, for process exit: gives up after `limit` (a peer may be gone) and returns false.
  bool shutdownWithin(std::chrono::milliseconds limit);
  bool running() const;

  // Fixed once start() returns.
  const Topology &topology() const { return topology_; }
  const Knobs &knobs() const { return knobs_; }
  const char *launcher() const { return launcher_; }
  const char *backendName() const { return backendName_; }

  // Size of process set `id` (-1 if unknown), and this rank's rank in it (-1 if unknown or not
  // a member).
  int processSetSize(int32_t id) const;
  // SetEngine::abort of set `id` (0: the world), waiting at most HORA_TIMEOUT_S. Throws
  // Error(HORA_ERR_INVALID_ARGUMENT) for a set this rank is not in, Error(HORA_ERR_TIMEOUT)
  // when the set did not stop in time.
  void abortSet(int32_t id, const Status &why);
  int processSetRank(int32_t id) const;

  // Names for unnamed requests, counted from this runtime's start.
  AutoNames &autoNames() { return autoNames_; }

  // Any thread: the join mode (HORA_JOIN_ZERO_FILL, HORA_JOIN_ALLREDUCE_ONLY) every request this
  // rank submits from now on carries to the coordinator (RequestMsg::joinMode). A setting of the
  // process (hora_set_join_mode, also before hora_init): the composition root hands it to each
  // runtime it starts and forwards a change to the running one.
  uint8_t joinMode() const { return joinMode_.load(std::memory_order_relaxed); }
  void setJoinMode(uint8_t mode) { joinMode_.store(mode, std::memory_order_relaxed); }

  // hora_timeline_start/stop and HORA_TIMELINE: this rank's file; every set's engine records in it.
  Timeline &timeline();

 private:
  Engine(const Knobs &knobs, std::shared_ptr<Fabric> fabric);
  void runSetOp(Request *request, const Response &response, DeviceExecutor *worldDevice) override;
  void worldStopped() override;
  // Asks every set to stop (sets, then the world) and waits for each, bounded by `limit` if set.
  bool stopAll(const std::chrono::milliseconds *limit);

  const Knobs knobs_;
  const std::shared_ptr<Fabric> fabric_;  // what the world, its groups and their backends come from
  std::atomic<uint8_t> joinMode_{HORA_JOIN_ZERO_FILL};
  AutoNames autoNames_;
  // Made on the world thread during start(); outlives every set's thread, which records in it.
  std::unique_ptr<Timeline> timeline_;
  std::unique_ptr<FlightRecorder> flight_;  // the same
  Topology topology_;
  const char *launcher_ = "";
  const char *backendName_ = "";
  int engineCpu_ = -1;  // HORA_THREAD_AFFINITY's choice for this rank, -1 for none
  std::string rendezvousPoint_;
  // Created on the world thread; createGroup is only called in the world set's cycles.
  std::unique_ptr<Bootstrap> bootstrap_;
  Group *worldGroup_ = nullptr;  // owned by the world SetEngine

  struct SetInfo {
    std::vector<int> ranks;              // world ranks, sorted
    int rank = -1;                       // this rank's rank in the set, -1 if not a member
    std::shared_ptr<SetEngine> engine;   // null if not a member
  };
  // This mutex protects: sets_, nextId_. Written on the world thread (create, destroy) and by
  // start/shutdown; read by any thread that submits.
  mutable std::mutex setsMutex_;
  std::map<int32_t, SetInfo> sets_;
  int32_t nextId_ = 1;
  // Set 0's engine, as in sets_ (which never drops it): fixed once start() returns, so that the
  // common case, a world op, is routed without the lock.
  std::shared_ptr<SetEngine> world_;
};

}  // namespace hora
