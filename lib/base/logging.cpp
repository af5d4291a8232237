// SPDX-License-Identifier: Apache-2.0
// Rank-tagged logging: one write(2) per line so lines of concurrent ranks do not interleave.
#include "base/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstring>

namespace hora {
namespace {
std::atomic<int> gLevel{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> gRank{-1};
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

LogMessage::~LogMessage() {
  out_ << '\n';
  const std::string text = out_.str();
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

}  // namespace hora
