// SPDX-License-Identifier: Apache-2.0
// How the engine learns that its device work has finished, without host functions on the stream.
// Each op ends with an event from a pool; one thread per executor waits on the oldest event (a
// short spin, then cudaEventSynchronize on a blocking-sync event, which sleeps) and wakes the
// engine; the engine also asks the events itself whenever it is awake, so a finished op never
// waits for that thread. A cudaLaunchHostFunc instead stalls the stream until CUDA's callback
// thread has run it (tens of microseconds per op on an H100 at 64 MiB and above) and is reported
// to hold back other streams, which is the overlap of communication with backward compute.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "backends/nccl/device_api.h"

namespace hora::gpu {

// An event of the pool while someone holds it: the engine until it has retired the op, the
// completion thread until it has seen the event complete, and each request whose caller made a
// stream wait on it. get() is the EventHandle; the last holder gives it back to the pool (or
// destroys it once the pool is closed).
using EventRef = std::shared_ptr<void>;

class Completions {
 public:
  struct Hooks {
    std::function<void()> wake;              // any thread, cheap
    std::function<void(uint64_t)> finished;  // any thread: tickets up to this one are done
  };
  // `spin`: how long the thread asks an event before it sleeps on it (an op that ends within it
  // is seen at once; one that ends later costs the OS's wake-up).
  Completions(DeviceApi &api, int device, Hooks hooks, std::chrono::nanoseconds spin);
  // Stops the thread once the events it watches have completed (bounded: 10 s, then it is left
  // behind with a warning), and closes the pool.
  ~Completions();
  Completions(const Completions &) = delete;
  Completions &operator=(const Completions &) = delete;

  // Engine thread: an event to record at the end of an op (from the pool, or a new one).
  EventRef take();
  // Engine thread: the op of `ticket` (1, 2, ... in order) ends at `event`, recorded already.
  void watch(uint64_t ticket, EventRef event);
  // The highest ticket the thread has seen finished (0: none).
  uint64_t done() const;
  // Why the thread stopped watching (a CUDA error from an event), "" while it watches.
  std::string failure() const;
  // Waits at most `wait` for done() >= ticket or a failure.
  void waitFor(uint64_t ticket, std::chrono::nanoseconds wait) const;
  // From now on the hooks are not called (their owner goes).
  void unhook();
  // Events made so far, and those in the pool now (tests).
  int created() const;
  int pooled() const;

 private:
  struct State;
  static void run(const std::shared_ptr<State> &state);
  std::shared_ptr<State> state_;
};

}  // namespace hora::gpu
