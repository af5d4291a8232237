// SPDX-License-Identifier: Apache-2.0
// The knob table: defaults, parsing, and clear errors for bad values.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "base/error.h"
#include "base/knobs.h"

namespace hora {
namespace {

Knobs fromMap(const std::map<std::string, std::string> &env, KnobReport *report = nullptr) {
  return Knobs::fromLookup(
      [&](const char *name) -> const char * {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      report);
}

// The message of the error that reading `env` throws ("" if none).
std::string errorOf(const std::map<std::string, std::string> &env) {
  try {
    fromMap(env);
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
    return e.message();
  }
  return "";
}

std::vector<std::string> warnings(const KnobReport &r) {
  std::vector<std::string> out;
  for (const auto &note : r.notes) {
    if (note.first == LogLevel::kWarning) out.push_back(note.second);
  }
  return out;
}

TEST(Knobs, DefaultsMatchDesign) {
  Knobs k = fromMap({});
  EXPECT_EQ(k.fusionThreshold, 64 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(k.cycleTimeMs, 0.5);
  EXPECT_EQ(k.cacheCapacity, 1024);
  EXPECT_EQ(k.cpuBackend, "auto");
  EXPECT_EQ(k.timeline, "");
  EXPECT_DOUBLE_EQ(k.stallWarningS, 60);
  EXPECT_DOUBLE_EQ(k.stallShutdownS, 0);
  EXPECT_DOUBLE_EQ(k.timeoutS, 300);
  EXPECT_EQ(k.logLevel, LogLevel::kWarning);
  EXPECT_EQ(k.bootstrap, "auto");
  EXPECT_EQ(k.threadAffinity, "auto");
}

TEST(Knobs, TableDefaultsParseToTheStructDefaults) {
  // Feeding each row's default string through its own parser must give the compiled default.
  std::map<std::string, std::string> env;
  for (const KnobSpec &spec : knobTable()) env[spec.name] = spec.defaultValue;
  Knobs parsed = fromMap(env);
  Knobs defaults;
  for (const KnobSpec &spec : knobTable()) {
    EXPECT_EQ(spec.show(parsed), spec.show(defaults)) << spec.name;
  }
}

TEST(Knobs, EveryDesignKnobIsInTheTable) {
  std::set<std::string> names;
  for (const KnobSpec &spec : knobTable()) names.insert(spec.name);
  for (const char *n : {"HORA_FUSION_THRESHOLD", "HORA_CYCLE_TIME_MS", "HORA_CACHE_CAPACITY",
                        "HORA_CPU_BACKEND", "HORA_TIMELINE", "HORA_STALL_WARNING_S",
                        "HORA_STALL_SHUTDOWN_S", "HORA_TIMEOUT_S", "HORA_LOG_LEVEL",
                        "HORA_BOOTSTRAP"}) {
    EXPECT_TRUE(names.count(n)) << n;
  }
}

TEST(Knobs, EveryRowRendersAsOneMarkdownRow) {
  // README.md's knob table is generated from these strings (hora-info --knobs-markdown): a '|'
  // or a newline would split a row, an odd number of backticks would leave code open.
  std::set<std::string> seen;
  for (const KnobSpec &spec : knobTable()) {
    const std::string name = spec.name, doc = knobDoc(spec), def = spec.defaultValue;
    EXPECT_EQ(name.rfind("HORA_", 0), 0u) << name;
    EXPECT_EQ(name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"), std::string::npos)
        << name;
    EXPECT_TRUE(seen.insert(name).second) << name << " is in the table twice";
    EXPECT_FALSE(doc.empty()) << name;
    EXPECT_EQ(doc.find_first_of("|\n"), std::string::npos) << name << ": " << doc;
    EXPECT_EQ(std::count(doc.begin(), doc.end(), '`') % 2, 0) << name << ": " << doc;
    EXPECT_EQ(def.find_first_of("|`\n"), std::string::npos) << name << ": " << def;
  }
}

TEST(Knobs, ParsesValues) {
  Knobs k = fromMap({{"HORA_FUSION_THRESHOLD", "1M"},
                     {"HORA_CYCLE_TIME_MS", "2.5"},
                     {"HORA_CACHE_CAPACITY", "0"},
                     {"HORA_LOG_LEVEL", "DEBUG"},
                     {"HORA_BOOTSTRAP", "single"},
                     {"HORA_THREAD_AFFINITY", "0,8,16"},
                     {"HORA_SHM", "cma"},
                     {"HORA_CALLER_CYCLES", "off"}});
  EXPECT_EQ(k.fusionThreshold, 1 << 20);
  EXPECT_DOUBLE_EQ(k.cycleTimeMs, 2.5);
  EXPECT_EQ(k.cacheCapacity, 0);
  EXPECT_EQ(k.logLevel, LogLevel::kDebug);
  EXPECT_EQ(k.bootstrap, "single");
  EXPECT_EQ(k.threadAffinity, "0,8,16");
  EXPECT_EQ(k.shm, "cma");
  EXPECT_EQ(k.callerCycles, "off");
  EXPECT_EQ(fromMap({}).callerCycles, "auto");
}

// HORA_CPU_BACKEND takes auto or any plain name: which names are planes is the registry's to say
// (backends/registry.h), and hora_init refuses one it does not have (test/docs/test_knob_env.py).
TEST(Knobs, CpuBackendTakesAnyPlainName) {
  for (const char *name : {"auto", "mpi", "gloo", "ucx", "tcp", "my_plane2"}) {
    EXPECT_EQ(fromMap({{"HORA_CPU_BACKEND", name}}).cpuBackend, name);
  }
  EXPECT_NE(errorOf({{"HORA_CPU_BACKEND", "Gloo"}}).find("expected auto or a plane's name"),
            std::string::npos);
}

// What the backends read from Knobs rather than the environment (test/layers/check_getenv.py).
TEST(Knobs, BackendTuning) {
  const Knobs defaults = fromMap({});
  EXPECT_EQ(defaults.hierOwners, 0);  // auto: the fewest ranks any host holds
  EXPECT_EQ(defaults.ucxDirectKiB, 16);
  EXPECT_EQ(defaults.ucxSmallKiB, 64);
  EXPECT_EQ(defaults.ucxChunkKiB, 256);
  EXPECT_DOUBLE_EQ(defaults.ucxSpinUs, 50);
  Knobs k = fromMap({{"HORA_HIER_OWNERS", "1"},
                     {"HORA_UCX_DIRECT_KB", "0"},
                     {"HORA_UCX_SMALL_KB", "1"},
                     {"HORA_UCX_CHUNK_KB", "1"},
                     {"HORA_UCX_SPIN_US", "2.5"}});
  EXPECT_EQ(k.hierOwners, 1);
  EXPECT_EQ(k.ucxDirectKiB, 0);
  EXPECT_EQ(k.ucxSmallKiB, 1);
  EXPECT_EQ(k.ucxChunkKiB, 1);
  EXPECT_DOUBLE_EQ(k.ucxSpinUs, 2.5);
  EXPECT_EQ(fromMap({{"HORA_HIER_OWNERS", "auto"}}).hierOwners, 0);
  EXPECT_NE(errorOf({{"HORA_HIER_OWNERS", "two"}}).find("expected auto or an integer"),
            std::string::npos);
}

// The one accessor for variables that are not knobs refuses a knob's name and an unlisted HORA_*.
TEST(Knobs, EnvironmentValueIsNotForKnobs) {
  EXPECT_THROW(environmentValue("HORA_TIMEOUT_S"), Error);
  EXPECT_THROW(environmentValue("HORA_UCX_SPIN_US"), Error);
  EXPECT_THROW(environmentValue("HORA_NO_SUCH_VARIABLE"), Error);
  EXPECT_NO_THROW(environmentValue("HORA_TEST_AT"));
  EXPECT_NO_THROW(environmentValue("HORA_AGENT_STORE"));
  EXPECT_NO_THROW(environmentValue("UCX_TLS"));
  EXPECT_EQ(environmentValue("HORA_TEST_SURELY_UNSET_VARIABLE"), nullptr);
}

TEST(Knobs, ParseBytes) {
  int64_t b = 0;
  EXPECT_TRUE(parseBytes("4096", &b));
  EXPECT_EQ(b, 4096);
  EXPECT_TRUE(parseBytes("64MiB", &b));
  EXPECT_EQ(b, 64 << 20);
  EXPECT_TRUE(parseBytes("2k", &b));
  EXPECT_EQ(b, 2048);
  EXPECT_TRUE(parseBytes("1G", &b));
  EXPECT_EQ(b, int64_t{1} << 30);
  EXPECT_FALSE(parseBytes("", &b));
  EXPECT_FALSE(parseBytes("-1", &b));
  EXPECT_FALSE(parseBytes("12 apples", &b));
  EXPECT_FALSE(parseBytes("1T", &b));
}

TEST(Knobs, BadValuesNameTheKnobAndTheValue) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"HORA_FUSION_THRESHOLD", "lots"}, {"HORA_CYCLE_TIME_MS", "-1"},
      {"HORA_CACHE_CAPACITY", "1.5"},    {"HORA_LOG_LEVEL", "loud"},
      {"HORA_BOOTSTRAP", "magic"},       {"HORA_TIMEOUT_S", "0"},
      {"HORA_CPU_BACKEND", "UCX"},       {"HORA_CYCLE_TIME_MS", "nan"},
      {"HORA_CPU_BACKEND", "g loo"},     {"HORA_CPU_BACKEND", ""},
      {"HORA_THREAD_AFFINITY", "on"},    {"HORA_THREAD_AFFINITY", "0,,1"},
      {"HORA_THREAD_AFFINITY", "1,"},    {"HORA_THREAD_AFFINITY", "-1"},
      {"HORA_THREAD_AFFINITY", ""},      {"HORA_SHM", "staged"},
      {"HORA_CALLER_CYCLES", "on"},      {"HORA_HIER_OWNERS", "two"},
      {"HORA_HIER_OWNERS", "0"},         {"HORA_HIER_OWNERS", "2x"},
      {"HORA_HIER_OWNERS", "1.5"},       {"HORA_UCX_SMALL_KB", "64k"},
      {"HORA_UCX_DIRECT_KB", "-1"},      {"HORA_UCX_CHUNK_KB", "0"},
      {"HORA_UCX_SPIN_US", "soon"}};
  for (const auto &kv : bad) {
    try {
      fromMap({{kv.first, kv.second}});
      ADD_FAILURE() << kv.first << "=" << kv.second << " was accepted";
    } catch (const Error &e) {
      EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
      EXPECT_NE(e.message().find(kv.first), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("'" + kv.second + "'"), std::string::npos) << e.message();
    }
  }
}


TEST(KnobAliases, HorovodVariablesSetTheirKnobs) {
  KnobReport r;
  Knobs k = fromMap({{"HOROVOD_FUSION_THRESHOLD", "1048576"},
                     {"HOROVOD_CYCLE_TIME", "3.5"},
                     {"HOROVOD_CACHE_CAPACITY", "0"},
                     {"HOROVOD_TIMELINE", "/tmp/tl.json"},
                     {"HOROVOD_STALL_CHECK_TIME_SECONDS", "30"},
                     {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "90"},
                     {"HOROVOD_LOG_LEVEL", "DEBUG"}},
                    &r);
  EXPECT_EQ(k.fusionThreshold, 1 << 20);
  EXPECT_DOUBLE_EQ(k.cycleTimeMs, 3.5);  // Horovod's unit is hora's: milliseconds
  EXPECT_EQ(k.cacheCapacity, 0);
  EXPECT_EQ(k.timeline, "/tmp/tl.json");
  EXPECT_DOUBLE_EQ(k.stallWarningS, 30);
  EXPECT_DOUBLE_EQ(k.stallShutdownS, 90);
  EXPECT_EQ(k.logLevel, LogLevel::kDebug);
  EXPECT_EQ(r.origin["HORA_FUSION_THRESHOLD"], "HOROVOD_FUSION_THRESHOLD");
  EXPECT_EQ(r.origin["HORA_CYCLE_TIME_MS"], "HOROVOD_CYCLE_TIME");
  EXPECT_EQ(r.origin.count("HORA_TIMEOUT_S"), 0u);
  EXPECT_TRUE(r.notes.empty());
}

TEST(KnobAliases, HoraWinsAndADifferentHorovodValueIsWarnedAbout) {
  KnobReport r;
  Knobs k = fromMap({{"HORA_CYCLE_TIME_MS", "2"}, {"HOROVOD_CYCLE_TIME", "5"}}, &r);
  EXPECT_DOUBLE_EQ(k.cycleTimeMs, 2);
  EXPECT_EQ(r.origin["HORA_CYCLE_TIME_MS"], "HORA_CYCLE_TIME_MS");
  ASSERT_EQ(warnings(r).size(), 1u);
  const std::string w = warnings(r)[0];
  EXPECT_NE(w.find("HORA_CYCLE_TIME_MS='2'"), std::string::npos) << w;
  EXPECT_NE(w.find("HOROVOD_CYCLE_TIME='5'"), std::string::npos) << w;
  EXPECT_NE(w.find("using HORA_CYCLE_TIME_MS"), std::string::npos) << w;

  // The same value, spelt differently, is no conflict.
  KnobReport same;
  k = fromMap({{"HORA_FUSION_THRESHOLD", "64M"}, {"HOROVOD_FUSION_THRESHOLD", "67108864"}},
              &same);
  EXPECT_EQ(k.fusionThreshold, 64 << 20);
  EXPECT_TRUE(same.notes.empty());
  KnobReport level;
  fromMap({{"HORA_LOG_LEVEL", "error"}, {"HOROVOD_LOG_LEVEL", "FATAL"}}, &level);
  EXPECT_TRUE(level.notes.empty());
}

TEST(KnobAliases, BadHorovodValuesNameTheHorovodVariable) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"HOROVOD_FUSION_THRESHOLD", "lots"},
      {"HOROVOD_CYCLE_TIME", "-1"},
      {"HOROVOD_CACHE_CAPACITY", "1.5"},
      {"HOROVOD_STALL_CHECK_TIME_SECONDS", "soon"},
      {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "-5"},
      {"HOROVOD_STALL_CHECK_DISABLE", "true"},
      {"HOROVOD_LOG_LEVEL", "loud"},
      {"HOROVOD_HIERARCHICAL_ALLREDUCE", "yes"},
      {"HOROVOD_HIERARCHICAL_ALLGATHER", "on"}};
  for (const auto &kv : bad) {
    // An error even where the HORA_* knob is set and would win: the value means nothing.
    for (bool withKnob : {false, true}) {
      std::map<std::string, std::string> env = {{kv.first, kv.second}};
      if (withKnob) env["HORA_CYCLE_TIME_MS"] = "1";
      const std::string m = errorOf(env);
      EXPECT_NE(m.find(kv.first + "='" + kv.second + "' is not valid"), std::string::npos)
          << kv.first << "=" << kv.second << ": " << m;
    }
  }
  const std::string m = errorOf({{"HOROVOD_LOG_LEVEL", "loud"}});
  EXPECT_NE(m.find("fatal"), std::string::npos) << m;
  EXPECT_NE(m.find("HORA_LOG_LEVEL"), std::string::npos) << m;
}

