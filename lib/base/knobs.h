// SPDX-License-Identifier: Apache-2.0
// Every HORA_* knob: the Knobs struct and the table (name, default, doc, parser, show), both
// generated from one declaration per knob in base/knob_list.h. Adding a knob is one entry there.
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

// Parsed values of every knob: one field per entry of base/knob_list.h, in its order, holding the
// entry's default (what its default text parses to; the unit tests check that they agree).
struct Knobs {
#define HORA_KNOB(name, type, field, value, ...) type field = value;
#define HORA_KNOB_SHOWN HORA_KNOB
#include "base/knob_list.h"

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
