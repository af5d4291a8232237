// SPDX-License-Identifier: Apache-2.0
// The knob table. Adding a knob means adding one row here (and its Knobs field), then
// tools/update_knob_docs.sh; nothing else reads the environment for HORA_* settings. Below it:
// Horovod's names for the knobs, and the HORA_* variables that are not knobs.
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

std::string showDouble(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

const std::vector<KnobSpec> kTable = {
    {"HORA_FUSION_THRESHOLD", "64M", "largest fused buffer, bytes (suffixes K, M, G)",
     [](const std::string &t, Knobs &k, std::string *why) {
       int64_t b;
       if (!parseBytes(t, &b)) {
         *why = "expected a byte count such as 67108864, 64M or 64MiB";
         return false;
       }
       k.fusionThreshold = b;
       return true;
     },
     [](const Knobs &k) { return std::to_string(k.fusionThreshold); }},
    {"HORA_CYCLE_TIME_MS", "0.5", "longest wait for more tensors to fuse once one is pending, ms",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseDouble(t, 0, 10000, &k.cycleTimeMs, why);
     },
     [](const Knobs &k) { return showDouble(k.cycleTimeMs); }},
    {"HORA_CACHE_CAPACITY", "1024", "response cache entries (0 disables the cache)",
     [](const std::string &t, Knobs &k, std::string *why) {
       double v;
       if (!parseDouble(t, 0, 1 << 20, &v, why) || v != std::floor(v)) {
         *why = "expected an integer in [0, 1048576]";
         return false;
       }
       k.cacheCapacity = static_cast<int64_t>(v);
       return true;
     },
     [](const Knobs &k) { return std::to_string(k.cacheCapacity); }},
    {"HORA_CPU_BACKEND", "auto",
     "CPU data plane: `auto` (ucx for worlds spanning hosts, else the launcher's: mpi under "
     "MPI, gloo otherwise) or a plane's name; `hora-info` lists this build's planes, and "
     "`hora_init` refuses a name that is not one of them",
     [](const std::string &t, Knobs &k, std::string *why) {
       // Any plain name: the planes are the backend registry's (lib/backends/registry.cpp),
       // which this layer cannot see; createCpuBackend refuses a name it does not have.
       if (!isPlainName(t)) {
         *why = "expected auto or a plane's name (lowercase letters, digits, _)";
         return false;
       }
       k.cpuBackend = t;
       return true;
     },
     [](const Knobs &k) { return k.cpuBackend; }},
    {"HORA_UCX_DIRECT_KB", "16",
     "UCX plane: an allreduce whose (ranks - 1) x bytes are at most this many KiB goes straight "
     "to every rank (docs/ucx.md)",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseWhole(t, 0, 1 << 20, &k.ucxDirectKiB, why);
     },
     [](const Knobs &k) { return std::to_string(k.ucxDirectKiB); }},
    {"HORA_UCX_SMALL_KB", "64",
     "UCX plane: largest allreduce, KiB, that runs as recursive doubling (and, across hosts, "
     "through one rank per host); larger ones run as a ring",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseWhole(t, 0, 1 << 20, &k.ucxSmallKiB, why);
     },
     [](const Knobs &k) { return std::to_string(k.ucxSmallKiB); }},
    {"HORA_UCX_CHUNK_KB", "256",
     "UCX plane: the ring's and the broadcast chain's pipeline chunk, KiB",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseWhole(t, 1, 1 << 20, &k.ucxChunkKiB, why);
     },
     [](const Knobs &k) { return std::to_string(k.ucxChunkKiB); }},
    {"HORA_ALGORITHM", "",
     "Gloo and UCX planes: force algorithms, `COLLECTIVE=NAME,...` (e.g. `allreduce=ring`); "
     "a forced one runs wherever it can, else the table's size rule picks. `hora-info` lists "
     "the tables (allreduce, reducescatter, broadcast, allgatherv, alltoallv)",
     [](const std::string &t, Knobs &k, std::string *why) {
       for (size_t at = 0; at <= t.size();) {
         size_t end = t.find(',', at);
         if (end == std::string::npos) end = t.size();
         const std::string item = t.substr(at, end - at);
         if (!item.empty() && (item.find('=') == std::string::npos || item.front() == '=' ||
                               item.back() == '=')) {
           *why = "expected COLLECTIVE=NAME[,COLLECTIVE=NAME...], e.g. allreduce=ring";
           return false;
         }
         at = end + 1;
       }
       k.algorithm = t;
       return true;
     },
     [](const Knobs &k) { return k.algorithm; }},
    {"HORA_UCX_SPIN_US", "50",
     "UCX plane: how long a rank waiting in a collective polls, microseconds, before it sleeps "
     "until UCX wakes it (0: sleeps at once)",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseDouble(t, 0, 1e6, &k.ucxSpinUs, why);
     },
     [](const Knobs &k) { return showDouble(k.ucxSpinUs); }},
    {"HORA_SHM", "auto",
     "intra-host allreduce through shared memory when every rank of a set is on one host: "
     "`auto` stages it through a shared segment; `cma` reads large tensors straight from the "
     "peers' memory (`process_vm_readv`); `off` leaves allreduce to MPI or Gloo",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseChoice(t, {"auto", "cma", "off"}, &k.shm, why);
     },
     [](const Knobs &k) { return k.shm; }},
    {"HORA_SHM_STREAM", "auto",
     "how the shared-memory allreduce writes its segment: `auto` uses non-temporal stores "
     "(through memory) while a cache-line probe finds that the ranks' cores share no cache "
     "(e.g. vCPUs on different CCDs or sockets), cached stores otherwise; `on`, `off`",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseChoice(t, {"auto", "on", "off"}, &k.shmStream, why);
     },
     [](const Knobs &k) { return k.shmStream; }},
    {"HORA_HIERARCHICAL", "auto",
     "allreduce of a set whose ranks span hosts, where a host holds several: `on` reduces "
     "inside each host through shared memory, then across hosts one share per rank (the "
     "fewest ranks any host holds carry the shares), then shares the result inside each host "
     "(allgather and broadcast likewise cross each host's link once); `auto` does so from the "
     "size where a cost model measured on the set as it forms says it pays, and leaves smaller "
     "ones to the set's plane; `off`: one collective of the plane over every rank",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseChoice(t, {"auto", "on", "off"}, &k.hierarchical, why);
     },
     [](const Knobs &k) { return k.hierarchical; }},
    {"HORA_HIER_OWNERS", "auto",
     "ranks per host that carry the shares of a hierarchical allreduce across hosts: `auto` is "
     "the fewest ranks any host of the set holds, a number narrows it to at most that many; `1` "
     "is Horovod's hierarchical allreduce (docs/hierarchical.md)",
     [](const std::string &t, Knobs &k, std::string *why) {
       if (t == "auto") {
         k.hierOwners = 0;
         return true;
       }
       if (!parseWhole(t, 1, 1 << 16, &k.hierOwners, why)) {
         *why = "expected auto or an integer in [1, 65536]";
         return false;
       }
       return true;
     },
     [](const Knobs &k) {
       return k.hierOwners == 0 ? std::string("auto") : std::to_string(k.hierOwners);
     }},
    {"HORA_CALLER_CYCLES", "auto",
     "`auto`: a thread in `hora_wait` runs its set's cycles itself while the set's engine "
     "thread is idle (sets on one host, CPU tensors), sparing two thread hand-offs; `off`: the "
     "engine thread runs every cycle",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseChoice(t, {"auto", "off"}, &k.callerCycles, why);
     },
     [](const Knobs &k) { return k.callerCycles; }},
    {"HORA_THREAD_AFFINITY", "auto",
     "CPU of each rank's engine threads: `auto` spreads the local ranks over the CPUs when the "
     "launcher did not bind them (and there are at least 2 local ranks and as many CPUs), "
     "`off`, or one CPU per local rank such as `0,8`",
     [](const std::string &t, Knobs &k, std::string *why) {
       if (t == "auto" || t == "off") {
         k.threadAffinity = t;
         return true;
       }
       if (!isCpuList(t)) {
         *why = "expected auto, off, or CPU numbers joined by commas such as 0,1";
         return false;
       }
       k.threadAffinity = t;
       return true;
     },
     [](const Knobs &k) { return k.threadAffinity; }},
    {"HORA_TIMELINE", "",
     "path of a Chrome-trace JSON timeline, one file per rank (`trace.json` becomes "
     "`trace.rank<R>.json`, or put `{rank}` in the path)",
     [](const std::string &t, Knobs &k, std::string *) {
       k.timeline = t;
       return true;
     },
     [](const Knobs &k) { return k.timeline; }},
    {"HORA_FLIGHT_RECORDER", "/tmp/hora-flight.{rank}.json",
     "where each rank writes its last operations on a timeout, a lost peer, a backend error, "
     "SIGUSR1 or SIGTERM (`{rank}`: the rank; `{job}`: the job id, put before `{rank}` if absent, "
     "so jobs never share files; `off`: record nothing); `hora-flight-check` compares the files "
     "of a job",
     [](const std::string &t, Knobs &k, std::string *why) {
       if (t.empty()) {
         *why = "expected a path, or off";
         return false;
       }
       k.flightRecorder = t == "off" ? "" : t;
       return true;
     },
     [](const Knobs &k) { return k.flightRecorder.empty() ? std::string("off") : k.flightRecorder; }},
    {"HORA_FLIGHT_RECORDER_OPS", "1024", "operations the flight recorder keeps per rank",
     [](const std::string &t, Knobs &k, std::string *why) {
       double v;
       if (!parseDouble(t, 1, 1 << 24, &v, why) || v != std::floor(v)) {
         *why = "expected an integer in [1, 16777216]";
         return false;
       }
       k.flightRecorderOps = static_cast<int64_t>(v);
       return true;
     },
     [](const Knobs &k) { return std::to_string(k.flightRecorderOps); }},
    {"HORA_FLIGHT_RECORDER_KEEP", "8",
     "flight recorder files of at most this many jobs stay in its directory: writing one removes "
     "those of older jobs (by their newest file), so failed jobs do not pile up (0: keep all)",
     [](const std::string &t, Knobs &k, std::string *why) {
       double v;
       if (!parseDouble(t, 0, 1e6, &v, why) || v != std::floor(v)) {
         *why = "expected an integer in [0, 1000000]";
         return false;
       }
       k.flightRecorderKeep = static_cast<int64_t>(v);
       return true;
     },
     [](const Knobs &k) { return std::to_string(k.flightRecorderKeep); }},
    {"HORA_STALL_WARNING_S", "60",
     "report a name that some ranks have submitted and others have not after this long, and "
     "again at this interval, seconds (0: never)",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseDouble(t, 0, 1e9, &k.stallWarningS, why);
     },
     [](const Knobs &k) { return showDouble(k.stallWarningS); }},
    {"HORA_STALL_SHUTDOWN_S", "0",
     "fail such a name with `HORA_ERR_TIMEOUT` on the ranks that submitted it after this long, "
     "seconds (0: off)",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseDouble(t, 0, 1e9, &k.stallShutdownS, why);
     },
     [](const Knobs &k) { return showDouble(k.stallShutdownS); }},
    {"HORA_TIMEOUT_S", "300",
     "longest wait for peers, seconds: in negotiation, the env:// rendezvous and the data "
     "planes; a collective that waits longer, or a lost peer, fails with `HORA_ERR_TIMEOUT` or "
     "`HORA_ERR_PEER_LOST`",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseDouble(t, 0.001, 1e9, &k.timeoutS, why);
     },
     [](const Knobs &k) { return showDouble(k.timeoutS); }},
    {"HORA_NCCL_INIT_TIMEOUT_S", "120",
     "longest wait for an NCCL communicator to form, seconds (at most `HORA_TIMEOUT_S`): a "
     "rank that never joins fails the others' first CUDA op of the set with `HORA_ERR_TIMEOUT`",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseDouble(t, 0.001, 1e9, &k.ncclInitTimeoutS, why);
     },
     [](const Knobs &k) { return showDouble(k.ncclInitTimeoutS); }},
    {"HORA_CUDA_DIRECT_BYTES", "1M",
     "fused CUDA allreduce: tensors of at least this many bytes go to NCCL where they lie, in the "
     "same NCCL group as the smaller ones, which are packed (zero-copy fusion); 0 packs every "
     "tensor (suffixes K, M, G)",
     [](const std::string &t, Knobs &k, std::string *why) {
       int64_t b;
       if (!parseBytes(t, &b)) {
         *why = "expected a byte count such as 1048576, 1M or 0";
         return false;
       }
       k.cudaDirectBytes = b;
       return true;
     },
     [](const Knobs &k) { return std::to_string(k.cudaDirectBytes); }},
    {"HORA_LOG_LEVEL", "warning", "`trace`, `debug`, `info`, `warning` or `error` (any case)",
     [](const std::string &t, Knobs &k, std::string *why) {
       if (parseLogLevel(t, &k.logLevel)) return true;
       *why = "expected one of trace, debug, info, warning, error";
       return false;
     },
     [](const Knobs &k) { return std::string(logLevelName(k.logLevel)); }},
    {"HORA_BOOTSTRAP", "auto",
     "how the world forms: `auto`, `mpi`, `env` (torchrun's MASTER_ADDR, RANK, WORLD_SIZE "
     "variables) or `single` (a world of one)",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseChoice(t, {"auto", "mpi", "env", "single"}, &k.bootstrap, why);
     },
     [](const Knobs &k) { return k.bootstrap; }},
    {"HORA_JOB_TOKEN", "",
     "shared secret of an env:// job, the same on every rank: each connection to rank 0's store "
     "and each Gloo pair must prove it knows it (HMAC-SHA256 challenge-response both ways) or is "
     "closed; unset, the store trusts whoever reaches its port. `horarun` sets a fresh one for "
     "every single-machine job. See docs/security.md",
     [](const std::string &t, Knobs &k, std::string *) {
       k.jobToken = t;
       return true;
     },
     // Never printed: hora-info output ends up in logs and bug reports.
     [](const Knobs &k) { return k.jobToken.empty() ? std::string() : std::string("(set)"); }},
    {"HORA_STORE_BIND", "",
     "address rank 0's env:// store listens on: unset, the address `MASTER_ADDR` names when it "
     "is one of this host's (every interface when it is not, e.g. behind NAT); `0.0.0.0`, `::` "
     "or `*` (every interface) or one local address",
     [](const std::string &t, Knobs &k, std::string *why) {
       if (t.find_first_of(" \t\n") != std::string::npos) {  // "": the default
         *why = "expected an address such as 0.0.0.0, ::, 10.0.0.1 or *";
         return false;
       }
       k.storeBind = t;
       return true;
     },
     [](const Knobs &k) { return k.storeBind; }},
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
