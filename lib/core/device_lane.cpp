// SPDX-License-Identifier: Apache-2.0
// DeviceLane: a set's device work waits for the GPU's turn, is launched one NCCL group per
// execute(), and is completed as the executor's poll() reports it done.
#include "core/device_lane.h"

#include "base/logging.h"
#include "core/forming.h"
#include "core/op_table.h"

namespace hora {

void DeviceLane::setUp(Parts parts) {
  parts_ = std::move(parts);
  if (parts_.turn != nullptr) turn_ = parts_.turn;
}

void DeviceLane::close() {
  turn_->leave(set_);
  waker_->detach();
  device_.reset();
}

void DeviceLane::admit(const Request &request) {
  const Device device = request.msg().device;
  int first = -1;
  if (cudaDevice_.compare_exchange_strong(first, device.id)) {
    turn_->uses(set_);
  } else if (first != device.id) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, opTypeName(request.msg().op), " '", request.name(),
               "': on cuda:", device.id, ", but this rank's CUDA tensors in process set ", set_,
               " are on cuda:", first, "; one GPU per rank and process set");
  }
}

bool DeviceLane::offer(bool workPending) {
  // Device work runs only while this set holds the GPU's turn on every member (DeviceTurn).
  // Offered only with device work already agreed: every member has it, so every member is in this
  // round at once and the turn is held briefly (docs/gpu.md).
  // A set alone on its process's GPU offers whenever it has work pending: the round that agrees
  // device work then launches it (DeviceTurn::offerAlone).
  return !awaiting_.empty() ? turn_->offer(set_)
                            : workPending && cudaDevice_.load() >= 0 && turn_->offerAlone(set_);
}

void DeviceLane::await(std::shared_ptr<const Response> response, PendingMap &pending) {
  Awaiting waiting{std::move(response), nullptr};
  if (auto it = pending.find(waiting.response->agreed.name); it != pending.end()) {
    waiting.request = std::move(it->second);
    pending.erase(it);
  }
  awaiting_.push_back(std::move(waiting));
  ++agreedThisRound_;
}

void DeviceLane::launchAwaiting(PendingMap &pending,
                                const std::function<void(const std::vector<const Response *> &)> &execute) {
  for (Awaiting &a : awaiting_) {
    if (a.request) {
      const std::string_view name = a.request->name();
      pending.emplace(name, std::move(a.request));
    }
  }
  std::vector<const Response *> order;
  order.reserve(awaiting_.size());
  for (const Awaiting &a : awaiting_) order.push_back(a.response.get());
  execute(order);  // the responses live in awaiting_ until it returns
  awaiting_.clear();
}

void DeviceLane::endRound(bool offered, bool launched) {
  if (!launched) deferredLaunches_ += agreedThisRound_;
  agreedThisRound_ = 0;
  if (offered) turn_->settle(set_, launched && device_ ? device_->queued() : 0);
  if (awaiting_.empty()) {
    turn_->stopWaiting(set_);
  } else {
    std::shared_ptr<Waker> waker = waker_;
    turn_->wait(set_, [waker] { waker->kick(); });
  }
}

void DeviceLane::beginExecute() {
  cycleOpen_ = false;
  opsBefore_ = ops_.size();
  ends_.clear();
}

void DeviceLane::endExecute() {
  if (!cycleOpen_) return;
  cycleOpen_ = false;
  device_->endCycle();
  // Launched: a stream-ordered wait may go on now.
  for (size_t i = 0; i < ends_.size(); ++i) {
    for (const RequestPtr &r : ops_[opsBefore_ + i].owned) r->launched(ends_[i]);
  }
  ends_.clear();
}

void DeviceLane::launch(ObservedOp &op, const std::vector<const Response *> &members,
                        const std::vector<PendingMap::iterator> &owned, PendingMap &pending,
                        std::vector<RequestPtr> &standIns) {
  run(op.requests, members);
  // Staged: launched with the rest of this execute()'s device ops at endExecute(), completed by
  // completeFinished() once the device has run it.
  ends_.push_back(device_->lastEnd());
  DeviceOp queued;
  queued.ticket = device_->queued();
  for (PendingMap::iterator it : owned) {
    queued.owned.push_back(std::move(it->second));
    pending.erase(it);
  }
  queued.standIns = std::move(standIns);
  queued.op = std::move(op);
  ops_.push_back(std::move(queued));
  inFlight_ = true;
}

