// SPDX-License-Identifier: Apache-2.0
// The knob table, built from the knobs' one declaration (base/knob_list.h: adding a knob is one
// entry there, then tools/update_knob_docs.sh); nothing else reads the environment for HORA_*
// settings. Below it: Horovod's names for the knobs, and the HORA_* variables that are not knobs.
#include "base/knobs.h"

#include <strings.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>

#include <unistd.h>  // environ (a GNU extension of it, which g++ enables)

#include "base/error.h"

namespace hora {
namespace {

bool parseDouble(const std::string &text, double lo, double hi, double *out, std::string *why) {
  char *end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0' || !std::isfinite(v) || v < lo ||
      v > hi) {
    std::ostringstream s;
    s << "expected a number in [" << lo << ", " << hi << "]";
    *why = s.str();
    return false;
  }
  *out = v;
  return true;
}

bool parseChoice(const std::string &text, std::initializer_list<const char *> choices,
                 std::string *out, std::string *why) {
  for (const char *c : choices) {
    if (text == c) {
      *out = text;
      return true;
    }
  }
  std::string list;
  for (const char *c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
  *why = "expected one of " + list;
  return false;
}

// "ucx", "my_plane2": lowercase letters, digits and underscores, at least one.
bool isPlainName(const std::string &text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// "0", "3,7,11": CPU numbers of at most 5 digits joined by single commas.
bool isCpuList(const std::string &text) {
  size_t digits = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (++digits > 5) return false;
    } else if ((i == text.size() || text[i] == ',') && digits > 0) {
      digits = 0;
    } else {
      return false;
    }
  }
  return true;
}

// A whole number in [lo, hi], written without a fraction ("64", not "64.5" or "64k").
bool parseWhole(const std::string &text, int64_t lo, int64_t hi, int64_t *out, std::string *why) {
  double v;
  if (!parseDouble(text, static_cast<double>(lo), static_cast<double>(hi), &v, why) ||
      v != std::floor(v)) {
    *why = "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return false;
  }
  *out = static_cast<int64_t>(v);
  return true;
}

// `ok`, or false with *why = `expected` (what the knob accepts).
bool check(bool ok, std::string *why, const char *expected) {
  if (!ok) *why = expected;
  return ok;
}

// Sets a field to a value the parse expression has accepted; true.
template <typename Field, typename Value>
bool assign(Field *field, Value &&value) {
  *field = std::forward<Value>(value);
  return true;
}

// "", "allreduce=ring", "allreduce=ring,broadcast=tree": COLLECTIVE=NAME items joined by commas
// (empty items are skipped). Which collectives and names exist is the tables' business.
bool isAlgorithmList(const std::string &text) {
  for (size_t at = 0; at <= text.size();) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    if (!item.empty() &&
        (item.find('=') == std::string::npos || item.front() == '=' || item.back() == '=')) {
      return false;
    }
    at = end + 1;
  }
  return true;
}

// A knob's current value as hora-info prints it, by the field's type (HORA_KNOB; a knob declared
// with HORA_KNOB_SHOWN says its own).
std::string showValue(int64_t v) { return std::to_string(v); }
std::string showValue(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}
std::string showValue(const std::string &v) { return v; }
std::string showValue(LogLevel v) { return logLevelName(v); }

// The rows, from the knobs' one declaration (base/knob_list.h): a parser running the entry's
// parse expression on `text` into `knobs`, and a show (the entry's, or showValue of the field).
#define HORA_KNOB_SHOWN(name, type, field, value, defaultText, doc, show, ...) \
  {name, defaultText, doc,                                                    \
   [](const std::string &text, Knobs &knobs, std::string *why) -> bool {      \
     (void)why;                                                               \
     return __VA_ARGS__;                                                      \
   },                                                                         \
   [](const Knobs &knobs) -> std::string { return show; }},
#define HORA_KNOB(name, type, field, value, defaultText, doc, ...) \
  HORA_KNOB_SHOWN(name, type, field, value, defaultText, doc, showValue(knobs.field), __VA_ARGS__)

