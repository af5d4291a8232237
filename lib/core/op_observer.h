// SPDX-License-Identifier: Apache-2.0
// What a process set's engine tells those who watch its requests and operations: the stall
// watch, the timeline and the flight recorder, behind one interface and one composite.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <hora/hora.h>

#include "base/error.h"
#include "core/message.h"
#include "core/request.h"

namespace hora {

class Backend;
class FlightRecorder;
class StallWatch;
class Timeline;

// One fused group's operation as the observers see it, from started() to finished(): for a
// device op that is cycles later, when the device lane completes it.
struct ObservedOp {
  using Clock = std::chrono::steady_clock;  // the timeline's and the flight recorder's
  OpType op = OpType::kAllreduce;
  std::string name;                 // the group's first response's
  std::vector<Request *> requests;  // this rank's and a joined rank's stand-ins, in the group's order
  std::vector<int64_t> seqs;        // each one's place in the set's sequence of operations
  Clock::time_point began{};        // the timeline's start of it (zero: not traced)
};

// Every event has an empty default; an observer overrides those it records. The set's cycles call
// them (on whichever thread runs one, cycleMutex_ held), except submitted() and refused(), which
// come from any thread.
class OpObserver {
 public:
  virtual ~OpObserver() = default;

  // Any thread: `request` was submitted to the set (the flight recorder's record: its flightId).
  virtual void submitted(Request & /*request*/) {}
  // Any thread: the queue refused the request whose record is `flightId` (a duplicate name, a
  // stopped set); the request itself is gone with the refusal.
  virtual void refused(uint64_t /*flightId*/, hora_status_t /*status*/) {}
  // A cycle took these requests from the queue.
  virtual void dequeued(const std::vector<RequestPtr> & /*requests*/) {}
  // Entering the set's `negotiation`-th negotiation (the same sequence on every member).
  virtual void negotiating(int64_t /*negotiation*/) {}
  // The set's `seq`-th operation is one this rank never submitted (HORA_STALL_SHUTDOWN_S failed
  // it on the ranks that did).
  virtual void absent(const Response & /*response*/, int64_t /*seq*/) {}
  // HORA_STALL_SHUTDOWN_S failed an operation on every rank: the moment to keep this rank's past.
  virtual void stallShutdown(const std::string & /*why*/) {}
  // `op` starts (its responses: `members`, one per request); an observer may note its start in it.
  virtual void started(ObservedOp & /*op*/, const std::vector<const Response *> & /*members*/) {}
  // `op` ended with `status`; its requests are not completed yet.
  virtual void finished(const ObservedOp & /*op*/, const Status & /*status*/) {}
  // `op` succeeded and its requests are completed.
  virtual void completed(const ObservedOp & /*op*/) {}
  // Between cycles.
  virtual void idle() {}
  // `request` completes with `status` outside any operation (the set stopped before running it).
  virtual void dropped(const Request & /*request*/, hora_status_t /*status*/) {}
  // The set stops on this rank for a failure (not a shutdown), before its requests complete.
  virtual void failed(const Status & /*why*/) {}
  // The set stopped (a shutdown or a failure) and every request it held has completed.
  virtual void stopped(const Status & /*why*/) {}
};

// The set's observers, told in the order they were added. Filled on the set's thread before any
// submission and not changed afterwards, so that any thread may call it.
class OpObservers final : public OpObserver {
 public:
  void add(std::unique_ptr<OpObserver> observer) { observers_.push_back(std::move(observer)); }

  void submitted(Request &request) override;
  void refused(uint64_t flightId, hora_status_t status) override;
  void dequeued(const std::vector<RequestPtr> &requests) override;
  void negotiating(int64_t negotiation) override;
  void absent(const Response &response, int64_t seq) override;
  void stallShutdown(const std::string &why) override;
  void started(ObservedOp &op, const std::vector<const Response *> &members) override;
  void finished(const ObservedOp &op, const Status &status) override;
  void completed(const ObservedOp &op) override;
  void idle() override;
  void dropped(const Request &request, hora_status_t status) override;
  void failed(const Status &why) override;
  void stopped(const Status &why) override;

 private:
  std::vector<std::unique_ptr<OpObserver>> observers_;
};

// The stall watch: what this rank is doing (negotiating, running an operation, idle), the last
// operation it completed, and a failure, said on the group's presence channel.
std::unique_ptr<OpObserver> watchObserver(StallWatch &watch);
// The timeline of process set `set`: each request's wait in the queue and in negotiation, and
// each operation on its tensors' rows and the set's, with the backend's algorithm.
std::unique_ptr<OpObserver> timelineObserver(Timeline &timeline, int32_t set, const Backend &backend);
// The flight recorder: every request of process set `set` from submission to its end, and the
// file written when the set fails or a stall shutdown fails an operation.
std::unique_ptr<OpObserver> flightObserver(FlightRecorder &flight, int32_t set);

}  // namespace hora