void DeviceLane::run(const std::vector<Request *> &requests, const std::vector<const Response *> &members) {
  const Response &first = *members.front();
  if (!device_) open();
  const OpSpec &spec = opSpec(first.agreed.op);
  if (spec.runDevice == nullptr) {
    HORA_THROW(HORA_ERR_INTERNAL, spec.name, " '", first.agreed.name, "' on a device");
  }
  if (!cycleOpen_) {
    device_->beginCycle();
    cycleOpen_ = true;
  }
  const int contributors = parts_.size - static_cast<int>(first.joined.size());
  spec.runDevice(OpRun{requests, members, nullptr, device_.get(), parts_.handler, contributors});
}

void DeviceLane::open() {
  // This rank's GPU: its tensors' (admit() keeps them on one). A rank that joined before its
  // first CUDA op has none and takes its local rank's, recorded first: a later submission on
  // another GPU is then refused by admit(), as for any rank, instead of running on this one.
  int device = cudaDevice_.load();
  if (device < 0) {
    const int chosen = parts_.fabric->defaultDevice(parts_.localRank);
    device = -1;
    device = cudaDevice_.compare_exchange_strong(device, chosen) ? chosen : device;
  }
  turn_->uses(set_);
  DeviceHooks hooks;
  hooks.wake = [queue = &queue_] { queue->kick(); };
  hooks.lostPeer = parts_.lostPeer;
  // The end of this set's device work gives the GPU's turn back, even while the engine waits
  // in a negotiation (the turn outlives the executor: the process's, or the test's).
  hooks.finished = [turn = turn_, id = set_](uint64_t ticket) { turn->finished(id, ticket); };
  hooks.seed = std::move(parts_.seed);
  FormingScope forming("process set " + std::to_string(set_));
  formingPhase(*parts_.group, "starting NCCL on cuda:" + std::to_string(device), [&] {
    device_ = parts_.fabric->deviceExecutor(parts_.group->control(), device, std::move(hooks));
  });
}

bool DeviceLane::completeFinished() {
  if (ops_.empty()) return false;
  const size_t before = ops_.size();
  const uint64_t done = device_->poll();
  std::vector<DeviceOp> finished;
  while (!ops_.empty() && ops_.front().ticket <= done) {
    finished.push_back(std::move(ops_.front()));
    ops_.pop_front();
  }
  inFlight_ = !ops_.empty();
  for (DeviceOp &op : finished) finish(op, Status::success());
  return ops_.size() != before;
}

void DeviceLane::finish(DeviceOp &op, const Status &status) {
  parts_.observer->finished(op.op, status);
  Status mine = status;
  const std::string prefix = std::string(opSpec(op.op.op).name) + " '" + op.op.name + "': ";
  if (!status.ok() && status.message.compare(0, prefix.size(), prefix) != 0) {
    mine.message = prefix + status.message;
  }
  parts_.complete(op.owned, mine);
  if (status.ok()) parts_.observer->completed(op.op);
}

void DeviceLane::stop(const Status &why) {
  agreedThisRound_ = 0;
  if (!ops_.empty()) settleOps(why);
  leaveTurn(why);
}

void DeviceLane::settleOps(const Status &why) {
  if (why.code == HORA_ERR_SHUT_DOWN) {
    try {
      device_->drain(parts_.drainS);
    } catch (const Error &e) {
      HORA_LOG(kWarning) << "process set " << set_ << ": device work at shutdown: " << e.message();
    }
  }
  uint64_t done = 0;
  try {
    done = device_->poll();
  } catch (const Error &) {  // aborted already: nothing more finishes
  }
  if (done < device_->queued()) device_->abort(why.message);
  for (DeviceOp &op : ops_) finish(op, op.ticket <= done ? Status::success() : why);
  ops_.clear();
  inFlight_ = false;
}

void DeviceLane::leaveTurn(const Status &why) {
  turn_->leave(set_);
  // Agreed but never launched: every member fails them alike.
  for (Awaiting &a : awaiting_) {
    if (!a.request) continue;
    Status s = why;
    s.message = std::string(opTypeName(a.request->msg().op)) + " '" + a.request->name() + "': " + why.message;
    parts_.observer->dropped(*a.request, s.code);
    a.request->complete(std::move(s));
  }
  awaiting_.clear();
}

}  // namespace hora
