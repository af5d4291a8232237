// SPDX-License-Identifier: Apache-2.0
// Rank-tagged logging to stderr: HORA_LOG(kWarning) << "...".
#pragma once

#include <sstream>
#include <string>

namespace hora {

enum class LogLevel { kTrace = 0, kDebug, kInfo, kWarning, kError };

bool parseLogLevel(const std::string &text, LogLevel *level);
const char *logLevelName(LogLevel level);

void setLogLevel(LogLevel level);
LogLevel logLevel();
// Tags every line with this process's rank once it is known (-1 = not yet).
void setLogRank(int rank);

// While one lives on a thread, that thread's log lines never block: a line that stderr cannot
// take at once (a pipe nobody reads, as when a launcher keeps a server's stderr and never reads
// it) is dropped and counted, and the next line that goes out says how many were dropped.
// Lines are cut to 4 KiB (PIPE_BUF), which a pipe with room takes whole. For threads that serve
// others (the TCP store's): a full pipe must not stop them.
class NonBlockingLog {
 public:
  NonBlockingLog();
  ~NonBlockingLog();
  NonBlockingLog(const NonBlockingLog &) = delete;
  NonBlockingLog &operator=(const NonBlockingLog &) = delete;
};

class LogMessage {
 public:
  LogMessage(LogLevel level, const char *file, int line);
  ~LogMessage();
  std::ostream &stream() { return out_; }

 private:
  LogLevel level_;
  std::ostringstream out_;
};

}  // namespace hora

#define HORA_LOG(level)                                              \
  if (::hora::LogLevel::level < ::hora::logLevel()) {                \
  } else                                                             \
    ::hora::LogMessage(::hora::LogLevel::level, __FILE__, __LINE__).stream()
