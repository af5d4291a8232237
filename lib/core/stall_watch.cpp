// SPDX-License-Identifier: Apache-2.0
// StallWatch: a rank's state on the presence channel, and the report of who is missing.
#include "core/stall_watch.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/logging.h"
#include "base/process.h"
#include "core/controller.h"

namespace hora {
namespace {

// Every live watch, for wakeAll(). Never destroyed: a watch may go at exit.
std::mutex &watchesMutex() {
  static auto *m = new std::mutex();
  return *m;
}
std::set<StallWatch *> &watches() {
  static auto *s = new std::set<StallWatch *>();  // guarded by watchesMutex()
  return *s;
}

int64_t wallMsNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

// Names may hold anything; the wire form is tab-separated, one line.
std::string clean(std::string_view text) {
  std::string out(text);
  std::replace(out.begin(), out.end(), '\t', ' ');
  std::replace(out.begin(), out.end(), '\n', ' ');
  return out;
}

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

std::string doing(const StallWatch::State &s) {
  switch (s.phase) {
    case 'n': return "negotiating cycle " + std::to_string(s.cycle);
    case 'r': return "running " + s.what + " #" + std::to_string(s.seq);
    case 'f': return s.what;  // "forming process set 3: connecting the gloo mesh"
    case 'x': return "stopped: " + s.what;
    default: return "idle after cycle " + std::to_string(s.cycle);
  }
}

// When a rank in phase 'x' failed, wall clock ms: its word is said again every tick.
int64_t failedAtMs(const StallWatch::State &s) {
  return s.wallMs - static_cast<int64_t>(s.forS * 1000.0);
}

std::string lastDone(const StallWatch::State &s) {
  return "last completed " + (s.last.empty() ? std::string("nothing yet") : s.last);
}

}  // namespace

StallWatch::StallWatch(int32_t set, int rank, int size, Presence *presence, double warnS,
                       double timeoutS, std::function<void(int, const std::string &)> peerFailed)
    : set_(set), rank_(rank), size_(size), presence_(presence), warnS_(warnS),
      tickS_(std::clamp(std::min(warnS > 0 ? warnS : timeoutS, timeoutS) / 4, 0.05, 1.0)),
      peerFailed_(std::move(peerFailed)),
      host_(hostName()) {
  if (size_ > 1) thread_ = std::thread([this] { loop(); });
  std::lock_guard<std::mutex> lock(watchesMutex());
  watches().insert(this);
}

StallWatch::~StallWatch() {
  {
    std::lock_guard<std::mutex> lock(watchesMutex());
    watches().erase(this);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StallWatch::wakeAll() {
  std::lock_guard<std::mutex> lock(watchesMutex());
  for (StallWatch *w : watches()) {
    {
      std::lock_guard<std::mutex> state(w->mutex_);
      w->woken_ = true;
    }
    w->wake_.notify_all();
  }
}

void StallWatch::negotiating(int64_t cycle) {
  std::lock_guard<std::mutex> lock(mutex_);
  cycle_ = cycle;
  phase_ = 'n';
  since_ = Clock::now();
}

void StallWatch::running(const char *op, std::string_view name, int64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  phase_ = 'r';
  seq_ = seq;
  what_.assign(op);
  what_.append(" '").append(name).append("'");
  since_ = Clock::now();
}

void StallWatch::completed(const char *op, std::string_view name, int64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  last_.assign(op);
  last_.append(" '").append(name).append("' #").append(std::to_string(seq));
}

void StallWatch::failed(const std::string &why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    phase_ = 'x';
    // Long enough for the cause and who it names; a peer quotes it in its own message.
    what_ = why.size() > 600 ? why.substr(0, 600) + "..." : why;
    since_ = Clock::now();
    failurePending_ = true;
  }
  wake_.notify_all();
}

void StallWatch::idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ == 'i') return;
  phase_ = 'i';
  since_ = Clock::now();
}