const std::vector<KnobSpec> kTable = {
#include "base/knob_list.h"
};

// "12", "-3": a whole decimal number, nothing around it (Horovod's strtol would read "1x" as 1).
bool parseInteger(const std::string &text, long long *out) {
  size_t i = text.size() > 0 && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  if (i == text.size() || text.size() > 18) return false;
  for (size_t j = i; j < text.size(); ++j) {
    if (!std::isdigit(static_cast<unsigned char>(text[j]))) return false;
  }
  *out = std::strtoll(text.c_str(), nullptr, 10);
  return true;
}

// Horovod's switches (HOROVOD_STALL_CHECK_DISABLE, HOROVOD_HIERARCHICAL_*) are on when their
// number is above 0. hora also wants a number, so that "true" is an error rather than off.
AliasUse horovodSwitch(const std::string &text, std::string *why) {
  long long v;
  if (!parseInteger(text, &v)) {
    *why = "expected a number: 1 (on) or 0 (off)";
    return AliasUse::kBad;
  }
  return v > 0 ? AliasUse::kSets : AliasUse::kNoEffect;
}

// Horovod's names for hora's knobs. Their units are hora's: bytes, milliseconds, seconds.
const std::vector<KnobAlias> kAliases = {
    {"HOROVOD_FUSION_THRESHOLD", "HORA_FUSION_THRESHOLD", "`HOROVOD_FUSION_THRESHOLD`", nullptr},
    {"HOROVOD_CYCLE_TIME", "HORA_CYCLE_TIME_MS", "`HOROVOD_CYCLE_TIME`", nullptr},
    {"HOROVOD_CACHE_CAPACITY", "HORA_CACHE_CAPACITY", "`HOROVOD_CACHE_CAPACITY`", nullptr},
    {"HOROVOD_TIMELINE", "HORA_TIMELINE",
     "`HOROVOD_TIMELINE` (`DYNAMIC`: no file until `start_timeline`)",
     [](const std::string &t, std::string *knobText, std::string *) {
       // Horovod's DYNAMIC (or empty) arms the timeline for start_timeline without a file;
       // hora's start_timeline needs no arming.
       if (t.empty() || t == "DYNAMIC") return AliasUse::kNoEffect;
       *knobText = t;
       return AliasUse::kSets;
     }},
    {"HOROVOD_STALL_CHECK_TIME_SECONDS", "HORA_STALL_WARNING_S",
     "`HOROVOD_STALL_CHECK_TIME_SECONDS`", nullptr},
    // After the row above: Horovod's switch turns the whole check off whatever the time says.
    {"HOROVOD_STALL_CHECK_DISABLE", "HORA_STALL_WARNING_S",
     "`HOROVOD_STALL_CHECK_DISABLE=1` (sets 0)",
     [](const std::string &t, std::string *knobText, std::string *why) {
       *knobText = "0";
       return horovodSwitch(t, why);
     }},
    {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HORA_STALL_SHUTDOWN_S",
     "`HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`", nullptr},
    // Horovod's disabled check does not shut down either.
    {"HOROVOD_STALL_CHECK_DISABLE", "HORA_STALL_SHUTDOWN_S",
     "`HOROVOD_STALL_CHECK_DISABLE=1` (sets 0)",
     [](const std::string &t, std::string *knobText, std::string *why) {
       *knobText = "0";
       return horovodSwitch(t, why);
     }},
    {"HOROVOD_LOG_LEVEL", "HORA_LOG_LEVEL", "`HOROVOD_LOG_LEVEL` (`fatal` reads as `error`)",
     [](const std::string &t, std::string *knobText, std::string *why) {
       for (const char *level : {"trace", "debug", "info", "warning", "error", "fatal"}) {
         if (strcasecmp(t.c_str(), level) == 0) {
           // hora's most severe level is error; fatal shows only what is that severe.
           *knobText = std::strcmp(level, "fatal") == 0 ? "error" : level;
           return AliasUse::kSets;
         }
       }
       *why = "expected one of trace, debug, info, warning, error, fatal (any case)";
       return AliasUse::kBad;
     }},
    {"HOROVOD_HIERARCHICAL_ALLREDUCE", "HORA_HIERARCHICAL",
     "`HOROVOD_HIERARCHICAL_ALLREDUCE` (1 sets `on`, 0 sets `off`; CUDA tensors go to NCCL, "
     "which picks its own intra- and inter-host algorithm)",
     [](const std::string &t, std::string *knobText, std::string *why) {
       const AliasUse use = horovodSwitch(t, why);
       if (use == AliasUse::kBad) return use;
       *knobText = use == AliasUse::kSets ? "on" : "off";
       return AliasUse::kSets;
     }},
    {"HOROVOD_HIERARCHICAL_ALLGATHER", nullptr,
     "no switch of its own: allgather and broadcast follow `HORA_HIERARCHICAL` (across hosts, "
     "gathered inside each host and exchanged once per host); CUDA tensors: one NCCL collective",
     [](const std::string &t, std::string *, std::string *why) { return horovodSwitch(t, why); }},
};

