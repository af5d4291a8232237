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

Knobs fromMap(const std::map<std::string, std::string> &env) {
  return Knobs::fromLookup([&](const char *name) -> const char * {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
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
    const std::string name = spec.name, doc = spec.doc, def = spec.defaultValue;
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
      {"HORA_CPU_BACKEND", "ucx"},       {"HORA_CYCLE_TIME_MS", "nan"},
      {"HORA_THREAD_AFFINITY", "on"},    {"HORA_THREAD_AFFINITY", "0,,1"},
      {"HORA_THREAD_AFFINITY", "1,"},    {"HORA_THREAD_AFFINITY", "-1"},
      {"HORA_THREAD_AFFINITY", ""},      {"HORA_SHM", "staged"},
      {"HORA_CALLER_CYCLES", "on"}};
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

}  // namespace
}  // namespace hora
