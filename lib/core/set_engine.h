// SPDX-License-Identifier: Apache-2.0
// One process set's engine: its queue, negotiation, backend and named thread.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "base/interrupt.h"
#include "base/knobs.h"
#include "core/backend.h"
#include "core/controller.h"
#include "core/device_executor.h"
#include "core/device_lane.h"
#include "core/device_turn.h"
#include "core/executor.h"
#include "core/flight_recorder.h"
#include "core/fusion_planner.h"
#include "core/op_observer.h"
#include "core/stall_watch.h"
#include "core/tensor_queue.h"
#include "core/timeline.h"
#include "core/world.h"

namespace hora {

// Runs the ops that are not collectives on tensors (process set creation and destruction) for
// the world set's engine; implemented by the runtime, called in the world set's cycles (on its
// thread, or on a thread that drives them, see SetEngine::drive).
class SetOpHandler {
 public:
  virtual ~SetOpHandler() = default;
  // `request` is null on a rank that has joined. `worldDevice`: the world set's device executor,
  // null before its first CUDA op (a new set's communicator is split from it).
  virtual void runSetOp(Request *request, const Response &response, DeviceExecutor *worldDevice) = 0;
  // The world set's engine stopped (shutdown, a peer's shutdown, or a fatal error): nothing may
  // outlive it. Called where the world set's cycle ran; must not block.
  virtual void worldStopped() = 0;
};

// Each set has its own thread, so sets negotiate independently: a set waiting for a slow rank
// does not hold up another. The thread makes and destroys the group, backend, controller and
// executor; a cycle that uses them runs under the set's cycle lock, on the thread or on a
// waiting caller's (drive()). A cycle negotiates and runs CPU work itself; device work (CUDA
// tensors) goes through the set's DeviceLane (the GPU's turn, one NCCL group per execute(), the
// ops in flight), and the stall watch, timeline and flight recorder hear of every request and
// operation through one OpObserver (OpObservers, the composite).
class SetEngine {
 public:
  struct Parts {
    std::unique_ptr<Group> group;
    std::unique_ptr<Backend> backend;
    Fabric *fabric = nullptr;  // makes the set's device executor at its first CUDA response
    int cpu = -1;  // the CPU the thread binds itself to (HORA_THREAD_AFFINITY), -1 for none
    int localRank = 0;  // this rank's on its host: its GPU when no tensor names one
    Timeline *timeline = nullptr;  // the runtime's, recorded in while it is active
    FlightRecorder *flight = nullptr;  // the runtime's, always recording (unless off)
    DeviceTurn *turn = nullptr;  // the GPU's turn among this process's sets (null: the process's)
    std::shared_ptr<DeviceSeed> deviceSeed;  // the set's NCCL communicator split from the world's
  };
  // Starts the thread, which runs `setup` to get its group and backend, and returns once that is
  // done. Throws Error with the status setup failed with.
  static std::shared_ptr<SetEngine> start(int32_t id, const Knobs &knobs,
                                          std::function<Parts()> setup, SetOpHandler *handler);
  ~SetEngine();
  SetEngine(const SetEngine &) = delete;
  SetEngine &operator=(const SetEngine &) = delete;

  // Any thread. Throws Error(HORA_ERR_DUPLICATE_NAME), or the status the engine stopped with.
  // Any thread. Throws Error(HORA_ERR_INVALID_ARGUMENT) for a CUDA tensor on another GPU than
  // this rank's earlier ones in the set (one NCCL communicator per set and rank: one GPU).
  void submit(RequestPtr request);
  // Any thread: a caller is about to block on results; stop holding tensors back for fusion.
  void flush() { queue_.requestFlush(); }
  // Any thread about to block on `request`, one of this set's. While the set's thread waits for
  // work, runs the set's cycles on this thread until `request` is done or a cycle agrees on
  // nothing: the cycle the set's thread would run next, without the two context switches of
  // handing it over and back (about 2 us each on a VM), which made up a fifth of a batch of small
  // allreduces; device work agreed there is launched there too (the caller's CUDA context is put
  // back afterwards). Otherwise (the set's thread is in a cycle, HORA_CALLER_CYCLES=off, a set
  // negotiated through a network) flushes, as flush(). Leaves the rest (device work in flight
  // included) to the set's thread.
  void drive(const Request &request);
  // Any thread: ask for the collective stop (every member stops in the same cycle; pending
  // requests complete with HORA_ERR_SHUT_DOWN) / wait for the thread to end.
  void requestShutdown() { queue_.requestShutdown(); }
  // Any thread: stops the set on this rank as a failure, at once, not in step with its peers
  // (hora_process_set_abort; torch's timeout of a group). A cycle blocked on a peer is
  // interrupted (Group::interrupt, Backend::interrupt); every pending request completes with
  // `why`; the peers' waits on this rank fail (a lost peer, or this rank's word on the presence
  // channel saying why). Returns once the set's thread has stopped touching any request's
  // tensors, or false if that took longer than `limit` (an operation moving data on a plane
  // that cannot be interrupted: it ends at its own deadline).
  bool abort(const Status &why, std::chrono::milliseconds limit);
  void join();
  // Waits at most `limit` for the thread to end and joins it; false (thread detached) if it did
  // not end in time, e.g. blocked on a peer that is gone. For the process-exit path only.
  bool joinWithin(std::chrono::milliseconds limit);
  bool running() const { return running_; }
  // It stopped for a failure (not a shutdown): a timeout, a lost peer, an abort.
  bool failed() const { return failed_; }

