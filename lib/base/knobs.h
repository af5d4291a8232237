// SPDX-License-Identifier: Apache-2.0
// Every HORA_* knob in one declarative table: name, default, doc and parser.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/logging.h"

namespace hora {

// Parsed values of every knob. Defaults here match the table's default strings.
struct Knobs {
  int64_t fusionThreshold = int64_t{64} << 20;  // bytes
  double cycleTimeMs = 0.5;
  int64_t cacheCapacity = 1024;
  std::string cpuBackend = "auto";  // auto, mpi, gloo
  std::string shm = "auto";         // auto, cma, off: the intra-host allreduce path
  std::string shmStream = "auto";   // auto, on, off: non-temporal stores into the shared segment
  std::string callerCycles = "auto";  // auto, off: a waiting thread runs its set's cycles
  std::string threadAffinity = "auto";  // auto, off, or one CPU per local rank: "0,1"
  std::string timeline;             // empty = off
  std::string flightRecorder = "/tmp/hora-flight.{rank}.json";  // "" = off
  int64_t flightRecorderOps = 1024;
  double stallWarningS = 60;
  double stallShutdownS = 0;  // 0 = off
  double timeoutS = 300;
  LogLevel logLevel = LogLevel::kWarning;
  std::string bootstrap = "auto";  // auto, mpi, env, single
  std::string jobToken;   // "" = none: the env:// store and mesh trust whoever connects
  std::string storeBind;  // "" = the address MASTER_ADDR names, when it is one of this host's

  // Reads every HORA_* variable; throws Error(HORA_ERR_INVALID_ARGUMENT) naming the knob, the bad
  // value and what is accepted.
  static Knobs fromEnvironment();
  // Same, from a lookup function (for tests): returns nullptr for unset.
  static Knobs fromLookup(const std::function<const char *(const char *)> &lookup);
};

struct KnobSpec {
  const char *name;
  const char *defaultValue;
  // One line, no '|': README.md's knob table is generated from it (hora-info --knobs-markdown,
  // tools/update_knob_docs.sh). `Backticks` mark code; plain-text output drops them.
  const char *doc;
  // Parses text into knobs; returns false with *why set when the text is not acceptable.
  bool (*parse)(const std::string &text, Knobs &knobs, std::string *why);
  // Current value as text, for hora-info.
  std::string (*show)(const Knobs &knobs);
};

const std::vector<KnobSpec> &knobTable();

// "64M", "1GiB", "4096", "1.5k" -> bytes. false if malformed or negative.
bool parseBytes(const std::string &text, int64_t *bytes);

}  // namespace hora