TEST(KnobAliases, HorovodLogLevels) {
  const std::vector<std::pair<std::string, LogLevel>> levels = {
      {"trace", LogLevel::kTrace}, {"Debug", LogLevel::kDebug},     {"INFO", LogLevel::kInfo},
      {"warning", LogLevel::kWarning}, {"error", LogLevel::kError}, {"fatal", LogLevel::kError},
      {"FATAL", LogLevel::kError}};
  for (const auto &kv : levels) {
    EXPECT_EQ(fromMap({{"HOROVOD_LOG_LEVEL", kv.first}}).logLevel, kv.second) << kv.first;
  }
  // hora's own knob does not take Horovod's fatal.
  EXPECT_NE(errorOf({{"HORA_LOG_LEVEL", "fatal"}}), "");
}

TEST(KnobAliases, StallCheckDisable) {
  Knobs k = fromMap({{"HOROVOD_STALL_CHECK_DISABLE", "1"}});
  EXPECT_DOUBLE_EQ(k.stallWarningS, 0);  // hora's 0: never warn
  EXPECT_DOUBLE_EQ(k.stallShutdownS, 0);
  // Horovod's disabled check neither warns nor shuts down, whatever its times say.
  k = fromMap({{"HOROVOD_STALL_CHECK_TIME_SECONDS", "30"},
               {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "90"},
               {"HOROVOD_STALL_CHECK_DISABLE", "1"}});
  EXPECT_DOUBLE_EQ(k.stallWarningS, 0);
  EXPECT_DOUBLE_EQ(k.stallShutdownS, 0);
  // 0 leaves the check on.
  KnobReport r;
  k = fromMap({{"HOROVOD_STALL_CHECK_DISABLE", "0"}, {"HOROVOD_STALL_CHECK_TIME_SECONDS", "30"}},
              &r);
  EXPECT_DOUBLE_EQ(k.stallWarningS, 30);
  EXPECT_EQ(r.origin["HORA_STALL_WARNING_S"], "HOROVOD_STALL_CHECK_TIME_SECONDS");
  EXPECT_EQ(r.origin.count("HORA_STALL_SHUTDOWN_S"), 0u);
  // hora's knob still wins over the switch, with a warning when they differ.
  KnobReport conflict;
  k = fromMap({{"HOROVOD_STALL_CHECK_DISABLE", "1"}, {"HORA_STALL_WARNING_S", "10"}}, &conflict);
  EXPECT_DOUBLE_EQ(k.stallWarningS, 10);
  ASSERT_EQ(warnings(conflict).size(), 1u);
  EXPECT_NE(warnings(conflict)[0].find("HOROVOD_STALL_CHECK_DISABLE='1'"), std::string::npos);
}

