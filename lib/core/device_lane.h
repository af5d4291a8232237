// SPDX-License-Identifier: Apache-2.0
// A process set's device lane: its CUDA tensors' executor, the GPU's turn, and its device work
// from agreement to completion.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/controller.h"
#include "core/device_executor.h"
#include "core/device_turn.h"
#include "core/op_observer.h"
#include "core/tensor_queue.h"
#include "core/world.h"

namespace hora {

class SetOpHandler;  // core/set_engine.h

// The set engine negotiates and runs CPU work; device work goes through its lane. A device response
// agreed in a round waits in the lane (await) until a round in which this set holds the GPU's turn
// on every member (DeviceTurn; the engine offers through offer()), which launches it (launch, in
// the engine's execute(), between beginExecute and endExecute: one NCCL group per call). The ops
// are then queued on the device; the lane completes them when the executor's poll() says their
// ticket is done (completeFinished), and settles them at the set's stop.
//
// Threads: admit(), usesGpu(), inFlight() and deferredLaunches() any thread; everything else is
// called by whichever thread runs the set's cycles (the engine's cycleMutex_ held), or by the
// set's thread at setup and teardown.
class DeviceLane {
 public:
  // What the lane is given on the set's thread once the set's planes exist, before any submission.
  struct Parts {
    Fabric *fabric = nullptr;    // makes the set's device executor at its first CUDA response
    Group *group = nullptr;      // the set's: NCCL's setup runs over its control plane
    int localRank = 0;           // this rank's on its host: its GPU when no tensor names one
    int size = 1;                // the set's
    double drainS = 0;           // an orderly stop waits this long for queued work (HORA_TIMEOUT_S)
    DeviceTurn *turn = nullptr;  // the GPU's turn among this process's sets (null: the process's)
    std::shared_ptr<DeviceSeed> seed;  // the set's NCCL communicator split from the world's
    SetOpHandler *handler = nullptr;   // OpRun::handler: the world set's runtime, else null
    OpObserver *observer = nullptr;    // the engine's: told when a device op finishes
    std::function<std::string()> lostPeer;  // DeviceHooks::lostPeer: the stall watch's
    // The engine's completion of its own requests: releases their names, settles and wakes them.
    std::function<void(std::vector<RequestPtr> &, const Status &)> complete;
  };

  // `queue`: the engine's, kicked when device work finishes or the GPU's turn comes free.
  DeviceLane(int32_t set, TensorQueue &queue) : set_(set), queue_(queue) {}
  DeviceLane(const DeviceLane &) = delete;
  DeviceLane &operator=(const DeviceLane &) = delete;

  void setUp(Parts parts);
  // Teardown, on the set's thread: the turn given back, the waker detached, the executor gone.
  void close();

  // Any thread: a request with CUDA tensors is submitted. Its GPU becomes this rank's in the set
  // (and the set a user of the GPU's turn), or must be the one already. Throws
  // Error(HORA_ERR_INVALID_ARGUMENT) for another (one NCCL communicator per set and rank: one GPU).
  void admit(const Request &request);
  // Any thread: this rank has CUDA tensors in the set (a caller's cycle may launch device work).
  bool usesGpu() const { return cudaDevice_.load() >= 0; }
  // Any thread: device ops are queued and not completed (the engine's loop wakes to poll them).
  bool inFlight() const { return inFlight_.load(); }
  // Any thread: device responses agreed in a round that could not launch them (they waited for
  // the GPU's turn): 0 while the set is alone on its process's GPU.
  uint64_t deferredLaunches() const { return deferredLaunches_.load(); }
  // Device responses agreed and not launched yet.
  bool awaiting() const { return !awaiting_.empty(); }
  // The executor, null before the set's first CUDA response (OpRun::device: a new set's
  // communicator is split from the world's).
  DeviceExecutor *executor() const { return device_.get(); }

  // Completes the device ops whose work finished; true if there were any. Throws what poll() throws.
  bool completeFinished();

