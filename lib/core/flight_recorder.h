// SPDX-License-Identifier: Apache-2.0
// The flight recorder: this rank's last N operations (submitted, negotiated as the set's n-th
// operation, running, done or failed, with times) in a ring, written to a JSON file when
// something goes wrong (a timeout, a lost peer, a backend error) or on SIGUSR1.
// tools/hora-flight-check reads every rank's file and names the first operation where the ranks
// diverge.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <hora/hora.h>

#include "core/message.h"

namespace hora {

struct FlightOrigin {
  FlightOrigin(int rank_ = 0, int size_ = 1, std::string host_ = "")
      : rank(rank_), size(size_), host(std::move(host_)) {}
  int rank;
  int size;
  std::string host;
  // The job, the same on every rank of one job and different between jobs, so that files of
  // several jobs in one directory are told apart ("{job}" in the path; "job" in the file): the
  // launcher's job id where there is one, else `run`. jobSource says which. Empty (a recorder
  // made outside a runtime): the path is used as given.
  std::string job;
  std::string jobSource;
  std::string run;  // a random id rank 0 drew at start, the same on every rank of this run
};

// Files of flight recorders written to `path` (HORA_FLIGHT_RECORDER: "{job}" put in as the
// recorder does, and "{rank}") by the jobs before this one: in the file's directory, the files
// whose names fit the pattern are grouped by job, and those of all but the `keep` jobs with the
// newest files (and `job`, always kept) are removed. Returns how many were. Nothing is removed
// where the pattern does not put both in the file's name, or keep is 0.
size_t pruneFlightFiles(const std::string &path, const std::string &job, size_t keep);

// Recording is a few stores under a mutex per request; nothing is written until a dump.
class FlightRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // capacity 0: records nothing, dumps nothing. `path` may hold "{rank}" (see Timeline::rankPath).
  // keepJobs > 0: each file written removes the files of all but the newest keepJobs jobs in its
  // directory (pruneFlightFiles), this job's always kept.
  FlightRecorder(size_t capacity, std::string path, FlightOrigin origin, size_t keepJobs = 0);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder &) = delete;
  FlightRecorder &operator=(const FlightRecorder &) = delete;

  // Any thread: a request of process set `set` was submitted. Returns its record's id, 0 when
  // the recorder is off. Ids of records the ring has since overwritten are ignored below.
  // `at`: when (the request's own submission time, so that the hot path reads the clock once).
  uint64_t submitted(int32_t set, const RequestMsg &msg, int64_t bytes, Clock::time_point at);
  uint64_t submitted(int32_t set, const RequestMsg &msg, int64_t bytes) {
    return submitted(set, msg, bytes, Clock::now());
  }
  // The set's cycles: negotiated as the set's `seq`-th operation (the same on every
  // member), running from `at` (one clock reading for a fused group's members).
  void started(uint64_t id, int64_t seq, Clock::time_point at);
  void started(uint64_t id, int64_t seq) { started(id, seq, Clock::now()); }
  void finished(uint64_t id, hora_status_t status, Clock::time_point at);
  void finished(uint64_t id, hora_status_t status) { finished(id, status, Clock::now()); }
  // The set's cycles: the set's `seq`-th operation is one this rank never submitted
  // (HORA_STALL_SHUTDOWN_S failed it on the ranks that did).
  void absent(int32_t set, const RequestMsg &msg, int64_t seq);

  // Any thread. Writes this rank's file (atomically: a temporary file, then rename) and logs
  // where; returns the path, "" when the recorder is off or the file could not be written.
  std::string dump(const std::string &reason);
  // dump() without the log line: the path, or "" with *why set.
  std::string writeFile(const std::string &reason, std::string *why);
  // The file's contents.
  std::string json(const std::string &reason) const;
  std::string path() const { return path_; }

  // Process-wide: the SIGUSR1 handler writes a byte to signalWriteFd() and every recorder dumps
  // (from a thread of its own, so a dump works while the engine is stuck inside a collective).
  // makeSignalPipe() runs before the handler is installed; the fd is -1 if it failed.
  static void makeSignalPipe();
  static int signalWriteFd();

  // Process-wide: the handler of a terminating signal (SIGTERM, SIGINT, SIGHUP) that the program
  // left at its default. Async-signal-safe: it wakes a recorder's thread, which writes the file,
  // prints one line on stderr and ends the process with the same signal (default action, raised
  // again), so the exit status is what it would have been. With no recorder thread (the recorder
  // off, or hora shut down) it prints the line itself and re-raises at once; a second
  // terminating signal, or kFatalFallbackS seconds without the thread finishing, does too.
  static void onFatalSignal(int signo);
  static constexpr unsigned kFatalFallbackS = 2;

 private:
  enum class State : uint8_t { kSubmitted, kRunning, kDone, kFailed, kNotSubmitted };
  struct Record {
    uint64_t id = 0;  // 0: empty slot
    int32_t set = 0;
    int64_t seq = -1;  // -1: not negotiated (yet)
    std::string name;
    OpType op = OpType::kAllreduce;
    DType dtype = DType::kFloat32;
    int64_t bytes = 0;
    State state = State::kSubmitted;
    hora_status_t status = HORA_SUCCESS;
    Clock::time_point submittedAt, startedAt, endedAt;
  };
  Record *slotLocked(uint64_t id);  // nullptr if overwritten
  void watchSignals();
  [[noreturn]] void dieOf(int signo);  // the watcher, on a terminating signal

  const size_t capacity_;
  const std::string template_;  // the configured path (for pruning); "" outside a job
  const size_t keepJobs_;
  const std::string path_;  // this rank's file
  const FlightOrigin origin_;
  const Clock::time_point start_;
  const int64_t startUnixUs_;
  // This mutex protects: ring_, nextId_.
  mutable std::mutex mutex_;
  std::vector<Record> ring_;
  uint64_t nextId_ = 1;
  int stopPipe_[2] = {-1, -1};  // the destructor wakes the watcher through it
  std::thread watcher_;
};

}  // namespace hora