StallWatch::State StallWatch::snapshot() {
  std::lock_guard<std::mutex> lock(mutex_);
  State s;
  s.wallMs = wallMsNow();
  s.cycle = cycle_;
  s.phase = phase_;
  s.seq = seq_;
  s.forS = std::chrono::duration<double>(Clock::now() - since_).count();
  s.what = what_;
  s.last = last_;
  s.pid = static_cast<long>(getpid());
  s.host = host_;
  return s;
}

std::string StallWatch::encode(const State &s) {
  std::ostringstream out;
  out << s.wallMs << '\t' << s.cycle << '\t' << s.phase << '\t' << s.seq << '\t' << s.forS << '\t'
      << clean(s.what) << '\t' << clean(s.last) << '\t' << s.pid << '\t' << clean(s.host);
  return out.str();
}

bool StallWatch::decode(const std::string &line, State *s) {
  std::vector<std::string> f;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, '\t')) f.push_back(field);
  if (!line.empty() && line.back() == '\t') f.emplace_back();
  if ((f.size() != 7 && f.size() != 9) || f[2].size() != 1) return false;
  char *end = nullptr;
  s->wallMs = std::strtoll(f[0].c_str(), &end, 10);
  s->cycle = std::strtoll(f[1].c_str(), &end, 10);
  s->phase = f[2][0];
  s->seq = std::strtoll(f[3].c_str(), &end, 10);
  s->forS = std::strtod(f[4].c_str(), &end);
  s->what = f[5];
  s->last = f[6];
  if (f.size() == 9) {
    s->pid = std::strtol(f[7].c_str(), &end, 10);
    s->host = f[8];
  }
  return true;
}

bool StallWatch::together(const State &peer, const State &mine) {
  return peer.cycle == mine.cycle && peer.phase == mine.phase &&
         (mine.phase != 'r' || peer.seq == mine.seq);
}

std::string StallWatch::describe(int rank, const State *peer, const State &mine, int64_t nowMs,
                                 double silentS) {
  const std::string who = "rank " + std::to_string(rank);
  if (peer == nullptr) return who + " (never heard from: not started, stopped, hung or dead)";
  const double age = std::max<int64_t>(0, nowMs - peer->wallMs) / 1000.0;
  if (peer->phase == 'f') {
    // A rank says each phase of forming once, as it enters it: its age is how long it has been
    // there, not silence.
    std::string out = who + " (" + peer->what + ", entered " + seconds(age) + " ago";
    if (peer->pid > 0 && !peer->host.empty() && peer->host == hostName() && processGone(peer->pid)) {
      out += "; its process, pid " + std::to_string(peer->pid) + ", has exited";
    }
    return out + ")";
  }
  if (peer->phase == 'x') {
    // Why it stopped (its watch repeats it until the set is gone: the time is the failure's).
    return who + " (stopped " + seconds(std::max<int64_t>(0, nowMs - failedAtMs(*peer)) / 1000.0) +
           " ago: " + peer->what + ")";
  }
  if (age > silentS) {
    return who + " (silent for " + seconds(age) + ": stopped, hung or dead; last seen " +
           doing(*peer) + ", " + lastDone(*peer) + ")";
  }
  std::string where = doing(*peer);
  if (peer->phase == 'i') {
    where += ": has not submitted what the others wait for";
  } else if (peer->phase == 'n' && peer->cycle < mine.cycle) {
    where += ", behind";
  } else if (peer->phase == 'r') {
    where += " for " + seconds(peer->forS);
  }
  return who + " (alive, " + where + "; " + lastDone(*peer) + ")";
}

std::string StallWatch::absentees(const State &mine, std::vector<std::string> *lines) {
  const int64_t now = wallMsNow();
  const double silentS = std::max(3 * tickS_, 1.0) + tickS_;
  std::string out;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    State peer;
    const bool known = r < static_cast<int>(lines->size()) && decode((*lines)[static_cast<size_t>(r)], &peer);
    const bool silent = known && std::max<int64_t>(0, now - peer.wallMs) / 1000.0 > silentS;
    if (known && !silent && together(peer, mine)) continue;
    if (!out.empty()) out += "; ";
    out += describe(r, known ? &peer : nullptr, mine, now, silentS);
  }
  return out;
}

