// SPDX-License-Identifier: Apache-2.0
#include "core/flight_recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "base/error.h"
#include "base/json.h"
#include "base/logging.h"
#include "core/timeline.h"

namespace hora {
namespace {

int gSignalPipe[2] = {-1, -1};

const char *stateName(uint8_t state) {
  static const char *const kNames[] = {"submitted", "running", "done", "failed", "not submitted"};
  return state < 5 ? kNames[state] : "?";
}

int64_t microsSince(FlightRecorder::Clock::time_point origin, FlightRecorder::Clock::time_point t) {
  if (t.time_since_epoch().count() == 0) return -1;
  return std::chrono::duration_cast<std::chrono::microseconds>(t - origin).count();
}

}  // namespace

void FlightRecorder::makeSignalPipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (pipe2(gSignalPipe, O_CLOEXEC | O_NONBLOCK) != 0) gSignalPipe[0] = gSignalPipe[1] = -1;
  });
}

int FlightRecorder::signalWriteFd() { return gSignalPipe[1]; }

FlightRecorder::FlightRecorder(size_t capacity, std::string path, FlightOrigin origin)
    : capacity_(path.empty() ? 0 : capacity),
      path_(Timeline::rankPath(path, origin.rank, origin.size)),
      origin_(std::move(origin)),
      start_(Clock::now()),
      startUnixUs_(std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count()),
      ring_(capacity_) {
  if (capacity_ == 0) return;
  makeSignalPipe();
  if (gSignalPipe[0] >= 0 && pipe2(stopPipe_, O_CLOEXEC) == 0) {
    watcher_ = std::thread([this] { watchSignals(); });
  }
}

FlightRecorder::~FlightRecorder() {
  if (watcher_.joinable()) {
    const char byte = 0;
    if (write(stopPipe_[1], &byte, 1) != 1) {
      HORA_LOG(kWarning) << "flight recorder: cannot stop its signal watcher";
    }
    watcher_.join();
  }
  for (int fd : stopPipe_) {
    if (fd >= 0) close(fd);
  }
}

void FlightRecorder::watchSignals() {
  pollfd fds[2] = {{gSignalPipe[0], POLLIN, 0}, {stopPipe_[0], POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if ((fds[1].revents & (POLLIN | POLLHUP)) != 0) return;
    if ((fds[0].revents & POLLIN) != 0) {
      char drain[64];
      while (read(gSignalPipe[0], drain, sizeof drain) > 0) {
      }
      dump("SIGUSR1");
    }
  }
}

FlightRecorder::Record *FlightRecorder::slotLocked(uint64_t id) {
  if (id == 0) return nullptr;
  Record &r = ring_[(id - 1) % capacity_];
  return r.id == id ? &r : nullptr;
}

uint64_t FlightRecorder::submitted(int32_t set, const RequestMsg &msg, int64_t bytes,
                                   Clock::time_point now) {
  if (capacity_ == 0) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = nextId_++;
  Record &r = ring_[(id - 1) % capacity_];
  r.id = id;
  r.set = set;
  r.seq = -1;
  r.name = msg.name;
  r.op = msg.op;
  r.dtype = msg.dtype;
  r.bytes = bytes;
  r.state = State::kSubmitted;
  r.status = HORA_SUCCESS;
  r.submittedAt = now;
  r.startedAt = r.endedAt = Clock::time_point{};
  return id;
}

void FlightRecorder::started(uint64_t id, int64_t seq, Clock::time_point now) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (Record *r = slotLocked(id)) {
    r->seq = seq;
    r->state = State::kRunning;
    r->startedAt = now;
  }
}

void FlightRecorder::finished(uint64_t id, hora_status_t status, Clock::time_point now) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (Record *r = slotLocked(id)) {
    r->state = status == HORA_SUCCESS ? State::kDone : State::kFailed;
    r->status = status;
    r->endedAt = now;
  }
}

void FlightRecorder::absent(int32_t set, const RequestMsg &msg, int64_t seq) {
  if (capacity_ == 0) return;
  int64_t elements = 0;  // of the shapes the other ranks agreed on
  for (const Shape &shape : msg.shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    elements += n;
  }
  const uint64_t id = submitted(set, msg, elements * static_cast<int64_t>(dtypeSize(msg.dtype)));
  std::lock_guard<std::mutex> lock(mutex_);
  if (Record *r = slotLocked(id)) {
    r->seq = seq;
    r->state = State::kNotSubmitted;
    r->status = HORA_ERR_TIMEOUT;
    r->submittedAt = Clock::time_point{};
  }
}

std::string FlightRecorder::json(const std::string &reason) const {
  std::string out;
  out += "{\"hora_flight_recorder\":{\"version\":1,\"rank\":" + std::to_string(origin_.rank) +
         ",\"size\":" + std::to_string(origin_.size) + ",\"host\":" + jsonQuoted(origin_.host) +
         ",\"pid\":" + std::to_string(getpid()) + ",\"reason\":" + jsonQuoted(reason) +
         ",\"capacity\":" + std::to_string(capacity_) +
         ",\"start_unix_us\":" + std::to_string(startUnixUs_) +
         ",\"dumped_us\":" + std::to_string(microsSince(start_, Clock::now())) + ",\"ops\":[";
  std::lock_guard<std::mutex> lock(mutex_);
  // oldest first: the ring's slots from the one after the newest
  const uint64_t newest = nextId_ - 1;
  const uint64_t oldest = newest > capacity_ ? newest - capacity_ + 1 : 1;
  bool first = true;
  for (uint64_t id = oldest; id <= newest; ++id) {
    const Record &r = ring_[(id - 1) % capacity_];
    if (r.id != id) continue;
    out += first ? "\n" : ",\n";
    first = false;
    out += "{\"id\":" + std::to_string(r.id) + ",\"set\":" + std::to_string(r.set) +
           ",\"seq\":" + std::to_string(r.seq) + ",\"name\":" + jsonQuoted(r.name) +
           ",\"op\":\"" + opTypeName(r.op) + "\",\"dtype\":\"" + dtypeName(r.dtype) +
           "\",\"bytes\":" + std::to_string(r.bytes) + ",\"state\":\"" +
           stateName(static_cast<uint8_t>(r.state)) + "\",\"status\":" +
           jsonQuoted(statusString(r.status)) +
           ",\"submitted_us\":" + std::to_string(microsSince(start_, r.submittedAt)) +
           ",\"started_us\":" + std::to_string(microsSince(start_, r.startedAt)) +
           ",\"ended_us\":" + std::to_string(microsSince(start_, r.endedAt)) + "}";
  }
  out += "\n]}}\n";
  return out;
}

std::string FlightRecorder::dump(const std::string &reason) {
  if (capacity_ == 0) return "";
  const std::string text = json(reason);
  const std::string temporary = path_ + ".tmp" + std::to_string(getpid());
  FILE *f = std::fopen(temporary.c_str(), "w");
  bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  if (ok) ok = std::rename(temporary.c_str(), path_.c_str()) == 0;
  if (!ok) {
    HORA_LOG(kWarning) << "flight recorder: cannot write " << path_ << ": " << std::strerror(errno);
    std::remove(temporary.c_str());
    return "";
  }
  HORA_LOG(kWarning) << "flight recorder: the last operations of rank " << origin_.rank
                     << " are in " << path_ << " (" << reason
                     << "); tools/hora-flight-check compares the ranks' files";
  return path_;
}

}  // namespace hora