// Every HORA_* name the project reads that is not a knob, and where it is read. The test
// knob_env (test/docs/test_knob_env.py) scans the sources and fails on a HORA_* name that is
// neither a knob nor here, so a new one cannot be a false "not a hora knob" warning.
const std::vector<OtherVariable> kOtherVariables = {
    {"HORA_TEST_*",
     "the tests: HORA_TEST_TIME_SCALE (test/common/time_scale.h and .py, every timed test), "
     "HORA_TEST_WATCHDOG_S (test/multiprocess/mp_main.cpp), HORA_TEST_KEEP and HORA_TEST_X "
     "(test/launcher, passed through horarun); read by the library, through environmentValue, "
     "only HORA_TEST_AT (lib/base/test_points.h: a rank sleeps or dies at a named point, for the "
     "fault tests; docs/testing.md)"},
    {"HORA_SOAK_SECONDS",
     "test/multiprocess/test_soak.cpp (test/multiprocess/meson.build sets it)"},
    {"HORA_HORARUN", "test/python/harness.py (test/python/meson.build sets it)"},
    {"HORA_MPIEXEC", "test/python/harness.py, test/python/ddp/conftest.py"},
    {"HORA_MPIRUN_FLAGS", "test/python/harness.py (test/python/meson.build sets it)"},
    {"HORA_BUILDDIR", "tools/run_tests.sh, tools/run_loaded.sh, tools/run_main.sh"},
    {"HORA_ASAN_BUILDDIR", "tools/run_tests.sh, tools/sanitize.sh"},
    {"HORA_TSAN_BUILDDIR", "tools/run_tests.sh, tools/sanitize.sh"},
    {"HORA_BUILD_JOBS",
     "tools/run_tests.sh (exports it to every test), tools/run_loaded.sh, tools/run_main.sh"},
    {"HORA_SANITIZERS", "tools/run_tests.sh, tools/run_loaded.sh"},
    {"HORA_GRADS_DATA", "tools/run_main.sh"},
    {"HORA_FUZZ_CXX", "test/fuzz/run_fuzz.sh"},
    {"HORA_SUITE_CASE_S", "tools/horovod_suite.sh (each case's time limit)"},
    {"HORA_SUITE_TOTAL_S", "tools/horovod_suite.sh (the gloo mode's time limit)"},
    {"HORA_RESTART_COUNT",
     "set by horarun's agents for their workers (tools/horarun; docs/elastic.md): how many times "
     "a failure restarted the workers, 0 on the first start (TORCHELASTIC_RESTART_COUNT too)"},
    {"HORA_AGENT_STORE",
     "set by horarun's agents (lib/bootstrap/env/launch_config.cpp): HOST:PORT of the store the "
     "agents serve; hora's rank 0 then serves none, and MASTER_ADDR:MASTER_PORT stay torch's"},
    {"HORA_STORE_PREFIX",
     "set by horarun's agents (lib/bootstrap/env/launch_config.cpp): the store keys of this "
     "round or job"},
    {"HORA_ELASTIC",
     "set by horarun's agents in an elastic job (lib/bootstrap/env/launch_config.cpp): 1 = the "
     "agents give this worker its rank, world by world (HORA_ELASTIC_ID names it)"},
    {"HORA_ELASTIC_ID", "set by horarun's agents: an elastic worker's name (see HORA_ELASTIC)"},
};

