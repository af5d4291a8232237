// SPDX-License-Identifier: Apache-2.0
// StallWatch: a rank's state on the presence channel, and the report of who is missing.
#include "core/stall_watch.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "base/error.h"
#include "base/logging.h"
#include "base/process.h"

namespace hora {
namespace {

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
    default: return "idle after cycle " + std::to_string(s.cycle);
  }
}

std::string lastDone(const StallWatch::State &s) {
  return "last completed " + (s.last.empty() ? std::string("nothing yet") : s.last);
}

}  // namespace

StallWatch::StallWatch(int32_t set, int rank, int size, Presence *presence, double warnS,
                       double timeoutS)
    : set_(set), rank_(rank), size_(size), presence_(presence), warnS_(warnS),
      tickS_(std::clamp(std::min(warnS > 0 ? warnS : timeoutS, timeoutS) / 4, 0.05, 1.0)),
      host_(hostName()) {
  if (size_ > 1) thread_ = std::thread([this] { loop(); });
}

StallWatch::~StallWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
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

std::string StallWatch::missing() {
  if (presence_ == nullptr || size_ <= 1) return "";
  const State mine = snapshot();
  // The thread may be in a slow word to a store that is gone: then what it collected last.
  std::unique_lock<std::mutex> lock(presenceMutex_, std::try_to_lock);
  std::vector<std::string> lines;
  bool fresh = false;
  if (lock.owns_lock()) {
    try {
      lines = presence_->collect();
      fresh = true;
    } catch (const std::exception &) {
    }
  }
  if (!fresh) {
    std::lock_guard<std::mutex> state(mutex_);
    lines = lastLines_;
    if (lines.empty()) return "";
  }
  return absentees(mine, &lines);
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
  for (bool first = true;; first = false) {
    if (!first) wake_.wait_for(lock, std::chrono::duration<double>(tickS_));
    if (stop_) return;
    lock.unlock();
    // A process that was stopped (SIGSTOP) or starved sees every wait as long when it runs
    // again: say so instead of blaming the peers, and give them a warning interval.
    const Clock::time_point now = Clock::now();
    const double gap = std::chrono::duration<double>(now - woke).count();
    woke = now;
    if (!first && gap > tickS_ + 1.0) {
      HORA_LOG(kWarning) << "rank " << rank_ << " of process set " << set_ << " did not run for "
                         << seconds(gap - tickS_) << " (stopped, e.g. SIGSTOP, or starved of CPU)";
      reported = now;
    }
    const State mine = snapshot();
    const bool due = warnS_ > 0 && mine.phase != 'i' && mine.forS >= warnS_ &&
                     std::chrono::duration<double>(now - reported).count() >= warnS_;
    std::string who;
    if (presenceWorks) {
      std::lock_guard<std::mutex> guard(presenceMutex_);
      try {
        presence_->publish(encode(mine));
        if (due) {
          std::vector<std::string> lines = presence_->collect();
          who = absentees(mine, &lines);
          std::lock_guard<std::mutex> state(mutex_);
          lastLines_ = std::move(lines);
        }
      } catch (const std::exception &e) {
        presenceWorks = false;  // the channel is gone (the store with rank 0): stay quiet
        HORA_LOG(kDebug) << "process set " << set_ << ": presence channel lost: " << e.what();
      }
    }
    if (due) {
      reported = now;
      const std::string waited = "stall: rank " + std::to_string(rank_) + " of process set " +
                                 std::to_string(set_) + " has waited " + seconds(mine.forS) + " " +
                                 doing(mine) + " (HORA_STALL_WARNING_S); ";
      if (!presenceWorks) {
        HORA_LOG(kWarning) << waited << "which ranks are missing is unknown (no presence channel: "
                              "MPI below MPI_THREAD_MULTIPLE, or the store is gone)";
      } else if (!who.empty()) {  // empty: every rank is in it (a long operation)
        HORA_LOG(kWarning) << waited << "not taking part: " << who << "; this rank " << lastDone(mine);
      }
    }
    lock.lock();
  }
}

}  // namespace hora