bool StallWatch::collectNow(std::vector<std::string> *lines) {
  {
    // The thread may be in a slow word to a store that is gone: then what it collected last.
    std::unique_lock<std::mutex> lock(presenceMutex_, std::try_to_lock);
    const auto giveUp = Clock::now() + kPresenceWait;
    while (!lock.owns_lock() && Clock::now() < giveUp) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      lock.try_lock();
    }
    if (lock.owns_lock()) {
      try {
        *lines = presence_->collect();
        return true;
      } catch (const std::exception &) {
      }
    }
  }
  std::lock_guard<std::mutex> state(mutex_);
  *lines = lastLines_;
  return false;
}

std::string StallWatch::missing() {
  if (presence_ == nullptr || size_ <= 1) return "";
  const State mine = snapshot();
  std::vector<std::string> lines;
  if (!collectNow(&lines) && lines.empty()) return "";
  return absentees(mine, &lines);
}

std::string StallWatch::firstFailure() {
  if (presence_ == nullptr || size_ <= 1) return "";
  // The peer that failed first says so a moment after it failed (its watch thread), and closes
  // its connections only after that; but a rank two hops away can see a connection close while
  // the word is still on its way. So look a few times, briefly, before naming nobody.
  int first = -1;
  State earliest;
  const auto giveUp = Clock::now() + kFailureWait;
  for (bool again = true; again && first < 0;) {
    std::vector<std::string> lines;
    const bool collected = collectNow(&lines);
    for (int r = 0; r < size_ && r < static_cast<int>(lines.size()); ++r) {
      State peer;
      if (r == rank_ || !decode(lines[static_cast<size_t>(r)], &peer) || peer.phase != 'x') continue;
      if (first < 0 || failedAtMs(peer) < failedAtMs(earliest)) {
        first = r;
        earliest = peer;
      }
    }
    again = collected && Clock::now() < giveUp;
    if (first < 0 && again) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (first < 0) return "";
  const double before = std::max<int64_t>(0, wallMsNow() - failedAtMs(earliest)) / 1000.0;
  return "rank " + std::to_string(first) + " failed first, " + seconds(before) +
         " before this rank: " + earliest.what;
}

std::string StallWatch::presenceLost() {
  std::lock_guard<std::mutex> lock(mutex_);
  return presenceLost_;
}

std::string StallWatch::lostPeer() {
  if (presence_ == nullptr || size_ <= 1) return "";
  std::vector<std::string> lines;
  {
    std::unique_lock<std::mutex> lock(presenceMutex_, std::try_to_lock);
    if (!lock.owns_lock()) return "";  // the watch thread is talking: next time
    try {
      lines = presence_->collect();
    } catch (const std::exception &) {
      return "";
    }
  }
  for (int r = 0; r < size_ && r < static_cast<int>(lines.size()); ++r) {
    State peer;
    if (r == rank_ || !decode(lines[static_cast<size_t>(r)], &peer)) continue;
    if (peer.pid > 0 && !peer.host.empty() && peer.host == host_ && processGone(peer.pid)) {
      return "rank " + std::to_string(r) + " (pid " + std::to_string(peer.pid) +
             " on this host) exited";
    }
  }
  return "";
}

void StallWatch::loop() {
  pthread_setname_np(pthread_self(), "hora-watch");
  std::unique_lock<std::mutex> lock(mutex_);
  // A report repeats every warnS_ while this rank stays stuck (in one wait or the next).
  Clock::time_point reported{};
  bool presenceWorks = presence_ != nullptr;
  Clock::time_point woke = Clock::now();
  reportsSeen_ = stallReportRequests().load();
  for (bool first = true;; first = false) {
    if (!first && !failurePending_ && !stop_ && !woken_) {
      wake_.wait_for(lock, std::chrono::duration<double>(tickS_),
                     [this] { return stop_ || failurePending_ || woken_; });
    }
    woken_ = false;
    // Stopping: only a failure not yet said goes out (the peers name it in their errors).
    const bool stopping = stop_;
    if (stopping && !failurePending_) return;
    const bool failing = failurePending_;
    failurePending_ = false;
    lock.unlock();
    // A process that was stopped (SIGSTOP) or starved sees every wait as long when it runs
    // again: say so instead of blaming the peers, and give them a warning interval.
    const Clock::time_point now = Clock::now();
    const double gap = std::chrono::duration<double>(now - woke).count();
    woke = now;
    if (!first && !failing && gap > tickS_ + 1.0) {
      HORA_LOG(kWarning) << "rank " << rank_ << " of process set " << set_ << " did not run for "
                         << seconds(gap - tickS_) << " (stopped, e.g. SIGSTOP, or starved of CPU)";
      reported = now;
    }
    const State mine = snapshot();
    const uint32_t requests = stallReportRequests().load();
    const bool asked = !stopping && requests != reportsSeen_;  // SIGUSR1, whatever this rank does
    reportsSeen_ = requests;
    const bool due = asked || (!stopping && warnS_ > 0 && mine.phase != 'i' && mine.phase != 'x' &&
                               mine.forS >= warnS_ &&
                               std::chrono::duration<double>(now - reported).count() >= warnS_);
    std::string who;
    if (presenceWorks) {
      std::lock_guard<std::mutex> guard(presenceMutex_);
      try {
        presence_->publish(encode(mine));
        if (failing) presence_->declareFailure(std::to_string(rank_) + "\t" + encode(mine));
        if (!failing && !stopping && mine.phase != 'x' && peerFailed_ && !peerFailureSeen_) {
          // One look a tick: did another rank of the set stop for a failure?
          const std::string word = presence_->declaredFailure();
          const size_t tab = word.find('\t');
          State peer;
          if (tab != std::string::npos && decode(word.substr(tab + 1), &peer)) {
            const int who = std::atoi(word.c_str());
            if (who != rank_) {
              peerFailureSeen_ = true;
              peerFailed_(who, peer.what);
            }
          }
        }
        if (due) {
          std::vector<std::string> lines = presence_->collect();
          who = absentees(mine, &lines);
          std::lock_guard<std::mutex> state(mutex_);
          lastLines_ = std::move(lines);
        }
      } catch (const std::exception &e) {
        // The channel is gone (the store with rank 0, or a store that no longer answers): the
        // reports say so from now on.
        presenceWorks = false;
        const Error *error = dynamic_cast<const Error *>(&e);
        const std::string why = error != nullptr ? error->message() : e.what();
        {
          std::lock_guard<std::mutex> state(mutex_);
          presenceLost_ = why;
        }
        HORA_LOG(kDebug) << "process set " << set_ << ": presence channel lost: " << why;
      }
    }
    if (due) {
      reported = now;
      std::string head = "stall: rank " + std::to_string(rank_) + " of process set " +
                         std::to_string(set_) + " has waited " + seconds(mine.forS) + " " +
                         doing(mine) + (asked ? " (SIGUSR1); " : " (HORA_STALL_WARNING_S); ");
      if (asked && mine.phase == 'i') {
        head = "stall report (SIGUSR1): rank " + std::to_string(rank_) + " of process set " +
               std::to_string(set_) + " is " + doing(mine) + " (" + lastDone(mine) + "); ";
      }
      if (!presenceWorks) {
        HORA_LOG(kWarning) << head << "which ranks are missing is unknown: "
                           << (presence_ == nullptr
                                   ? std::string("no presence channel (MPI below MPI_THREAD_MULTIPLE)")
                                   : "the presence channel failed: " + presenceLost());
      } else if (!who.empty()) {
        HORA_LOG(kWarning) << head << "not taking part: " << who << "; this rank " << lastDone(mine);
      } else if (asked) {
        HORA_LOG(kWarning) << head << "every other rank is where this one is";
      }
    }
    lock.lock();
    if (stopping) return;
  }
}

}  // namespace hora