  // Before a round's negotiation, where the cycle may launch device work: whether this set offers
  // for the GPU's turn (Controller::negotiate's deviceOffer). `workPending`: the engine has
  // requests pending.
  bool offer(bool workPending);
  // A round that offered ended in a shutdown: the turn is given back.
  void withdrawOffer() { turn_->settle(set_, 0); }
  // A device response agreed this round: it waits for the turn with this rank's request, taken
  // out of `pending` (none: a joined rank's), so that negotiation does not see it again.
  void await(std::shared_ptr<const Response> response, PendingMap &pending);
  // Under the turn, agreed by every member: the awaiting requests go back to `pending` and
  // `execute` (the engine's) runs the responses, in the order agreed.
  void launchAwaiting(PendingMap &pending,
                      const std::function<void(const std::vector<const Response *> &)> &execute);
  // The round is over: `launched` whether it launched the awaiting work (else what it agreed is
  // counted as deferred). The turn is settled where this set offered, and waited for while work
  // still awaits it.
  void endRound(bool offered, bool launched);

  // The engine's execute(): the device ops launched between these go to NCCL as one group
  // (DeviceExecutor::beginCycle, opened at the first of them); their requests learn their ends
  // once the group is launched, at endExecute().
  void beginExecute();
  void endExecute();
  // One fused group of CUDA tensors (`op`'s requests, their responses `members`): staged in this
  // execute()'s NCCL group, then completed by completeFinished() once the device has run it. The
  // executor is made at the set's first one. Throws Error as the executor does, before taking
  // anything; otherwise takes `owned` (this rank's requests, their names still held) out of
  // `pending`, and `standIns` and `op` with them.
  void launch(ObservedOp &op, const std::vector<const Response *> &members,
              const std::vector<PendingMap::iterator> &owned, PendingMap &pending,
              std::vector<RequestPtr> &standIns);

  // The set stops: an orderly stop (HORA_ERR_SHUT_DOWN) waits for the queued device work
  // (bounded); otherwise, or if that fails, the executor is aborted. Every device op is then
  // completed, with `why` unless done; the turn is given back and the awaiting ops fail.
  void stop(const Status &why);

 private:
  // Device ops queued and not yet finished, oldest first: the engine goes on negotiating while
  // the GPU works, and the lane completes them when the executor's poll() says their ticket is done.
  struct DeviceOp {
    uint64_t ticket = 0;
    ObservedOp op;                     // its requests (both kinds, in the group's order)
    std::vector<RequestPtr> owned;     // this rank's requests (out of pending_, names held)
    std::vector<RequestPtr> standIns;  // a joined rank's stand-ins
  };
  // Device responses agreed but not yet launched (waiting for the GPU's turn on every member), in
  // the order agreed, with this rank's request (null for a joined rank's).
  struct Awaiting {
    std::shared_ptr<const Response> response;
    RequestPtr request;
  };
  // What the turn calls when it comes free: kicks the engine's queue while the lane is open.
  class Waker {
   public:
    explicit Waker(TensorQueue *queue) : queue_(queue) {}
    void kick() {
      std::lock_guard<std::mutex> lock(mutex_);
      if (queue_ != nullptr) queue_->kick();
    }
    void detach() {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_ = nullptr;
    }

   private:
    std::mutex mutex_;
    TensorQueue *queue_;
  };

  void run(const std::vector<Request *> &requests, const std::vector<const Response *> &members);
  void open();  // makes the executor (collective over the set)
  void finish(DeviceOp &op, const Status &status);
  void settleOps(const Status &why);
  void leaveTurn(const Status &why);  // the turn given back, awaiting ops failed

  const int32_t set_;
  TensorQueue &queue_;
  Parts parts_;
  DeviceTurn *turn_ = &DeviceTurn::process();  // fixed by setUp
  std::atomic<int> cudaDevice_{-1};  // the GPU of this rank's first CUDA submission in the set
  // CUDA tensors' executor (NCCL), made at the set's first CUDA response: one GPU per rank and set.
  std::unique_ptr<DeviceExecutor> device_;
  std::deque<DeviceOp> ops_;
  std::atomic<bool> inFlight_{false};  // !ops_.empty(), for the engine's loop between cycles
  std::deque<Awaiting> awaiting_;
  size_t agreedThisRound_ = 0;  // await() calls since the last endRound()
  std::atomic<uint64_t> deferredLaunches_{0};
  std::shared_ptr<Waker> waker_ = std::make_shared<Waker>(&queue_);
  // This execute()'s: the executor's cycle is open (one NCCL group), the ops queued before it,
  // and the ends of those it queued.
  bool cycleOpen_ = false;
  size_t opsBefore_ = 0;
  std::vector<std::shared_ptr<DeviceEnd>> ends_;
};

}  // namespace hora
