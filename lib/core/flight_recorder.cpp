// SPDX-License-Identifier: Apache-2.0
#include "core/flight_recorder.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>

#include "base/error.h"
#include "base/json.h"
#include "base/logging.h"
#include "core/stall_watch.h"
#include "core/timeline.h"

namespace hora {
namespace {

int gSignalPipe[2] = {-1, -1};

// Terminating signals (onFatalSignal). Lock-free atomics only: the handler reads and writes them.
std::atomic<int> gFatalSignal{0};  // the first one that arrived, 0: none
std::atomic<int> gWatchers{0};     // recorder threads that read gSignalPipe
std::atomic<int> gOwnerPid{0};     // the process they run in (a forked child has none of them)
// "hora: rank R received " for the handler's own line; length 0: no runtime (say nothing).
char gLinePrefix[64];
std::atomic<size_t> gLinePrefixLength{0};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<size_t>::is_always_lock_free,
              "a signal handler may only touch lock-free atomics");

const char *signalName(int signo) {
  switch (signo) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    default: return "a terminating signal";
  }
}

// Async-signal-safe from here to the end of this namespace.
void writeAll(const char *text, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(STDERR_FILENO, text, n);
    if (k <= 0) {
      if (k < 0 && errno == EINTR) continue;
      return;
    }
    text += k;
    n -= static_cast<size_t>(k);
  }
}

void writeText(const char *text) {
  size_t n = 0;
  while (text[n] != '\0') ++n;
  writeAll(text, n);
}

// The process ends of `signo` as if hora had never handled it: default action, unblocked, raised.
[[noreturn]] void raiseDefault(int signo) {
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(signo, &action, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signo);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);  // this thread's mask, on Linux
  raise(signo);
  _exit(128 + signo);  // not reached: the default action of signo ends the process
}

// The handler's own line, when no recorder thread can write the file.
void sayFatal(int signo, const char *tail) {
  const size_t n = gLinePrefixLength.load();
  if (n == 0) return;  // hora is not running: stay silent, as the default action would be
  writeAll(gLinePrefix, n);
  writeText(signalName(signo));
  writeText("; under mpirun this usually means another rank exited or died; ");
  writeText(tail);
  writeText("\n");
}

// The bound on the recorder thread (onFatalSignal arms it).
void onFallbackAlarm(int) {
  const int signo = gFatalSignal.load();
  sayFatal(signo, "the flight recorder did not finish in time, so no file");
  raiseDefault(signo != 0 ? signo : SIGTERM);
}

const char *stateName(uint8_t state) {
  static const char *const kNames[] = {"submitted", "running", "done", "failed", "not submitted"};
  return state < 5 ? kNames[state] : "?";
}

// `path` named for the job: every "{job}" replaced by the job id; without one, the id goes
// before "{rank}" ("f.{rank}.json": "f.<job>.{rank}.json"), else before the name's extension
// ("f.json": "f.<job>.json"). Files of different jobs then never overwrite or mix with each other.
// `path` with "{job}" where the job goes: as given, or put before "{rank}" (or the extension).
std::string jobTemplate(std::string path) {
  if (path.find("{job}") == std::string::npos) {
    const size_t slash = path.rfind('/');
    const size_t rank = path.find("{rank}");
    const size_t dot = path.rfind('.');
    if (rank != std::string::npos) {
      path.insert(rank, "{job}.");
    } else if (dot != std::string::npos && (slash == std::string::npos || dot > slash + 1)) {
      path.insert(dot, ".{job}");
    } else {
      path += ".{job}";
    }
  }
  return path;
}

