// SPDX-License-Identifier: Apache-2.0
// TensorQueue: condition-variable hand-off; the engine sleeps when there is nothing to do, on the
// backend's bell when it waits for peers.
#include "core/tensor_queue.h"

#include <algorithm>

namespace hora {

void TensorQueue::push(RequestPtr request) {
  bool wakeEngine = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) throw Error(closedStatus_.code, closedStatus_.message, __FILE__, __LINE__);
    const std::string_view name(request->name());
    if (!inFlight_.insert(name).second) {
      // Behind a tombstone of the name (and only tombstones), the request waits its turn.
      if (tombstones_.count(name) != 0) {
        auto it = behind_.find(request->name());
        if (it == behind_.end() || it->second.back()->msg().isTombstone()) {
          behind_[request->name()].push_back(std::move(request));
          return;
        }
      }
      const bool behindRefusal = tombstones_.count(name) != 0;
      HORA_THROW(HORA_ERR_DUPLICATE_NAME, opTypeName(request->msg().op), " '", request->name(),
                 "': a request of that name is already in flight on this rank (process set ",
                 request->processSet(),
                 behindRefusal ? ", waiting behind a refused call of that name" : "",
                 "); wait for it before submitting the name again");
    }
    if (request->msg().isTombstone()) tombstones_.insert(name);
    if (queue_.empty()) {
      firstArrival_ = std::chrono::steady_clock::now();
      wakeEngine = waitsForWork_;
    }
    queue_.push_back(std::move(request));
    // Rung under the lock: the engine takes it again when it wakes, so it cannot tear the bell
    // down (with its backend) while this ring is on the way.
    if (onBell_) bell_->ring();
  }
  // Only the first request wakes the engine, and only while it waits for work: behind it, the
  // engine waits out the batch window for flush or shutdown alone, and a wake-up per request
  // would cost a context switch each.
  if (wakeEngine) cv_.notify_one();
}

void TensorQueue::requestFlush() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    flush_ = true;
  }
  cv_.notify_one();
}

void TensorQueue::kick() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    kicked_ = true;
    if (onBell_) bell_->ring();
  }
  cv_.notify_one();
}

void TensorQueue::requestShutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_ = true;
    // Rung under the lock: the engine takes it again when it wakes, so it cannot tear the bell
    // down (with its backend) while this ring is on the way.
    if (onBell_) bell_->ring();
  }
  cv_.notify_one();
}

bool TensorQueue::shutdownRequested() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shutdown_;
}

void TensorQueue::waitForWork(bool busy, std::chrono::steady_clock::time_point busyDeadline,
                              std::chrono::nanoseconds batchWindow) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto wake = [this] { return !queue_.empty() || shutdown_ || kicked_; };
  for (;;) {
    if (busy && bell_ != nullptr) {
      // onBell_ is set under the lock, so a push either came before (wake() sees it) or rings.
      uint32_t ticket = 0;
      if (!wake() && bell_->arm(&ticket)) {
        onBell_ = true;
        waitsForWork_ = true;
        lock.unlock();
        bell_->sleep(ticket, std::max<std::chrono::nanoseconds>(
                                 std::chrono::nanoseconds{0}, busyDeadline - std::chrono::steady_clock::now()));
        lock.lock();
        onBell_ = false;
      }
    } else if (busy) {
      waitsForWork_ = true;
      cv_.wait_until(lock, busyDeadline, wake);
    } else {
      waitsForWork_ = true;
      cv_.wait(lock, wake);
    }
    // The batch window, from the oldest request queued now: a caller thread may take the queue
    // while this thread sleeps, and the requests pushed after that arrived later.
    waitsForWork_ = false;
    while (!queue_.empty() && !flush_ && !shutdown_ && !kicked_ && batchWindow.count() > 0) {
      const std::chrono::steady_clock::time_point deadline = firstArrival_ + batchWindow;
      if (std::chrono::steady_clock::now() >= deadline) break;
      cv_.wait_until(lock, deadline);
    }
    // Not busy, and the queue empty again: a caller thread took it and ran the cycle.
    if (busy || !queue_.empty() || flush_ || shutdown_ || kicked_) break;
  }
  kicked_ = false;
}

void TensorQueue::popAll(std::vector<RequestPtr> &out) {
  out.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  flush_ = false;
  out.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
  queue_.clear();
}

void TensorQueue::release(const std::vector<std::string_view> &names) {
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::string_view name : names) {
      inFlight_.erase(name);
      if (tombstones_.empty() || tombstones_.erase(name) == 0 || behind_.empty()) continue;
      auto it = behind_.find(std::string(name));
      if (it == behind_.end()) continue;
      // The next of the name takes its place: in flight under its own name's view, and queued.
      RequestPtr next = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) behind_.erase(it);
      const std::string_view own(next->name());
      inFlight_.insert(own);
      if (next->msg().isTombstone()) tombstones_.insert(own);
      if (queue_.empty()) firstArrival_ = std::chrono::steady_clock::now();
      queue_.push_back(std::move(next));
      queued = true;
    }
    // The engine thread may be asleep (a caller thread runs this cycle): wake it for the next.
    if (queued && onBell_) bell_->ring();
  }
  if (queued) cv_.notify_one();
}

std::vector<RequestPtr> TensorQueue::close(Status status) {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  closedStatus_ = std::move(status);
  std::vector<RequestPtr> out(std::make_move_iterator(queue_.begin()),
                              std::make_move_iterator(queue_.end()));
  queue_.clear();
  for (auto &kv : behind_) {
    for (RequestPtr &r : kv.second) out.push_back(std::move(r));
  }
  behind_.clear();
  tombstones_.clear();
  inFlight_.clear();
  return out;
}

}  // namespace hora
