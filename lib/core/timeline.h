// SPDX-License-Identifier: Apache-2.0
// The timeline: a Chrome-trace JSON file per rank (chrome://tracing, ui.perfetto.dev) with every
// tensor's phases and every fused operation's size and bandwidth. tools/hora-timeline-merge puts
// the ranks' files into one, on one clock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace hora {

// Who writes the file, for its metadata: the merge tool aligns ranks on `syncUs`, the
// CLOCK_MONOTONIC time at which this rank left the world's start-up barrier.
struct TimelineOrigin {
  int rank = 0;
  int size = 1;
  std::string host;
  int64_t syncUs = 0;
};

// Recording costs the engine thread a clock read and a push under a mutex; a writer thread
// formats and writes in the background, so the file adds no work to the collectives themselves.
class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Timeline(TimelineOrigin origin) : origin_(std::move(origin)) {}
  ~Timeline() { stop(); }
  Timeline(const Timeline &) = delete;
  Timeline &operator=(const Timeline &) = delete;

  // This rank's file for `path`: "{rank}" in it is replaced by the rank; otherwise `path` itself
  // in a world of one, and ".rank<R>" before its extension in a larger one
  // (trace.json -> trace.rank1.json).
  static std::string rankPath(const std::string &path, int rank, int size);

  // Any thread. Starts writing to rankPath(path) (a running timeline is stopped first). Throws
  // Error(HORA_ERR_INVALID_ARGUMENT) naming the file when it cannot be created.
  void start(const std::string &path);
  // Any thread. Writes what was recorded, closes the file (a complete JSON array). Idempotent.
  void stop();
  bool active() const { return active_.load(std::memory_order_relaxed); }
  std::string path() const;

  // Engine threads. One phase of one tensor of process set `set`, on that tensor's row.
  void tensorPhase(int32_t set, const std::string &tensor, const char *phase, Clock::time_point begin,
                   Clock::time_point end);
  // One backend operation of process set `set` on the set's engine row: `tensors` tensors,
  // `bytes` bytes per rank; the bandwidth is bytes / duration. `algorithm` (static text, or
  // nullptr): how the backend ran it, from Backend::lastAlgorithm.
  void operation(int32_t set, const char *op, int tensors, int64_t bytes, Clock::time_point begin,
                 Clock::time_point end, const char *algorithm = nullptr);
  // A step inside an operation (fusion copy in, collective, copy out) on the engine row.
  void step(int32_t set, const char *what, Clock::time_point begin, Clock::time_point end);

 private:
  struct Event {
    uint32_t row;
    const char *name;  // static text
    int64_t beginNs, endNs;
    int64_t bytes;     // -1: not an operation
    int32_t tensors;
    const char *algorithm = nullptr;  // static text
  };
  void stopLocked();  // startStop_ held
  uint32_t rowLocked(int32_t set, const std::string &label);
  void record(Event e);
  void writerMain();
  void flush(std::vector<Event> &events, std::vector<std::pair<uint32_t, std::string>> &rows);

  const TimelineOrigin origin_;
  std::atomic<bool> active_{false};
  // This mutex protects: file_, path_, events_, newRows_, rows_, stopping_, writer_.
  mutable std::mutex mutex_;
  std::condition_variable wake_;  // with mutex_: the writer thread waits for events or stopping_
  FILE *file_ = nullptr;
  std::string path_;
  std::vector<Event> events_;
  std::vector<std::pair<uint32_t, std::string>> newRows_;  // rows not named in the file yet
  std::map<std::pair<int32_t, std::string>, uint32_t> rows_;
  bool stopping_ = false;
  std::thread writer_;
  std::mutex startStop_;  // serialises start() and stop(): one file open at a time
};

}  // namespace hora
