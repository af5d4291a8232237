// SPDX-License-Identifier: Apache-2.0
#include "backends/nccl/completions.h"

#include <pthread.h>
#include <sched.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/logging.h"

namespace hora::gpu {

using Clock = std::chrono::steady_clock;

struct Completions::State {
  State(DeviceApi &api_, int device_, Hooks hooks_, std::chrono::nanoseconds spin_)
      : api(api_), device(device_), spin(spin_), hooks(std::move(hooks_)) {}
  DeviceApi &api;
  const int device;
  const std::chrono::nanoseconds spin;

  // This mutex protects: hooks, watched, done, failure, stopping, exited.
  mutable std::mutex mutex;
  mutable std::condition_variable cv;
  Hooks hooks;
  std::deque<std::pair<uint64_t, EventRef>> watched;
  uint64_t done = 0;
  std::string failure;
  bool stopping = false;
  bool exited = false;

  // Separate, because the last holder of an event gives it back from any thread, under either.
  // This mutex protects: free, closed, created.
  std::mutex poolMutex;
  std::vector<EventHandle> free;
  bool closed = false;
  int created = 0;
};

Completions::Completions(DeviceApi &api, int device, Hooks hooks, std::chrono::nanoseconds spin)
    : state_(std::make_shared<State>(api, device, std::move(hooks), spin)) {
  std::thread([state = state_] { run(state); }).detach();  // joined through `exited` (bounded)
}

Completions::~Completions() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->stopping = true;
  state_->hooks = Hooks{};
  state_->cv.notify_all();
  if (!state_->cv.wait_for(lock, std::chrono::seconds(10), [&] { return state_->exited; })) {
    // Its event never completes (a stream stuck behind a caller's event that never fires): the
    // thread stays, holding the state; the pool is closed when it ends, if ever.
    HORA_LOG(kWarning) << "cuda:" << state_->device << ": device work still unfinished 10 s after its "
                       << "executor went; its completion thread is left waiting";
    return;
  }
  lock.unlock();
  std::lock_guard<std::mutex> pool(state_->poolMutex);
  state_->closed = true;
  for (EventHandle e : state_->free) state_->api.destroyEvent(e);
  state_->free.clear();
}

EventRef Completions::take() {
  EventHandle e = nullptr;
  {
    std::lock_guard<std::mutex> lock(state_->poolMutex);
    if (!state_->free.empty()) {
      e = state_->free.back();
      state_->free.pop_back();
    }
  }
  if (e == nullptr) {
    e = state_->api.createEvent();
    std::lock_guard<std::mutex> lock(state_->poolMutex);
    ++state_->created;
  }
  std::shared_ptr<State> state = state_;
  return EventRef(e, [state](void *event) {
    std::lock_guard<std::mutex> lock(state->poolMutex);
    if (state->closed) {
      state->api.destroyEvent(event);
    } else {
      state->free.push_back(event);
    }
  });
}

void Completions::watch(uint64_t ticket, EventRef event) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->watched.emplace_back(ticket, std::move(event));
  state_->cv.notify_all();
}

uint64_t Completions::done() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}

std::string Completions::failure() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->failure;
}

void Completions::waitFor(uint64_t ticket, std::chrono::nanoseconds wait) const {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->cv.wait_for(lock, wait, [&] { return state_->done >= ticket || !state_->failure.empty(); });
}

void Completions::unhook() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->hooks = Hooks{};
}

int Completions::created() const {
  std::lock_guard<std::mutex> lock(state_->poolMutex);
  return state_->created;
}

int Completions::pooled() const {
  std::lock_guard<std::mutex> lock(state_->poolMutex);
  return static_cast<int>(state_->free.size());
}

void Completions::run(const std::shared_ptr<State> &state) {
  pthread_setname_np(pthread_self(), "hora-cuda-done");
  State &s = *state;
  std::string failure;
  try {
    s.api.setDevice(s.device);
  } catch (const Error &e) {
    failure = e.message();
  }
  std::unique_lock<std::mutex> lock(s.mutex);
  std::vector<EventRef> seen;  // given back outside the lock
  while (failure.empty()) {
    s.cv.wait(lock, [&] { return s.stopping || !s.watched.empty(); });
    if (s.watched.empty()) break;  // stopping, and nothing left to see
    EventRef event = s.watched.front().second;
    lock.unlock();
    // The oldest op: asked for a while (a short op is seen at once), then slept on.
    bool finished = false;
    try {
      const Clock::time_point end = Clock::now() + s.spin;
      finished = s.api.eventDone(event.get());
      while (!finished && Clock::now() < end) {
        sched_yield();
        finished = s.api.eventDone(event.get());
      }
      if (!finished) s.api.synchronizeEvent(event.get());
    } catch (const Error &e) {
      failure = e.message();
    } catch (const std::exception &e) {
      failure = e.what();
    }
    event.reset();
    lock.lock();
    if (!failure.empty()) break;
    // It, and every later one already finished, with one wake for all of them.
    seen.push_back(std::move(s.watched.front().second));
    s.done = s.watched.front().first;
    s.watched.pop_front();
    while (!s.watched.empty()) {
      bool also = false;
      lock.unlock();
      try {
        also = s.api.eventDone(s.watched.front().second.get());
      } catch (const Error &) {  // the next round's synchronize reports it
      }
      lock.lock();
      if (!also) break;
      seen.push_back(std::move(s.watched.front().second));
      s.done = s.watched.front().first;
      s.watched.pop_front();
    }
    const uint64_t done = s.done;
    Hooks hooks = s.hooks;
    s.cv.notify_all();
    lock.unlock();
    seen.clear();
    if (hooks.finished) hooks.finished(done);
    if (hooks.wake) hooks.wake();
    lock.lock();
  }
  if (!failure.empty()) {
    s.failure = failure;
    s.cv.notify_all();
    Hooks hooks = s.hooks;
    lock.unlock();
    if (hooks.wake) hooks.wake();
    lock.lock();
  }
  // Events still watched go back when their other holders drop them.
  std::deque<std::pair<uint64_t, EventRef>> left;
  left.swap(s.watched);
  s.exited = true;
  s.cv.notify_all();
  lock.unlock();
  left.clear();
}

}  // namespace hora::gpu
