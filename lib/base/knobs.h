// SPDX-License-Identifier: Apache-2.0
// Every HORA_* knob in one declarative table: name, default, doc and parser.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/logging.h"

namespace hora {

struct KnobReport;

// Parsed values of every knob. Defaults here match the table's default strings.
struct Knobs {
  int64_t fusionThreshold = int64_t{64} << 20;  // bytes
  double cycleTimeMs = 0.5;
  int64_t cacheCapacity = 1024;
  std::string cpuBackend = "auto";  // auto or a plane's name (backends/registry.h: cpuPlanes)
  std::string shm = "auto";         // auto, cma, off: the intra-host allreduce path
  std::string shmStream = "auto";   // auto, on, off: non-temporal stores into the shared segment
  std::string hierarchical = "auto";  // auto, on, off: shared memory + cross-host plane for sets spanning hosts
  int64_t hierOwners = 0;  // ranks per host carrying a hierarchical allreduce across; 0 = auto
  std::string callerCycles = "auto";  // auto, off: a waiting thread runs its set's cycles
  std::string threadAffinity = "auto";  // auto, off, or one CPU per local rank: "0,1"
  std::string timeline;             // empty = off
  std::string flightRecorder = "/tmp/hora-flight.{rank}.json";  // "" = off
  int64_t flightRecorderOps = 1024;
  int64_t flightRecorderKeep = 8;  // jobs whose files stay in the recorder's directory; 0 = all
  double stallWarningS = 60;
  double stallShutdownS = 0;  // 0 = off
  double timeoutS = 300;
  double ncclInitTimeoutS = 120;  // communicator creation, at most timeoutS
  int64_t cudaDirectBytes = int64_t{1} << 20;  // fused CUDA allreduce: tensors this big are not packed; 0: all are
  LogLevel logLevel = LogLevel::kWarning;
  std::string bootstrap = "auto";  // auto, mpi, env, single
  std::string jobToken;   // "" = none: the env:// store and mesh trust whoever connects
  std::string storeBind;  // "" = the address MASTER_ADDR names, when it is one of this host's
  // The UCX plane (lib/backends/ucx, docs/ucx.md).
  int64_t ucxDirectKiB = 16;   // allreduce sends (P-1) x its bytes directly up to here
  int64_t ucxSmallKiB = 64;    // up to here allreduce uses recursive doubling
  int64_t ucxChunkKiB = 256;   // pipeline unit of the ring and the broadcast chain
  double ucxSpinUs = 50;       // a wait polls this long before it sleeps
  // The Gloo and UCX planes: "allreduce=ring,..." forces algorithms of the tables
  // (lib/core/collectives/algorithms.h); "" = each table's size rules.
  std::string algorithm;

  // Reads every HORA_* variable and its aliases; throws Error(HORA_ERR_INVALID_ARGUMENT) naming
  // the variable, the bad value and what is accepted. With `report`, also says where each value
  // came from and what to tell the user, including every HORA_* variable that is not a knob.
  static Knobs fromEnvironment(KnobReport *report = nullptr);
  // Same from a lookup function (for tests): returns nullptr for unset. Knows no variable names,
  // so it checks none (checkVariableNames does).
  static Knobs fromLookup(const std::function<const char *(const char *)> &lookup,
                          KnobReport *report = nullptr);
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

// What an alias's text means for its knob.
enum class AliasUse {
  kSets,      // *knobText is the knob's text for it
  kNoEffect,  // the knob keeps its value (e.g. HOROVOD_STALL_CHECK_DISABLE=0)
  kBad,       // not acceptable; *why says what is
};

// A variable of another framework read as one of hora's knobs: Horovod's HOROVOD_* names, so that
// a Horovod job's environment keeps working. The knob's own HORA_* variable wins when both are set.
struct KnobAlias {
  const char *name;
  // The knob it sets. nullptr: hora has no such knob (yet); the variable is accepted, and when
  // its value asks for something, `doc` is logged at info level (it says what hora does instead).
  // A later knob takes such a variable over by naming itself here.
  const char *knob;
  // One line of Markdown, no '|': added to the knob's doc (knobDoc), or for a variable without a
  // knob, what hora does instead.
  const char *doc;
  // Horovod's text to the knob's; nullptr: the same text.
  AliasUse (*translate)(const std::string &text, std::string *knobText, std::string *why);
};

// In the order they apply: of two aliases of one knob that are both set, the later one wins.
const std::vector<KnobAlias> &knobAliases();

// A knob's doc followed by its aliases (what README.md and hora-info show).
std::string knobDoc(const KnobSpec &spec);

// What reading the knobs found besides their values.
struct KnobReport {
  // Knob name -> the variable its value came from (its own, or an alias); absent: the default.
  std::map<std::string, std::string> origin;
  // For the user (logKnobNotes): an alias that disagrees with its knob, a HORA_* variable that is
  // not a knob (warnings); a Horovod variable hora has no knob for (info).
  std::vector<std::pair<LogLevel, std::string>> notes;
};

// HORA_* variables that are not knobs: read by hora's tools, launcher scripts and tests; the
// library reads only horarun's launch variables (HORA_AGENT_STORE, HORA_STORE_PREFIX,
// HORA_ELASTIC*) and HORA_TEST_AT, through environmentValue, and no setting. Set in a job's
// environment, they are not misspelt knobs.
struct OtherVariable {
  const char *name;  // ending in '*': every name with that prefix
  const char *readBy;
};
const std::vector<OtherVariable> &otherVariables();

// A knob's name, or a name otherVariables() covers.
bool isKnownVariable(const std::string &name);
// The knob whose name is closest to `name` (edit distance, any case), or "" when none is close.
std::string closestKnob(const std::string &name);
// Adds a warning to `report` for each name that starts with HORA_ and is not known.
void checkVariableNames(const std::vector<std::string> &names, KnobReport *report);
// Logs each note of `report` at its level, except those this process has logged before.
void logKnobNotes(const KnobReport &report);

// "64M", "1GiB", "4096", "1.5k" -> bytes. false if malformed or negative.
bool parseBytes(const std::string &text, int64_t *bytes);

// The process environment's value of a variable that is not a knob, or nullptr when unset: a
// launcher's (MASTER_ADDR, RANK, OMPI_*, SLURM_*, TORCHELASTIC_*), horarun's and the tests'
// HORA_* variables of otherVariables() (HORA_AGENT_STORE, HORA_TEST_AT), or another library's
// that hora defers to (UCX_TLS, NCCL_SOCKET_IFNAME: set, the user's choice stands). With
// Knobs::fromEnvironment, the only reader of the environment in lib/ (test/layers/check_getenv.py
// fails on another). A knob's name, or a HORA_* name otherVariables() does not list, is a bug
// (HORA_ENFORCE): tuning comes through Knobs.
const char *environmentValue(const char *name);

}  // namespace hora