std::string upper(std::string text) {
  for (char &c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

// Edits (insert, delete, substitute, swap two neighbours) that turn a into b.
size_t editDistance(const std::string &a, const std::string &b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

[[noreturn]] void throwBadValue(const char *variable, const char *value, const std::string &why,
                                const KnobSpec &spec) {
  const bool alias = std::strcmp(variable, spec.name) != 0;
  HORA_THROW(HORA_ERR_INVALID_ARGUMENT, variable, "='", value, "' is not valid: ", why, " (",
             alias ? "Horovod's name for " : "", alias ? spec.name : "", alias ? "; " : "",
             "default ", spec.defaultValue[0] ? spec.defaultValue : "unset", ")");
}

}  // namespace

const char *environmentValue(const char *name) {
  const std::string wanted = name;
  for (const KnobSpec &spec : kTable) {
    HORA_ENFORCE(wanted != spec.name, "environmentValue(", name, "): a knob, read through Knobs");
  }
  HORA_ENFORCE(wanted.rfind("HORA_", 0) != 0 || isKnownVariable(wanted), "environmentValue(", name,
               "): a HORA_* variable that is neither a knob nor in kOtherVariables");
  return std::getenv(name);
}

bool parseBytes(const std::string &text, int64_t *bytes) {
  char *end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || !std::isfinite(v) || v < 0) return false;
  std::string suffix(end);
  for (auto &c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 1;
  if (suffix.empty() || suffix == "B") scale = 1;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB") scale = 1024.0;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB") scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB") scale = 1024.0 * 1024 * 1024;
  else return false;
  const double total = v * scale;
  if (total > 9.0e18) return false;
  *bytes = static_cast<int64_t>(total);
  return true;
}

const std::vector<KnobSpec> &knobTable() { return kTable; }

const std::vector<KnobAlias> &knobAliases() { return kAliases; }

const std::vector<OtherVariable> &otherVariables() { return kOtherVariables; }

std::string knobDoc(const KnobSpec &spec) {
  std::string aliases;
  int count = 0;
  for (const KnobAlias &alias : kAliases) {
    if (alias.knob == nullptr || std::strcmp(alias.knob, spec.name) != 0) continue;
    aliases += (count++ ? "; " : "") + std::string(alias.doc);
  }
  if (count == 0) return spec.doc;
  return std::string(spec.doc) + (count == 1 ? ". Horovod alias: " : ". Horovod aliases: ") +
         aliases;
}

Knobs Knobs::fromLookup(const std::function<const char *(const char *)> &lookup,
                        KnobReport *report) {
  KnobReport unused;
  KnobReport &out = report != nullptr ? *report : unused;
  Knobs knobs;
  for (const KnobSpec &spec : kTable) {
    // The aliases first, in table order (a later one over an earlier one), each parsed as the
    // knob would parse its text, so that a bad value is an error whoever wins.
    Knobs viaAlias = knobs;
    const KnobAlias *used = nullptr;
    for (const KnobAlias &alias : kAliases) {
      if (alias.knob == nullptr || std::strcmp(alias.knob, spec.name) != 0) continue;
      const char *value = lookup(alias.name);
      if (value == nullptr) continue;
      std::string text = value, why;
      const AliasUse use =
          alias.translate != nullptr ? alias.translate(value, &text, &why) : AliasUse::kSets;
      if (use == AliasUse::kBad || (use == AliasUse::kSets && !spec.parse(text, viaAlias, &why))) {
        throwBadValue(alias.name, value, why, spec);
      }
      if (use == AliasUse::kSets) used = &alias;
    }
    const char *value = lookup(spec.name);
    if (value != nullptr) {
      std::string why;
      if (!spec.parse(value, knobs, &why)) throwBadValue(spec.name, value, why, spec);
      out.origin[spec.name] = spec.name;
      if (used != nullptr && spec.show(viaAlias) != spec.show(knobs)) {
        out.notes.emplace_back(
            LogLevel::kWarning,
            detail::concat(spec.name, "='", value, "' and ", used->name, "='", lookup(used->name),
                           "' are both set and differ; using ", spec.name));
      }
    } else if (used != nullptr) {
      knobs = viaAlias;
      out.origin[spec.name] = used->name;
    }
  }
  for (const KnobAlias &alias : kAliases) {  // Horovod's variables that hora has no knob for
    const char *value = lookup(alias.name);
    if (alias.knob != nullptr || value == nullptr) continue;
    std::string text, why;
    const AliasUse use = alias.translate(value, &text, &why);
    if (use == AliasUse::kBad) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, alias.name, "='", value, "' is not valid: ", why);
    }
    if (use == AliasUse::kSets) {
      std::string doc = alias.doc;
      doc.erase(std::remove(doc.begin(), doc.end(), '`'), doc.end());
      out.notes.emplace_back(LogLevel::kInfo,
                             detail::concat(alias.name, "=", value, " changes nothing: ", doc));
    }
  }
  return knobs;
}