TEST(KnobAliases, TimelineDynamicWritesNoFile) {
  KnobReport r;
  EXPECT_EQ(fromMap({{"HOROVOD_TIMELINE", "DYNAMIC"}}, &r).timeline, "");
  EXPECT_EQ(r.origin.count("HORA_TIMELINE"), 0u);
}

TEST(KnobAliases, HorovodHierarchicalAllreduceSetsTheKnob) {
  KnobReport r;
  EXPECT_EQ(fromMap({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "1"}}, &r).hierarchical, "on");
  EXPECT_EQ(r.origin.at("HORA_HIERARCHICAL"), "HOROVOD_HIERARCHICAL_ALLREDUCE");
  EXPECT_EQ(fromMap({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "0"}}).hierarchical, "off");
  EXPECT_EQ(fromMap({}).hierarchical, "auto");
  // hora's own name wins.
  EXPECT_EQ(fromMap({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "1"}, {"HORA_HIERARCHICAL", "off"}}).hierarchical,
            "off");
}

TEST(KnobAliases, HierarchicalAllgatherIsAcceptedAndExplained) {
  KnobReport r;
  Knobs k = fromMap({{"HOROVOD_HIERARCHICAL_ALLGATHER", "1"}, {"HOROVOD_HIERARCHICAL_ALLREDUCE", "0"}}, &r);
  EXPECT_EQ(k.hierarchical, "off");
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0].first, LogLevel::kInfo);
  EXPECT_EQ(r.notes[0].second.rfind("HOROVOD_HIERARCHICAL_ALLGATHER=1 changes nothing", 0), 0u)
      << r.notes[0].second;
  EXPECT_EQ(r.notes[0].second.find('`'), std::string::npos) << r.notes[0].second;
}