std::string jobPath(std::string path, const std::string &job) {
  if (job.empty()) return path;
  path = jobTemplate(std::move(path));
  for (size_t at = path.find("{job}"); at != std::string::npos; at = path.find("{job}", at)) {
    path.replace(at, 5, job);
    at += job.size();
  }
  return path;
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

size_t pruneFlightFiles(const std::string &path, const std::string &job, size_t keep) {
  const std::string pattern = jobTemplate(path);
  const size_t slash = pattern.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : pattern.substr(0, slash);
  const std::string base = slash == std::string::npos ? pattern : pattern.substr(slash + 1);
  const size_t at = base.find("{job}"), rankAt = base.find("{rank}");
  // Only files this recorder can tell apart by job: P{job}M{rank}S in the file's own name.
  if (keep == 0 || at == std::string::npos || rankAt == std::string::npos || rankAt < at ||
      base.find('/') != std::string::npos) {
    return 0;
  }
  const std::string prefix = base.substr(0, at), middle = base.substr(at + 5, rankAt - at - 5),
                    suffix = base.substr(rankAt + 6);
  struct Job {
    std::vector<std::string> files;
    time_t newest = 0;
  };
  std::map<std::string, Job> jobs;
  DIR *d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (dirent *entry = readdir(d)) {
    const std::string name = entry->d_name;
    if (name.size() <= prefix.size() + middle.size() + suffix.size() ||
        name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    std::string inner = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    size_t digits = inner.size();
    while (digits > 0 && inner[digits - 1] >= '0' && inner[digits - 1] <= '9') --digits;
    if (digits == inner.size() || digits < middle.size() + 1 ||
        inner.compare(digits - middle.size(), middle.size(), middle) != 0) {
      continue;
    }
    const std::string id = inner.substr(0, digits - middle.size());
    if (id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
        std::string::npos) {
      continue;
    }
    struct stat st {};
    const std::string full = dir + "/" + name;
    if (stat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    Job &j = jobs[id];
    j.files.push_back(full);
    j.newest = std::max(j.newest, st.st_mtime);
  }
  closedir(d);
  if (jobs.size() <= keep) return 0;
  std::vector<std::pair<time_t, std::string>> order;  // newest first; this job always stays
  for (const auto &entry : jobs) {
    order.push_back({entry.first == job ? std::numeric_limits<time_t>::max() : entry.second.newest,
                     entry.first});
  }
  std::sort(order.begin(), order.end(), std::greater<>());
  size_t removed = 0;
  for (size_t i = keep; i < order.size(); ++i) {
    for (const std::string &file : jobs[order[i].second].files) {
      if (std::remove(file.c_str()) == 0) ++removed;
    }
  }
  return removed;
}

FlightRecorder::FlightRecorder(size_t capacity, std::string path, FlightOrigin origin,
                               size_t keepJobs)
    : capacity_(path.empty() ? 0 : capacity),
      template_(origin.job.empty() ? std::string() : path),
      keepJobs_(keepJobs),
      path_(Timeline::rankPath(jobPath(path, origin.job), origin.rank, origin.size)),
      origin_(std::move(origin)),
      start_(Clock::now()),
      startUnixUs_(std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count()),
      ring_(capacity_) {
  // The handler's line names this rank (written before any handler can read it: the length last).
  const std::string prefix = "hora: rank " + std::to_string(origin_.rank) + " received ";
  gLinePrefixLength.store(0);
  std::memcpy(gLinePrefix, prefix.data(), std::min(prefix.size(), sizeof gLinePrefix));
  gOwnerPid.store(static_cast<int>(getpid()));
  gLinePrefixLength.store(std::min(prefix.size(), sizeof gLinePrefix));
  if (capacity_ == 0) return;
  makeSignalPipe();
  if (gSignalPipe[0] >= 0 && pipe2(stopPipe_, O_CLOEXEC) == 0) {
    watcher_ = std::thread([this] { watchSignals(); });
    gWatchers.fetch_add(1);
  }
}

FlightRecorder::~FlightRecorder() {
  gLinePrefixLength.store(0);
  if (watcher_.joinable()) {
    gWatchers.fetch_sub(1);
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
      if (const int signo = gFatalSignal.load(); signo != 0) dieOf(signo);
      StallWatch::wakeAll();  // the stall reports of SIGUSR1 at once, not at the next tick
      dump("SIGUSR1");
    }
  }
}

void FlightRecorder::onFatalSignal(int signo) {
  const int saved = errno;
  // A child forked after hora_init (a data loader's worker) is not a rank: no line, no file
  // (the pipe is its parent's), just the default action.
  if (static_cast<int>(getpid()) != gOwnerPid.load()) raiseDefault(signo);
  int first = 0;
  if (!gFatalSignal.compare_exchange_strong(first, signo)) {
    // A second one while the first is handled (an impatient user, or the launcher again): the
    // file is being written or never will be; end now.
    raiseDefault(first);
  }
  const char byte = 2;
  if (gWatchers.load() > 0 && gSignalPipe[1] >= 0 && ::write(gSignalPipe[1], &byte, 1) == 1) {
    // The recorder's thread takes it from here; bound it with SIGALRM, unless the program uses
    // SIGALRM itself (then a second signal, or the launcher's SIGKILL, is the bound).
    struct sigaction current {};
    if (sigaction(SIGALRM, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
        (current.sa_flags & SA_SIGINFO) == 0) {
      struct sigaction action {};
      action.sa_handler = onFallbackAlarm;
      sigemptyset(&action.sa_mask);
      sigaction(SIGALRM, &action, nullptr);
      alarm(kFatalFallbackS);
    }
    errno = saved;
    return;
  }
  sayFatal(signo, "no flight recorder file (HORA_FLIGHT_RECORDER=off)");
  raiseDefault(signo);
}

void FlightRecorder::dieOf(int signo) {
  const char *name = signalName(signo);
  std::string why;
  const std::string path = writeFile(
      std::string(name) + ": the process was told to end (under mpirun: another rank exited or "
      "died, and mpirun ended the job)", &why);
  const std::string line =
      "hora: rank " + std::to_string(origin_.rank) + " received " + name + " (pid " +
      std::to_string(getpid()) + "); under mpirun this usually means another rank exited or " +
      "died; " + (path.empty() ? "no flight recorder file (" + why + ")"
                               : "flight recorder written to " + path) + "\n";
  writeAll(line.data(), line.size());
  raiseDefault(signo);
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
  // Version 1 still: the job fields were added, nothing changed meaning.
  out += "{\"hora_flight_recorder\":{\"version\":1,\"rank\":" + std::to_string(origin_.rank) +
         ",\"size\":" + std::to_string(origin_.size) + ",\"host\":" + jsonQuoted(origin_.host) +
         ",\"job\":" + jsonQuoted(origin_.job) + ",\"job_source\":" +
         jsonQuoted(origin_.jobSource) + ",\"run\":" + jsonQuoted(origin_.run) +
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

std::string FlightRecorder::writeFile(const std::string &reason, std::string *why) {
  if (capacity_ == 0) {
    *why = "HORA_FLIGHT_RECORDER=off";
    return "";
  }
  const std::string text = json(reason);
  const std::string temporary = path_ + ".tmp" + std::to_string(getpid());
  FILE *f = std::fopen(temporary.c_str(), "w");
  bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  if (ok) ok = std::rename(temporary.c_str(), path_.c_str()) == 0;
  if (!ok) {
    *why = "cannot write " + path_ + ": " + std::strerror(errno);
    std::remove(temporary.c_str());
    return "";
  }
  if (!template_.empty() && keepJobs_ > 0) {
    const size_t removed = pruneFlightFiles(template_, origin_.job, keepJobs_);
    if (removed > 0) {
      HORA_LOG(kDebug) << "flight recorder: removed " << removed << " files of jobs older than the "
                       << keepJobs_ << " newest (HORA_FLIGHT_RECORDER_KEEP)";
    }
  }
  return path_;
}

std::string FlightRecorder::dump(const std::string &reason) {
  if (capacity_ == 0) return "";
  std::string why;
  if (writeFile(reason, &why).empty()) {
    HORA_LOG(kWarning) << "flight recorder: " << why;
    return "";
  }
  HORA_LOG(kWarning) << "flight recorder: the last operations of rank " << origin_.rank
                     << " are in " << path_ << " (" << reason
                     << "); tools/hora-flight-check compares the ranks' files";
  return path_;
}

}  // namespace hora