Knobs Knobs::fromEnvironment(KnobReport *report) {
  if (report != nullptr) {  // first: the report has these even when a value is bad
    std::vector<std::string> names;
    for (char **entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      const char *eq = std::strchr(*entry, '=');
      names.emplace_back(*entry, eq != nullptr ? eq - *entry : std::strlen(*entry));
    }
    checkVariableNames(names, report);
  }
  return fromLookup([](const char *name) { return std::getenv(name); }, report);
}

bool isKnownVariable(const std::string &name) {
  for (const KnobSpec &spec : kTable) {
    if (name == spec.name) return true;
  }
  for (const OtherVariable &v : kOtherVariables) {
    const std::string known = v.name;
    if (known.back() != '*') {
      if (name == known) return true;
    } else if (name.compare(0, known.size() - 1, known, 0, known.size() - 1) == 0) {
      return true;
    }
  }
  return false;
}

std::string closestKnob(const std::string &name) {
  // Close: a few edits (more for a longer name), or a knob's name cut short at an underscore.
  // Any case: the environment's names are exact, so a lower-case knob is a mistake too.
  const std::string wanted = upper(name);
  const size_t length = wanted.rfind("HORA_", 0) == 0 ? wanted.size() - 5 : wanted.size();
  const size_t allowed = std::max<size_t>(2, length / 3);
  std::string best;
  size_t bestDistance = SIZE_MAX;
  for (const KnobSpec &spec : kTable) {
    const std::string knob = spec.name;
    const size_t d = editDistance(wanted, knob);
    const bool starts = knob.size() > wanted.size() + 1 && knob[wanted.size()] == '_' &&
                        knob.compare(0, wanted.size(), wanted) == 0;
    if ((d <= allowed || starts) && d < bestDistance) {
      best = knob;
      bestDistance = d;
    }
  }
  return best;
}

void checkVariableNames(const std::vector<std::string> &names, KnobReport *report) {
  std::vector<std::string> unknown;
  for (const std::string &name : names) {
    if (name.rfind("HORA_", 0) == 0 && !isKnownVariable(name)) unknown.push_back(name);
  }
  std::sort(unknown.begin(), unknown.end());
  for (const std::string &name : unknown) {
    const std::string near = closestKnob(name);
    report->notes.emplace_back(
        LogLevel::kWarning,
        near.empty() ? name + " is not a hora knob and is ignored (hora-info lists the knobs)"
                     : name + " is not a hora knob; did you mean " + near + "?");
  }
}

void logKnobNotes(const KnobReport &report) {
  static std::mutex mutex;
  static std::set<std::string> logged;  // guarded by mutex: what this process has said
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto &note : report.notes) {
    if (note.first < logLevel() || !logged.insert(note.second).second) continue;
    LogMessage(note.first, __FILE__, __LINE__).stream() << note.second;
  }
}

}  // namespace hora
