// SPDX-License-Identifier: Apache-2.0
// The set engine's observers: the stall watch, the timeline and the flight recorder, each told of
// its requests and operations through OpObserver, and the composite that tells them all.
#include "core/op_observer.h"

#include "core/backend.h"
#include "core/flight_recorder.h"
#include "core/op_table.h"
#include "core/stall_watch.h"
#include "core/timeline.h"

namespace hora {

void OpObservers::submitted(Request &request) {
  for (auto &o : observers_) o->submitted(request);
}
void OpObservers::refused(uint64_t flightId, hora_status_t status) {
  for (auto &o : observers_) o->refused(flightId, status);
}
void OpObservers::dequeued(const std::vector<RequestPtr> &requests) {
  for (auto &o : observers_) o->dequeued(requests);
}
void OpObservers::negotiating(int64_t negotiation) {
  for (auto &o : observers_) o->negotiating(negotiation);
}
void OpObservers::absent(const Response &response, int64_t seq) {
  for (auto &o : observers_) o->absent(response, seq);
}
void OpObservers::stallShutdown(const std::string &why) {
  for (auto &o : observers_) o->stallShutdown(why);
}
void OpObservers::started(ObservedOp &op, const std::vector<const Response *> &members) {
  for (auto &o : observers_) o->started(op, members);
}
void OpObservers::finished(const ObservedOp &op, const Status &status) {
  for (auto &o : observers_) o->finished(op, status);
}
void OpObservers::completed(const ObservedOp &op) {
  for (auto &o : observers_) o->completed(op);
}
void OpObservers::idle() {
  for (auto &o : observers_) o->idle();
}
void OpObservers::dropped(const Request &request, hora_status_t status) {
  for (auto &o : observers_) o->dropped(request, status);
}
void OpObservers::failed(const Status &why) {
  for (auto &o : observers_) o->failed(why);
}
void OpObservers::stopped(const Status &why) {
  for (auto &o : observers_) o->stopped(why);
}

namespace {

class WatchObserver final : public OpObserver {
 public:
  explicit WatchObserver(StallWatch &watch) : watch_(watch) {}
  void negotiating(int64_t negotiation) override { watch_.negotiating(negotiation); }
  void started(ObservedOp &op, const std::vector<const Response *> &) override {
    watch_.running(opSpec(op.op).name, op.name, op.seqs.front());
  }
  void completed(const ObservedOp &op) override {
    watch_.completed(opSpec(op.op).name, op.name, op.seqs.back());
  }
  void idle() override { watch_.idle(); }
  void failed(const Status &why) override { watch_.failed(why.message); }

 private:
  StallWatch &watch_;
};

class TimelineObserver final : public OpObserver {
 public:
  TimelineObserver(Timeline &timeline, int32_t set, const Backend &backend)
      : timeline_(timeline), set_(set), backend_(backend) {}

  void dequeued(const std::vector<RequestPtr> &requests) override {
    if (!timeline_.active()) return;
    const Timeline::Clock::time_point now = Timeline::Clock::now();
    for (const RequestPtr &r : requests) r->dequeued = now;
  }
  void started(ObservedOp &op, const std::vector<const Response *> &) override {
    op.began = timeline_.active() ? Timeline::Clock::now() : Timeline::Clock::time_point{};
  }
  void finished(const ObservedOp &op, const Status &) override {
    if (timeline_.active() && op.began.time_since_epoch().count() != 0) trace(op);
  }

 private:
  // Each request's wait in the queue and in negotiation (until every rank had submitted it) on
  // its tensor's row, the operation on each row and on the engine's, with its size and bandwidth.
  void trace(const ObservedOp &observed) {
    const Timeline::Clock::time_point ended = Timeline::Clock::now();
    const Timeline::Clock::time_point began = observed.began;
    const char *op = opSpec(observed.op).timelineName;
    int tensors = 0;
    int64_t bytes = 0;
    for (Request *r : observed.requests) {
      tensors += static_cast<int>(r->tensors().size());
      bytes += r->bytes();
      if (r->isStandIn()) continue;
      if (r->dequeued.time_since_epoch().count() != 0) {  // submitted while the timeline ran
        timeline_.tensorPhase(set_, r->name(), "QUEUED", r->submitted(), r->dequeued);
        timeline_.tensorPhase(set_, r->name(), "NEGOTIATE", r->dequeued, began);
      }
      timeline_.tensorPhase(set_, r->name(), op, began, ended);
    }
    timeline_.operation(set_, op, tensors, bytes, began, ended, backend_.lastAlgorithm());
  }

  Timeline &timeline_;
  const int32_t set_;
  const Backend &backend_;
};

class FlightObserver final : public OpObserver {
 public:
  FlightObserver(FlightRecorder &flight, int32_t set) : flight_(flight), set_(set) {}

  void submitted(Request &request) override {
    request.flightId = flight_.submitted(set_, request.msg(), request.bytes(), request.submitted());
  }
  void refused(uint64_t flightId, hora_status_t status) override { flight_.finished(flightId, status); }
  void absent(const Response &response, int64_t seq) override { flight_.absent(set_, response.agreed, seq); }
  void stallShutdown(const std::string &why) override { flight_.dump(why); }
  void started(ObservedOp &op, const std::vector<const Response *> &members) override {
    const FlightRecorder::Clock::time_point now = FlightRecorder::Clock::now();
    for (size_t i = 0; i < op.requests.size(); ++i) {
      Request *r = op.requests[i];
      if (r->isStandIn()) r->flightId = flight_.submitted(set_, members[i]->agreed, r->bytes(), now);
      flight_.started(r->flightId, op.seqs[i], now);
    }
  }
  void finished(const ObservedOp &op, const Status &status) override {
    const FlightRecorder::Clock::time_point now = FlightRecorder::Clock::now();
    for (Request *r : op.requests) flight_.finished(r->flightId, status.code, now);
  }
  void dropped(const Request &request, hora_status_t status) override {
    flight_.finished(request.flightId, status);
  }
  void stopped(const Status &why) override {
    if (why.code != HORA_ERR_SHUT_DOWN) {
      flight_.dump("process set " + std::to_string(set_) + " stopped: " + why.message);
    }
  }

 private:
  FlightRecorder &flight_;
  const int32_t set_;
};

}  // namespace

std::unique_ptr<OpObserver> watchObserver(StallWatch &watch) {
  return std::make_unique<WatchObserver>(watch);
}

std::unique_ptr<OpObserver> timelineObserver(Timeline &timeline, int32_t set, const Backend &backend) {
  return std::make_unique<TimelineObserver>(timeline, set, backend);
}

std::unique_ptr<OpObserver> flightObserver(FlightRecorder &flight, int32_t set) {
  return std::make_unique<FlightObserver>(flight, set);
}

}  // namespace hora