TEST(KnobAliases, EveryAliasIsHorovodsAndNamesAKnob) {
  std::set<std::string> knobs;
  for (const KnobSpec &spec : knobTable()) knobs.insert(spec.name);
  for (const KnobAlias &a : knobAliases()) {
    EXPECT_EQ(std::string(a.name).rfind("HOROVOD_", 0), 0u) << a.name;
    if (a.knob != nullptr) {
      ASSERT_TRUE(knobs.count(a.knob)) << a.name << " -> " << a.knob;
      auto spec = std::find_if(knobTable().begin(), knobTable().end(),
                               [&](const KnobSpec &s) { return a.knob == std::string(s.name); });
      EXPECT_NE(knobDoc(*spec).find(std::string("`") + a.name), std::string::npos)
          << a.name << " is not in " << a.knob << "'s doc";
    } else {
      EXPECT_NE(a.translate, nullptr) << a.name;
    }
    const std::string doc = a.doc;
    EXPECT_EQ(doc.find_first_of("|\n"), std::string::npos) << a.name;
    EXPECT_EQ(std::count(doc.begin(), doc.end(), '`') % 2, 0) << a.name;
  }
}

TEST(KnobNames, ClosestKnob) {
  const std::vector<std::pair<std::string, std::string>> near = {
      {"HORA_FUSION_THRESHHOLD", "HORA_FUSION_THRESHOLD"},
      {"HORA_FUSION_TRESHOLD", "HORA_FUSION_THRESHOLD"},
      {"HORA_FUSION", "HORA_FUSION_THRESHOLD"},
      {"HORA_CYCLE_TIME", "HORA_CYCLE_TIME_MS"},
      {"HORA_CYCEL_TIME_MS", "HORA_CYCLE_TIME_MS"},
      {"HORA_LOGLEVEL", "HORA_LOG_LEVEL"},
      {"HORA_TIMEOUT", "HORA_TIMEOUT_S"},
      {"hora_cache_capacity", "HORA_CACHE_CAPACITY"},
      {"HORA_STALL_WARNING", "HORA_STALL_WARNING_S"},
      {"HORA_SHM_STREAMS", "HORA_SHM_STREAM"}};
  for (const auto &kv : near) EXPECT_EQ(closestKnob(kv.first), kv.second) << kv.first;
  for (const char *far : {"HORA_FOO", "HORA_VERBOSE", "HORA_MY_APP_SETTING", "HORA_X",
                          "HORA_DATA_DIR"}) {
    EXPECT_EQ(closestKnob(far), "") << far;
  }
}