  int32_t id() const { return id_; }
  // Device responses agreed in a round that could not launch them (they waited for the GPU's
  // turn, DeviceTurn): 0 while the set is alone on its process's GPU.
  uint64_t deviceLaunchesDeferred() const { return lane_.deferredLaunches(); }
  // Fixed once start() returns.
  int rank() const { return rank_; }
  int size() const { return size_; }
  const char *backendName() const { return backendName_; }

 private:
  SetEngine(int32_t id, const Knobs &knobs, SetOpHandler *handler);
  void threadMain(const std::function<Parts()> &setup, std::promise<Status> *started);
  void loop();
  // One cycle (cycleMutex_ held, on any thread): takes the queue, negotiates, runs what was
  // agreed. A failure stops the set (stop()) as on its thread. kAgreed: something was agreed
  // (or the queue had new requests); kStopped: the set stopped. `launches`: the cycle may launch
  // device work (it offers for the GPU's turn): the set's thread, or a caller's whose CUDA
  // context drive() keeps.
  enum class Cycle { kNothing, kAgreed, kStopped };
  Cycle runCycle(bool launches);
  Cycle cycle(bool launches);
  void fail(const Error &e);
  // Group::interrupt and Backend::interrupt, while the planes live (any thread).
  void interruptPlanes(const Status &why);
  // The watch saw another rank declare a failure: stop here too (the watch's thread).
  void peerFailed(int rank, const std::string &what);
  // Runs agreed responses, in order: plans the fusion groups, and for each resolves this rank's
  // part (resolve), tells the observers it starts, runs it on the CPU or hands it to the device
  // lane, and (the CPU's at once, the lane's once the device has run it) completes it.
  void execute(const std::vector<const Response *> &responses);
  // A fused group as this rank runs it.
  struct GroupRun {
    ObservedOp op;  // its requests, their places in the set's sequence
    std::vector<const Response *> members;    // one per request
    std::vector<PendingMap::iterator> owned;  // this rank's own requests among them, to finish
    std::vector<RequestPtr> standIns;         // this rank has joined: it takes part without data
  };
  // Every member of `group` takes its place in the set's sequence of operations; this rank takes
  // part with its pending request, or a stand-in where it has joined, or not at all in an op
  // that failed without it (absent). Empty requests: nothing to run here.
  GroupRun resolve(const FusionGroup &group, const std::vector<const Response *> &responses);
  // The group's work on the CPU executor (or, for the set ops, the handler). Throws Error.
  void runOnCpu(const Response &first, const GroupRun &run);
  // The group ended with `status` on this rank: observed, completed, observed completed.
  void conclude(GroupRun &run, const Status &status);
  // Completes these pending requests (a fused group's, found by execute()) with `status`, and
  // drops them from pending_: the other entries' iterators stay valid.
  void finish(const std::vector<PendingMap::iterator> &owned, const Status &status);
  // Releases the names of these requests (out of pending_ already), settles and wakes them.
  void complete(std::vector<RequestPtr> &requests, const Status &status);
  void stop(const Status &why);
  // Ranks with data in `response`: the set's size minus the ranks that joined.
  int contributors(const Response &response) const {
    return size_ - static_cast<int>(response.joined.size());
  }

  const int32_t id_;
  const Knobs knobs_;
  SetOpHandler *const handler_;
  TensorQueue queue_;
  std::thread thread_;
  std::promise<void> exited_;  // set as the thread's last act
  std::shared_future<void> exitedFuture_ = exited_.get_future().share();
  std::atomic<bool> running_{false};
  std::atomic<bool> failed_{false};
  int rank_ = 0;
  int size_ = 1;
  const char *backendName_ = "";

  // Whoever runs a cycle holds this: the set's thread, or a thread in drive() in its place.
  std::mutex cycleMutex_;
  // abort(): raised once; whoever runs the set's next cycle (or the one it interrupts) stops the
  // set with its status.
  Interrupt aborted_;
  // Guards planesLive_ and, while it is true, calls into parts_.group and parts_.backend from
  // threads that do not hold cycleMutex_ (abort's interrupts); teardown clears it first.
  std::mutex planesMutex_;
  bool planesLive_ = false;
  // Written under cycleMutex_, read by the set's thread between cycles without it (hence
  // atomic): requests are under negotiation, or handed over.
  std::atomic<bool> busy_{false};
  bool callerCycles_ = false;  // drive() may run cycles (fixed before start() returns)
  bool socketFree_ = false;

  // Created and destroyed on the set's thread; used by whichever thread holds cycleMutex_.
  Parts parts_;
  std::unique_ptr<ControlPlane> negotiation_;  // the group's plane, AND through the backend if it can
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<Executor> executor_;
  int64_t opSeq_ = 0;  // responses executed: the same sequence on every member
  int64_t negotiations_ = 0;  // negotiations entered: the same sequence on every member
  std::unique_ptr<StallWatch> watch_;  // made with the controller
  // The stall watch, the timeline (Parts::timeline) and the flight recorder (Parts::flight),
  // whichever the set has; filled before start() returns.
  OpObservers observers_;
  // CUDA tensors' work: the executor, the GPU's turn, the device ops in flight. Lives as long as
  // the engine (submit() may still ask it after the thread ended); set up with the other parts,
  // closed at teardown.
  DeviceLane lane_{id_, queue_};
  PendingMap pending_;
  std::vector<RequestPtr> fresh_;  // a cycle's new requests, from the queue
  std::vector<const Response *> order_;  // a cycle's responses, in order
  std::vector<RequestPtr> finished_;  // finish()'s, kept for their capacity
  std::vector<std::string_view> finishedNames_;
};

}  // namespace hora
