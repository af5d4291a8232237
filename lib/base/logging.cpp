// SPDX-License-Identifier: Apache-2.0
// Rank-tagged logging: one write(2) per line so lines of concurrent ranks do not interleave.
#include "base/logging.h"

#include <limits.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace hora {
namespace {
std::atomic<int> gLevel{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> gRank{-1};
thread_local int tNonBlocking = 0;     // NonBlockingLog scopes alive on this thread
thread_local uint64_t tDropped = 0;    // lines this thread dropped since its last one went out
}  // namespace

bool parseLogLevel(const std::string &text, LogLevel *level) {
  static const struct { const char *name; LogLevel level; } kNames[] = {
      {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug},   {"info", LogLevel::kInfo},
      {"warning", LogLevel::kWarning}, {"warn", LogLevel::kWarning}, {"error", LogLevel::kError}};
  for (const auto &n : kNames) {
    if (strcasecmp(text.c_str(), n.name) == 0) {
      *level = n.level;
      return true;
    }
  }
  return false;
}

const char *logLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "trace";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "?";
}

void setLogLevel(LogLevel level) { gLevel = static_cast<int>(level); }
LogLevel logLevel() { return static_cast<LogLevel>(gLevel.load()); }
void setLogRank(int rank) { gRank = rank; }

LogMessage::LogMessage(LogLevel level, const char *file, int line) : level_(level) {
  static const char kTag[] = "TDIWE";
  const char *slash = std::strrchr(file, '/');
  out_ << "[hora";
  if (gRank >= 0) out_ << " rank " << gRank.load();
  out_ << "] " << kTag[static_cast<int>(level_)] << ' ' << (slash ? slash + 1 : file) << ':'
       << line << ": ";
}

NonBlockingLog::NonBlockingLog() { ++tNonBlocking; }
NonBlockingLog::~NonBlockingLog() { --tNonBlocking; }

LogMessage::~LogMessage() {
  out_ << '\n';
  std::string text = out_.str();
  if (tNonBlocking == 0) {
    ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
    (void)ignored;
    return;
  }
  pollfd out{STDERR_FILENO, POLLOUT, 0};
  if (poll(&out, 1, 0) != 1 || (out.revents & POLLOUT) == 0) {
    ++tDropped;
    return;
  }
  if (tDropped > 0) {
    text = "[hora] W logging: " + std::to_string(tDropped) +
           " earlier lines dropped: stderr was not being read\n" + text;
  }
  if (text.size() > PIPE_BUF) {
    text.resize(PIPE_BUF - 4);
    text += "...\n";
  }
  const ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
  if (n > 0) tDropped = 0;
}

}  // namespace hora