TEST(KnobNames, UnknownHoraVariablesAreWarnedAbout) {
  KnobReport r;
  checkVariableNames({"HORA_FUSION_THRESHHOLD", "HORA_FUSION_THRESHOLD", "HORA_FOO", "PATH",
                      "HOROVOD_CYCLE_TIME", "HORA_TEST_TIME_SCALE", "HORA_SOAK_SECONDS",
                      "HORA_BUILD_JOBS", "HORAFOO"},
                     &r);
  ASSERT_EQ(warnings(r).size(), 2u);
  EXPECT_EQ(warnings(r)[0],
            "HORA_FOO is not a hora knob and is ignored (hora-info lists the knobs)");
  EXPECT_EQ(warnings(r)[1],
            "HORA_FUSION_THRESHHOLD is not a hora knob; did you mean HORA_FUSION_THRESHOLD?");
}

TEST(KnobNames, EveryOtherVariableIsKnownAndNoKnob) {
  std::set<std::string> knobs;
  for (const KnobSpec &spec : knobTable()) {
    knobs.insert(spec.name);
    EXPECT_TRUE(isKnownVariable(spec.name)) << spec.name;
  }
  for (const OtherVariable &v : otherVariables()) {
    std::string name = v.name;
    EXPECT_EQ(name.rfind("HORA_", 0), 0u) << name;
    EXPECT_FALSE(knobs.count(name)) << name << " is a knob";
    if (name.back() == '*') name.back() = 'X';
    EXPECT_TRUE(isKnownVariable(name)) << v.name;
    EXPECT_TRUE(v.readBy != nullptr && v.readBy[0] != '\0') << v.name;
  }
  EXPECT_FALSE(isKnownVariable("HORA_TEST"));
  EXPECT_FALSE(isKnownVariable("HORA_SOAK_SECONDSX"));
}

}  // namespace
}  // namespace hora
