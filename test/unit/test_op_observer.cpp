// SPDX-License-Identifier: Apache-2.0
// The set engine's observers: the composite tells each of them every event, in the order they were
// added; the flight recorder's and the timeline's adapters record an operation as the engine did.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/flight_recorder.h"
#include "core/op_observer.h"
#include "text_files.h"

namespace hora {
namespace {

using testing::count;
using testing::tempPath;

// Writes "<tag>:<event>" for each event it is told of.
class Log final : public OpObserver {
 public:
  Log(std::string tag, std::vector<std::string> *out) : tag_(std::move(tag)), out_(out) {}
  void submitted(Request &) override { say("submitted"); }
  void refused(uint64_t, hora_status_t) override { say("refused"); }
  void dequeued(const std::vector<RequestPtr> &) override { say("dequeued"); }
  void negotiating(int64_t) override { say("negotiating"); }
  void absent(const Response &, int64_t) override { say("absent"); }
  void stallShutdown(const std::string &) override { say("stallShutdown"); }
  void started(ObservedOp &, const std::vector<const Response *> &) override { say("started"); }
  void finished(const ObservedOp &, const Status &) override { say("finished"); }
  void completed(const ObservedOp &) override { say("completed"); }
  void idle() override { say("idle"); }
  void dropped(const Request &, hora_status_t) override { say("dropped"); }
  void failed(const Status &) override { say("failed"); }
  void stopped(const Status &) override { say("stopped"); }

 private:
  void say(const char *event) { out_->push_back(tag_ + ":" + event); }
  const std::string tag_;
  std::vector<std::string> *out_;
};

Response response(const std::string &name) {
  Response r;
  r.agreed.name = name;
  r.agreed.op = OpType::kAllreduce;
  r.agreed.dtype = DType::kFloat32;
  r.agreed.shapes = {{4}};
  return r;
}

TEST(OpObservers, TellsEveryObserverEveryEventInTheOrderAdded) {
  std::vector<std::string> log;
  OpObservers all;
  all.add(std::make_unique<Log>("a", &log));
  all.add(std::make_unique<Log>("b", &log));
  const Response resp = response("t");
  RequestPtr request = Request::standIn(resp, 0);
  ObservedOp op;
  op.requests = {request.get()};
  op.seqs = {1};
  const std::vector<const Response *> members = {&resp};
  all.submitted(*request);
  all.refused(0, HORA_ERR_DUPLICATE_NAME);
  all.dequeued({request});
  all.negotiating(1);
  all.absent(resp, 1);
  all.stallShutdown("why");
  all.started(op, members);
  all.finished(op, Status::success());
  all.completed(op);
  all.idle();
  all.dropped(*request, HORA_ERR_SHUT_DOWN);
  all.failed(Status{HORA_ERR_PEER_LOST, "lost"});
  all.stopped(Status{HORA_ERR_PEER_LOST, "lost"});
  const std::vector<std::string> events = {"submitted", "refused",  "dequeued",      "negotiating",
                                           "absent",    "stallShutdown", "started", "finished",
                                           "completed", "idle",     "dropped",       "failed",
                                           "stopped"};
  ASSERT_EQ(log.size(), 2 * events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(log[2 * i], "a:" + events[i]);
    EXPECT_EQ(log[2 * i + 1], "b:" + events[i]);
  }
}

TEST(OpObservers, WithoutObserversEveryEventIsANoOp) {
  OpObservers none;
  const Response resp = response("t");
  RequestPtr request = Request::standIn(resp, 0);
  ObservedOp op;
  op.requests = {request.get()};
  op.seqs = {1};
  none.submitted(*request);
  none.started(op, {&resp});
  none.finished(op, Status::success());
  EXPECT_EQ(request->flightId, 0u);
  EXPECT_EQ(op.began.time_since_epoch().count(), 0);
}

TEST(FlightObserver, RecordsAStandInFromItsStartToItsEnd) {
  FlightRecorder flight(8, tempPath("op-observer.json"), FlightOrigin{0, 1, "host"});
  std::unique_ptr<OpObserver> observer = flightObserver(flight, 3);
  const Response resp = response("grad");
  RequestPtr standIn = Request::standIn(resp, 3);
  ObservedOp op;
  op.op = OpType::kAllreduce;
  op.name = "grad";
  op.requests = {standIn.get()};
  op.seqs = {7};
  observer->started(op, {&resp});
  EXPECT_NE(standIn->flightId, 0u);  // a stand-in's record starts with its operation
  observer->finished(op, Status::success());
  const std::string json = flight.json("test");
  EXPECT_NE(json.find("\"seq\":7,\"name\":\"grad\",\"op\":\"allreduce\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"state\":\"done\""), std::string::npos) << json;
  EXPECT_EQ(count(json, "\"id\":"), 1u) << json;
}

}  // namespace
}  // namespace hora
