// SPDX-License-Identifier: Apache-2.0
// The hand-off from user threads to the engine thread, and the names in flight on this rank.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/request.h"

namespace hora {

class TensorQueue {
 public:
  // Any thread. Throws Error(HORA_ERR_DUPLICATE_NAME) if a request of the same name is in flight
  // in the same process set, or the status the queue was closed with. Behind a tombstone (a
  // request this rank refused, RequestMsg::rejected) a request of its name waits instead, and is
  // queued once the tombstone completes: the other ranks' n-th submission of a name pairs with
  // this rank's n-th, refused or not. Behind tombstones only: a real request of the name in
  // flight or waiting still makes a duplicate.
  void push(RequestPtr request);
  // Any thread: ends the engine's fusion wait early (a user is blocked waiting for results, so
  // holding tensors back for fusion only adds latency).
  void requestFlush();
  // Any thread: asks the engine to shut down.
  void requestShutdown();

  // Engine thread, before any other thread pushes (or nullptr, before the bell goes away): with a
  // bell, the busy wait below sleeps on it, so a peer starting a cycle wakes it too.
  void setBell(PeerBell *bell) {
    std::lock_guard<std::mutex> lock(mutex_);
    bell_ = bell;
  }

  // Engine thread: blocks until there is a cycle to run: a request is queued and either the
  // queue was flushed or `batchWindow` has passed since the oldest queued request arrived (more
  // may come to fuse with it); shutdown is requested; or a caller thread kick()ed. With `busy`
  // set (the engine has requests under negotiation) also returns at `busyDeadline`, or when the
  // bell rings, with nothing queued.
  void waitForWork(bool busy, std::chrono::steady_clock::time_point busyDeadline,
                   std::chrono::nanoseconds batchWindow);
  // Whoever runs the engine's cycle (its thread, or a caller thread in its place): takes every
  // queued request, into `out` (cleared first), and ends a flush.
  void popAll(std::vector<RequestPtr> &out);
  // Any thread: wakes the engine thread for a cycle with or without anything queued (a caller
  // thread ran the cycles and left requests under negotiation for it).
  void kick();
  bool shutdownRequested() const;

  // The set's cycle: the names are free again (call before completing the requests, so a caller
  // woken by a completion can reuse its name at once), or go to the request that waited behind
  // a tombstone of that name, now queued.
  void release(const std::vector<std::string_view> &names);
  // The set's cycle, when stopping: refuse further pushes with `status`, return what was queued
  // or waiting.
  std::vector<RequestPtr> close(Status status);

 private:
  // This mutex protects: bell_ (the engine thread, its only writer, reads it without),
  // queue_, inFlight_, tombstones_, behind_, flush_, kicked_, shutdown_, closed_, closedStatus_,
  // firstArrival_, waitsForWork_, onBell_ (the engine sleeps on the bell: wake it there).
  PeerBell *bell_ = nullptr;
  mutable std::mutex mutex_;
  std::condition_variable cv_;  // with mutex_: the engine waits for work, a flush, a kick or shutdown
  std::deque<RequestPtr> queue_;
  // The names of the requests in queue_ or being negotiated and run: views of each request's own
  // name, which outlives its entry (the engine releases the name before it lets go of the
  // request; close() clears them all). One set per queue, and a queue per process set.
  std::unordered_set<std::string_view> inFlight_;
  // The names in inFlight_ whose request there is a tombstone (views of its name), and the
  // requests waiting behind such a one, by name, oldest first (tombstones, then at most one real
  // request, last). Empty unless this rank refused an op whose name it then submits again
  // before the refusal was negotiated.
  std::unordered_set<std::string_view> tombstones_;
  std::unordered_map<std::string, std::deque<RequestPtr>> behind_;
  bool flush_ = false;
  bool kicked_ = false;
  bool shutdown_ = false;
  bool closed_ = false;
  Status closedStatus_;
  std::chrono::steady_clock::time_point firstArrival_;
  // The engine thread waits for work (idle, or busy until its deadline): a request pushed to an
  // empty queue wakes it. In the batch window, or in a cycle, it is not woken: it wakes at the
  // window's end and then waits on from the oldest request still queued, which is newer if a
  // caller thread took the queue meanwhile (a caller thread that runs the cycles itself wakes
  // nobody).
  bool waitsForWork_ = false;
  bool onBell_ = false;
};

}  // namespace hora
